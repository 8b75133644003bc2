"""Numbers as the pages show them: `{{ ratio|percent }}`, `{{ ms|duration_ms }}`,
`{{ rps|per_second }}`; None (nothing measured) is an en dash everywhere."""

from __future__ import annotations

import math
from typing import Any

from django import template

register = template.Library()
NONE = "–"


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


@register.filter
def percent(value: Any) -> str:
    """A ratio in [0, 1] as a percentage: 0.0123 -> "1.23%", 0 -> "0%"."""
    number = _number(value)
    if number is None:
        return NONE
    shown = number * 100
    if shown == 0:
        return "0%"
    if abs(shown) < 0.01:
        return "<0.01%"
    return f"{shown:.3g}%" if abs(shown) < 100 else f"{shown:.0f}%"


@register.filter
def duration_ms(value: Any) -> str:
    """Milliseconds: "850 ms", "1.2 s", "> 60 s" (a histogram's open bucket is infinite)."""
    number = _number(value)
    if number is None:
        return NONE
    if math.isinf(number):
        return "> max"
    if number < 1000:
        return f"{number:.3g} ms"
    return f"{number / 1000:.3g} s"


@register.filter
def per_second(value: Any) -> str:
    """A rate: "12.5/s", "0.02/s"."""
    number = _number(value)
    if number is None:
        return NONE
    return f"{number:.3g}/s"
