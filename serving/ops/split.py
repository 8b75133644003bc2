"""Split consistency of one deployment: did each client (by its client key's salted hash, as the
router replicas publish it under `<prefix>:router:<app>`, serving.dataplane.sticky) always see
the same group since the split last changed, and does the observed split match the configured
one. Reads only; None where Redis does not answer."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django.conf import settings

from serving.deployments.models import Deployment
from serving.deployments.recovery import hash_values, published_app, redis_client

SHOWN_CLIENTS = 50


def _routers(app: str) -> list[dict[str, Any]] | None:
    import redis

    try:
        return hash_values(redis_client(), f"{settings.SLI_KEY_PREFIX}:router:{app}")
    except redis.RedisError:
        return None


def _share(part: int, whole: int) -> float | None:
    return round(100.0 * part / whole, 1) if whole else None


def summarize(snapshots: Iterable[Mapping[str, Any]], percent: float) -> dict[str, Any]:
    """The router replicas' `split` records for the split in force (`percent`), merged: a
    replica still on another percent (mid-reconfigure) is counted as stale, not merged."""
    current, stale = [], 0
    for snapshot in snapshots:
        split = snapshot.get("split")
        if not isinstance(split, Mapping):
            continue
        if abs(float(split.get("percent") or 0) - percent) > 1e-9:
            stale += 1
            continue
        current.append(split)
    clients: dict[str, dict[str, Any]] = {}
    totals = {"keyed": {"stable": 0, "canary": 0}, "keyless": {"stable": 0, "canary": 0}}
    for split in current:
        for kind, counts in totals.items():
            for side in counts:
                counts[side] += int((split.get(kind) or {}).get(side) or 0)
        for row in split.get("clients") or []:
            merged = clients.setdefault(
                str(row["id"]),
                {
                    "id": str(row["id"])[:16],
                    "bucket": int(row.get("bucket") or 0),
                    "expected": row.get("expected"),
                    "stable": 0,
                    "canary": 0,
                    "last": 0.0,
                },
            )
            merged["stable"] += int(row.get("stable") or 0)
            merged["canary"] += int(row.get("canary") or 0)
            merged["last"] = max(merged["last"], float(row.get("last") or 0))
    rows = sorted(clients.values(), key=lambda r: -r["last"])
    for row in rows:
        row["flipped"] = bool(row["stable"] and row["canary"])
        seen = "canary" if row["canary"] else "stable"
        row["off_expected"] = bool(row["expected"]) and (row["flipped"] or seen != row["expected"])
    flipped = [r for r in rows if r["flipped"]]
    on_canary = sum(1 for r in rows if r["canary"] and not r["stable"])
    requests = {s: totals["keyed"][s] + totals["keyless"][s] for s in ("stable", "canary")}
    return {
        "reporting": len(current),
        "stale": stale,
        "sticky": any(bool(s.get("sticky")) for s in current),
        "header": next((str(s.get("header")) for s in current if s.get("header")), ""),
        "since": min((float(s.get("since") or 0) for s in current), default=None),
        "percent": percent,
        "clients": len(rows),
        "consistent": len(rows) - len(flipped),
        "consistency_pct": _share(len(rows) - len(flipped), len(rows)),
        "clients_canary_pct": _share(on_canary, len(rows)),
        "requests": requests,
        "requests_canary_pct": _share(requests["canary"], sum(requests.values())),
        "keyless": totals["keyless"],
        "flipped": flipped[:SHOWN_CLIENTS],
        "flipped_total": len(flipped),
        "rows": (flipped + [r for r in rows if not r["flipped"]])[:SHOWN_CLIENTS],
        "forgotten": sum(int(s.get("forgotten") or 0) for s in current),
    }


def split_consistency(*, deployment: Deployment) -> dict[str, Any] | None:
    """The panel's numbers for `deployment`'s current split; None when Redis is down."""
    published = published_app(deployment)
    if published is None:
        return None
    revision, app = published
    routers = _routers(app)
    if routers is None:
        return None
    percent = float(revision.canary_percent) if revision.canary_version_id else 0.0
    summary = summarize(routers, percent)
    summary["configured"] = revision.traffic or {}
    return summary
