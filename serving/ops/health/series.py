"""Where the signal SLIs' per-slot series lives in Redis, and what the tick caches of it.

The tick's per-slot signal state (`<prefix>:health:signals`, field `<deployment>:<group>`) is
small: the open point's accumulators, the replicas' and routers' baselines, and the windowed
values computed when the last point was added. Its value is `"<next>:<count> <json>"`: `next`
is the tick time from which the open point may close, `count` the points its windows need.
The points themselves are a capped list per slot (`<prefix>:health:signals:<slot>`, newest
first, LPUSH + LTRIM, with a TTL), read (by READ_SCRIPT, inside the tick's one pipelined
read) only for the slots whose `next` has come, and written only when a point is added (at
most every POINT_S seconds): between points a tick moves a few hundred bytes per slot, not
the series.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from serving.slo.signals import (
    ERROR_REASONS,
    POINT_S,
    SERIES_S,
    SIGNAL_SLIS,
    points_value,
    value_key,
    within,
)

MAX_POINTS = int(SERIES_S / POINT_S) + 8  # the list's cap: SERIES_S of points and a margin
LIST_TTL_S = int(SERIES_S * 2)  # a slot no tick measures any more leaves its series by then
SUMMARY_WINDOW_S = 300
PRUNE_EVERY_S = 60  # the signal states of slots that are no longer targets go this often

# For each field: its state (or nil), then its points when its `next` has come (else nil).
READ_SCRIPT = """
local out = {}
local now = tonumber(ARGV[1])
for i = 2, #ARGV do
  local name = ARGV[i]
  local raw = redis.call('HGET', KEYS[1], name)
  local due, count = true, -1
  if raw then
    local space = string.find(raw, ' ', 1, true)
    local head = space and string.sub(raw, 1, space - 1) or ''
    local colon = string.find(head, ':', 1, true)
    local next_at = tonumber(colon and string.sub(head, 1, colon - 1) or head)
    count = tonumber(colon and string.sub(head, colon + 1) or '') or -1
    due = next_at == nil or now >= next_at
  end
  out[#out + 1] = raw or false
  if due then
    out[#out + 1] = redis.call('LRANGE', KEYS[1] .. ':' .. name, 0, count > 0 and count - 1 or -1)
  else
    out[#out + 1] = false
  end
end
return out
"""


def series_key(signals_key: str, name: str) -> str:
    return f"{signals_key}:{name}"


def queue_read(pipe: Any, signals_key: str, now: float, names: Sequence[str]) -> None:
    pipe.eval(READ_SCRIPT, 1, signals_key, repr(float(now)), *names)


def parse_read(
    result: Sequence[Any] | None, names: Sequence[str]
) -> dict[str, tuple[dict[str, Any] | None, list[dict[str, Any]] | None]]:
    """name -> (its state, its points oldest first, or None when they were not read)."""
    result = list(result or [])
    out: dict[str, tuple[dict[str, Any] | None, list[dict[str, Any]] | None]] = {}
    for index, name in enumerate(names):
        raw, points = result[2 * index : 2 * index + 2] or (None, None)
        series = None
        if points is not None:
            series = [
                point
                for point in _decode_points(list(reversed(points)))
                if isinstance(point, dict) and isinstance(point.get("t"), int | float)
            ]
        out[name] = (decode_state(raw), series)
    return out


def _decode_points(items: list[Any]) -> list[Any]:
    """The points of one slot: one json.loads over them all (half the time of one a point);
    one at a time, dropping what does not parse, only when that fails."""
    raw = [item if isinstance(item, bytes) else str(item).encode() for item in items]
    try:
        decoded = json.loads(b"[" + b",".join(raw) + b"]")
        if isinstance(decoded, list) and len(decoded) == len(raw):
            return decoded
    except ValueError:
        pass
    kept = []
    for item in raw:
        try:
            kept.append(json.loads(item))
        except ValueError:
            continue
    return kept


def decode_state(raw: Any) -> dict[str, Any] | None:
    if not raw:
        return None
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    try:
        state = json.loads(text.split(" ", 1)[1] if " " in text else text)
    except ValueError:
        return None
    return state if isinstance(state, dict) else None


def encode_state(state: Mapping[str, Any], next_at: float, count: int = 0) -> str:
    """`count`: the newest points the next read needs (0: all of them)."""
    head = f"{math.floor(next_at * 1000) / 1000!r}:{int(count)}"  # never later than due
    return f"{head} {json.dumps(state, separators=(',', ':'))}"


def points_needed(objectives: Iterable[tuple[str, int | None, str | None]]) -> int:
    """The newest points that cover the summary's and the objectives' longest window."""
    longest = max([SUMMARY_WINDOW_S, *(int(w or 300) for _, w, _ in objectives)])
    return min(MAX_POINTS, int(longest / POINT_S) + 4)


def queue_write(
    pipe: Any,
    keys: Mapping[str, str],
    states: Mapping[str, str],
    points: Mapping[str, str],
    deployment_ids: Any = None,
    claim_prefix: str | None = None,
) -> None:
    """The tick's signal writes; last, on a full tick (every target of its shard), the claim
    of this minute's pruning (its reply says whether this tick prunes: `prune`); each shard
    claims under its own prefix (`claim_prefix`, its lease's key)."""
    signals_key = keys["signals"]
    if states:
        pipe.hset(signals_key, mapping=dict(states))
    for name, point in points.items():
        key = series_key(signals_key, name)
        pipe.lpush(key, point)
        pipe.ltrim(key, 0, MAX_POINTS - 1)
        pipe.expire(key, LIST_TTL_S)
    if deployment_ids is None:
        prefix = claim_prefix or keys["lock"]
        pipe.set(f"{prefix}:signals-pruned", 1, nx=True, ex=PRUNE_EVERY_S)


def _in_shard(name: str, shard: tuple[int, int]) -> bool:
    """Whether slot `<deployment>:<group>` is shard `(k, n)`'s (a malformed one: the first's)."""
    k, n = shard
    if n <= 1:
        return True
    head = name.split(":", 1)[0]
    return int(head) % n == k if head.isdigit() else k == 0


def wanted(contract: Any) -> list[tuple[str, int | None, str | None]]:
    """The windowed signal SLIs a contract's objectives read: (sli, window, reason)."""
    if contract is None:
        return []
    return sorted(
        {
            (o.sli, o.window, o.reason)
            for o in contract.objectives
            if o.sli in SIGNAL_SLIS and SIGNAL_SLIS[o.sli][2]
        },
        key=str,
    )


def computed(
    series: Sequence[Mapping[str, Any]],
    now: float,
    objectives: Iterable[tuple[str, int | None, str | None]],
) -> dict[str, Any]:
    """What the tick caches when a point is added: each objective's value and why, and the
    page's summary values over SUMMARY_WINDOW_S."""
    cuts: dict[float, list[Any]] = {}  # each window's points, cut once

    def cut(window: float) -> list[Any]:
        if window not in cuts:
            cuts[window] = within(series, now, window)
        return cuts[window]

    values = {
        value_key(sli, window, reason): list(points_value(sli, cut(float(window or 300)), reason))
        for sli, window, reason in objectives
    }
    recent = cut(float(SUMMARY_WINDOW_S))
    shown: dict[str, Any] = {}
    for sli, (_, _, windowed) in SIGNAL_SLIS.items():
        if windowed and sli != "errors_by_reason":
            shown[sli] = points_value(sli, recent)[0]
    shown["errors_by_reason"] = {
        reason: points_value("errors_by_reason", recent, reason)[0] for reason in ERROR_REASONS
    }
    return {"at": now, "values": values, "summary": shown, "points": len(series)}


def prune(r: Any, signals_key: str, keep: set[str], shard: tuple[int, int] = (0, 1)) -> int:
    """Drop the signal states (and series) of the shard's slots that are no longer targets
    (deleted deployments, departed canaries); the tick that claimed this minute's pruning
    calls it: two more round trips once a minute."""
    gone = [
        f
        for f in (n.decode() for n in r.hkeys(signals_key))
        if f not in keep and _in_shard(f, shard)
    ]
    if gone:
        with r.pipeline(transaction=False) as pipe:
            pipe.hdel(signals_key, *gone)
            pipe.delete(*(series_key(signals_key, f) for f in gone))
            pipe.execute()
    return len(gone)
