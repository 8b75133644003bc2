"""Traffic split between the stable and canary versions, the sticky `X-AB-Group` header and
W3C trace context (`traceparent`) carried through the data plane."""

from __future__ import annotations

import random
import re
import secrets
from dataclasses import dataclass

GROUPS = ("stable", "canary")
AB_HEADER = "x-ab-group"
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


@dataclass(frozen=True)
class TraceContext:
    trace_id: str
    span_id: str
    flags: str = "01"

    @property
    def header(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{self.flags}"

    def child(self) -> TraceContext:
        """The same trace, a new span for the next hop."""
        return TraceContext(self.trace_id, secrets.token_hex(8), self.flags)


def parse_traceparent(value: str | None) -> TraceContext | None:
    match = _TRACEPARENT.match((value or "").strip().lower())
    if match is None:
        return None
    version, trace_id, span_id, flags = match.groups()
    if version == "ff" or trace_id == "0" * 32 or span_id == "0" * 16:
        return None
    return TraceContext(trace_id, span_id, flags)


def continue_trace(value: str | None) -> TraceContext:
    """Continue the caller's trace with a new span, or start one."""
    parent = parse_traceparent(value)
    if parent is not None:
        return parent.child()
    return TraceContext(secrets.token_hex(16), secrets.token_hex(8))


def choose_group(
    canary_percent: float,
    requested: str | None,
    *,
    has_canary: bool,
    rng: random.Random | None = None,
) -> str:
    """`stable` or `canary`. A valid `X-AB-Group` from the client is kept (sticky sessions
    stay on their version); otherwise the weight decides."""
    if not has_canary:
        return "stable"
    wanted = (requested or "").strip().lower()
    if wanted in GROUPS:
        return wanted
    draw = (rng or random).random() * 100.0
    return "canary" if draw < canary_percent else "stable"
