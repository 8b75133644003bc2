"""The signal SLIs panel of the health page (serving.slo.signals): each signal over the last
5 minutes beside the seed's threshold where it gives one, errors by reason, the replicas with
their weights (one left on other weights is flagged), and observability coverage."""

from __future__ import annotations

from typing import Any

from serving.slo.signals import FRACTION_SLIS, SEED_THRESHOLDS, SIGNAL_SLIS


def _text(value: Any, unit: str, fraction: bool) -> str:
    if value is None:
        return "–"
    if fraction:
        return f"{float(value):.1%}"
    return f"{float(value):.3g}{' ' + unit if unit else ''}"


def signals_view(found: dict[str, Any] | None) -> dict[str, Any] | None:
    """The panel's rows for one slot; None when the tick has measured nothing yet."""
    if not found:
        return None
    values = found.get("values") or {}
    rows = []
    for name, (_, unit, _) in SIGNAL_SLIS.items():
        if name == "errors_by_reason":
            continue
        value = values.get(name)
        seed = SEED_THRESHOLDS.get(name)
        fraction = name in FRACTION_SLIS  # the value and its seed threshold in one form
        rows.append(
            {
                "name": name,
                "value": value,
                "text": _text(value, unit, fraction),
                "seed": None if seed is None else _text(seed, unit, fraction),
                "over_seed": seed is not None and value is not None and float(value) >= seed,
            }
        )
    reasons = [
        {"reason": reason, "text": _text(ratio, "", True), "hot": bool(ratio)}
        for reason, ratio in (values.get("errors_by_reason") or {}).items()
    ]
    divergence = found.get("divergence") or {}
    off = set(divergence.get("off") or [])
    replicas = [
        {
            **row,
            "off": row.get("replica") in off,
            "fingerprint_short": str(row.get("fingerprint") or "")[:12],
            "kv_text": _text(row.get("kv_use"), "", True),
            "errors_text": _text(row.get("error_ratio"), "", True),
        }
        for row in found.get("replicas") or []
    ]
    cover = found.get("coverage") or {}
    return {
        "window_s": found.get("window_s"),
        "rows": rows,
        "reasons": reasons,
        "divergence": divergence,
        "replicas": replicas,
        "coverage": cover,
        "coverage_text": _text(cover.get("value"), "", True),
    }
