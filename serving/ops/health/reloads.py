"""Failed hot reloads alert (seed 000 §1: a reload that overruns its deadline fails cleanly and
alerts). Each tick reads the failures the version replicas of the due deployments publish
(`kv.standby.failures`, serving.dataplane.standby: the last few, each with its time) and tells
the listeners (incidents) of each; the listener records each failure exactly once, whatever the
number of ticks that see it. A Redis memo spares the listener's check at later ticks."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from portal.exceptions import PortalError
from serving.ops import events
from serving.ops.health.state import published_snapshots, slot_hashes
from serving.ops.health.targets import Target
from serving.ops.sli_store import as_datetime

logger = logging.getLogger(__name__)

TOLD_TTL_S = 7 * 86400  # a replica publishes its last failures while it lives


def _slots(target: Target) -> list[str]:
    tiers = target.revision.tiers or {}
    return ["stable", "canary", *(str(lv["name"]) for lv in tiers.get("levels") or [])]


def failed_reloads(
    r: Any,
    keys: dict[str, str],
    targets: Sequence[Target],
    now: float,
    published: Mapping[tuple[str, str], Any] | None = None,
) -> list[events.ReloadFailed]:
    """The failed reloads the targets' replicas publish now, one event per failure. The slots'
    hashes the tick already read (`published`, by (app, slot), raw or decoded) are not read
    again."""
    asked = [(t, slot) for t in targets for slot in _slots(t)]
    if not asked:
        return []
    read = slot_hashes(r, keys, published, [(t.app, slot) for t, slot in asked])
    found: dict[str, events.ReloadFailed] = {}
    for target, slot in asked:
        for snapshot in published_snapshots(read[(target.app, slot)], b'"failures"'):
            try:
                standby = (snapshot.get("kv") or {}).get("standby") or {}
                failures = list(standby.get("failures") or [])
            except (AttributeError, TypeError):
                continue
            for failure in failures:
                if not isinstance(failure, dict) or not isinstance(failure.get("at"), int | float):
                    continue
                event = events.ReloadFailed(
                    deployment=target.deployment,
                    slot=slot,
                    replica=str(snapshot.get("replica") or "?"),
                    failure=failure,
                    detected_at=as_datetime(now),
                )
                found.setdefault(f"{target.deployment.pk}:{event.key}", event)
    return list(found.values())


def alert_failed_reloads(
    r: Any,
    keys: dict[str, str],
    targets: Sequence[Target],
    now: float,
    published: Mapping[tuple[str, str], Any] | None = None,
) -> list[dict[str, Any]]:
    """Tell the listeners of each failed reload not told before; what was alerted now."""
    done: list[dict[str, Any]] = []
    for event in failed_reloads(r, keys, targets, now, published):
        memo = f"{keys['lock']}:reload-told:{event.deployment.pk}:{event.key}"
        if r.exists(memo):
            continue
        try:
            alerted = events.reload_failed(event)
        except PortalError as exc:
            logger.warning("failed reload on %s not alerted: %s", event.deployment.pk, exc.message)
            continue
        r.set(memo, 1, ex=TOLD_TTL_S)
        if alerted:
            done.append(
                {"deployment": event.deployment.pk, "slot": event.slot, "reload_failed": event.key}
            )
    return done
