"""A slot's replicas in one health tick: what each counted since the tick's last read (its
cumulative totals less its baseline), which stopped on purpose (a goodbye, with its last
totals: `serving.dataplane.sli.mark_stopped`), and which were lost (silent without one, the
`replica_restarts` signal), each counted once; and the baselines the tick keeps for the next."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from serving.dataplane.sli import STOPPED_TTL_S
from serving.ops.health.targets import FORGET_S, LOST_AFTER_S, STALE_S
from serving.ops.sli_store import counts_of_totals, replica_delta
from serving.slo.evaluate import Counts


@dataclass
class SlotReplicas:
    published: list[dict[str, Any]]  # the values of replicas not stopped on purpose
    fresh: list[dict[str, Any]]  # those published within STALE_S, whatever their version
    serving: list[dict[str, Any]]  # the fresh ones of the slot's version
    delta: Counts  # what the slot's version served since the last read
    baselines: dict[str, Any]  # the replicas' totals as read now (the next tick's baselines)
    gone: int  # replicas lost since the last read
    lost: list[str]  # replicas counted lost that still have a baseline
    forget: list[str]  # replicas silent for FORGET_S: their values leave the hash


def account_replicas(
    *,
    seen: Mapping[str, Any],
    published_raw: Mapping[Any, Any],
    stopped_raw: Mapping[Any, Any],
    version: str,
    fresh: bool,
    wall: float,
    now: float,
    last_at: float,
    lost: list[str] | None,
) -> SlotReplicas:
    """`seen`: the baselines of the last read; `fresh`: a new episode (another version, a
    canary back), whose known replicas count only what they serve from now on."""
    values = [json.loads(v) for v in published_raw.values()]
    # A value of a stopped replica that landed after its goodbye is no replica; one published
    # later is a live one under the same id (not stopped).
    stopped = stopped_replicas(stopped_raw, values)
    values = [s for s in values if str(s.get("replica")) not in stopped]
    # A stopped replica's last value lingers in the hash while others refresh its TTL: it is
    # not counted, but its baseline stays while its value does.
    fresh_values = [
        s for s in values if wall - float(s.get("window", {}).get("end", wall)) <= STALE_S
    ]
    baselines: dict[str, Any] = {
        str(s.get("replica")): seen[str(s.get("replica"))]
        for s in values
        if s not in fresh_values and str(s.get("replica")) in seen
    }
    delta = Counts()
    for replica in fresh_values:
        totals = counts_of_totals(replica.get("totals") or {})
        before = seen.get(replica["replica"])
        if replica.get("version") != version:
            # Still the previous version's replica (going away, or mid hot-reload): its
            # counts are not this version's; keep its baseline for when it switches.
            if before is not None:
                baselines[replica["replica"]] = before
            continue
        if not (fresh and before is not None):  # a known replica joins a new episode at 0
            delta = delta + replica_delta(totals, Counts.from_dict(before) if before else None)
        baselines[replica["replica"]] = totals.to_dict()
    for name, last in stopped.items():
        before = seen.get(name)
        if before is not None and last.get("version") == version and not fresh:
            # What it served between the last read and its goodbye.
            totals = counts_of_totals(last.get("totals") or {})
            delta = delta + replica_delta(totals, Counts.from_dict(before))
    # Lost replicas count within an episode whose state is recent: a slot ticked again after a
    # long gap (a canary back after minutes) has baselines whose goodbyes have expired since.
    counting = not fresh and now - last_at < STOPPED_TTL_S - 30
    gone, still_lost, forget = lost_replicas(
        seen, baselines, stopped, values, lost, version, wall=wall, counting=counting
    )
    for name in forget:  # silent for a minute: dead; their values and baselines go
        baselines.pop(name, None)
    return SlotReplicas(
        published=values,
        fresh=fresh_values,
        serving=[r for r in fresh_values if r.get("version") == version],
        delta=delta,
        baselines=baselines,
        gone=gone,
        lost=still_lost,
        forget=forget,
    )


def lost_replicas(
    seen: Mapping[str, Any],
    now_seen: Mapping[str, Any],
    stopped: Mapping[str, Any],
    published: list[dict[str, Any]],
    counted: list[str] | None,
    version: str,
    *,
    wall: float,
    counting: bool = True,
) -> tuple[int, list[str], list[str]]:
    """Replicas of the slot that went away without Serve stopping them on purpose (a crash,
    a kill, a hung event loop, a failed health check), each counted once: one of this version
    silent for LOST_AFTER_S while a sibling keeps the hash alive, or whose value left the hash
    without a goodbye. Serve's own stops (a scale-down, a rollout's old replicas, a delete)
    said so and are not counted; nor is a silent replica of another version, nor anything
    while not `counting` (a new episode; a slot not ticked for minutes).

    Returns the count; the replicas counted that still have a baseline (the state keeps them:
    one that comes back and goes silent again, or whose value finally expires, is not counted
    again); and the replicas silent for FORGET_S, whose values and baselines the tick drops
    (a crash-looping slot beside a healthy sibling does not grow its hash and state)."""
    if not seen:
        return 0, [], []
    silent = {
        str(s.get("replica")): wall - float(s.get("window", {}).get("end", wall)) for s in published
    }
    known = set(now_seen)
    quiet = {
        str(s.get("replica"))
        for s in published
        if s.get("version") == version and silent[str(s.get("replica"))] > LOST_AFTER_S
    } & known
    vanished = set(seen) - known - set(stopped)
    already = set(counted or ()) & set(seen)
    candidates = quiet | vanished
    new = candidates - already if counting else set()
    forget = sorted(name for name in known if silent.get(name, 0.0) > FORGET_S)
    keep = sorted((already | candidates) & known - set(forget))
    return len(new), keep, forget


def stopped_replicas(
    raw: Mapping[Any, Any], published: list[dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """The slot's stopped-on-purpose entries, less those with a value published after their
    stop (a live replica under the same id)."""
    stopped = {_text(k): json.loads(v) for k, v in raw.items()}
    for snapshot in published:
        name = str(snapshot.get("replica"))
        if name in stopped:
            end = float(snapshot.get("window", {}).get("end", 0))
            if end > float(stopped[name].get("at", 0)) + 0.001:
                del stopped[name]
    return stopped


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
