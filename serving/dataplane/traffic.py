"""Traffic split between the stable and canary versions, the sticky `X-AB-Group` header, and the
trace context carried through the data plane: W3C `traceparent`, or else Zipkin's B3 (the `b3`
single header, or the `X-B3-TraceId` / `X-B3-SpanId` / `X-B3-Sampled` multi headers), continued
as the same trace and answered in both forms."""

from __future__ import annotations

import random
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

GROUPS = ("stable", "canary")
AB_HEADER = "x-ab-group"
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
# B3 (github.com/openzipkin/b3-propagation): a 64- or 128-bit trace id, a 64-bit span id, then
# optionally the sampling state (0, 1, d: debug) and the parent span id. Lower hex only.
_B3_SINGLE = re.compile(
    r"^([0-9a-f]{32}|[0-9a-f]{16})-([0-9a-f]{16})(?:-([01d])(?:-([0-9a-f]{16}))?)?$"
)
_B3_TRACE_ID = re.compile(r"^(?:[0-9a-f]{32}|[0-9a-f]{16})$")
_B3_SPAN_ID = re.compile(r"^[0-9a-f]{16}$")
_B3_SAMPLED = {"1": "01", "true": "01", "0": "00", "false": "00"}
MAX_TRACE_HEADER = 512  # longer trace headers are malformed by definition: ignored unparsed
B3_MULTI = ("x-b3-traceid", "x-b3-spanid", "x-b3-sampled")


@dataclass(frozen=True)
class TraceContext:
    trace_id: str
    span_id: str
    flags: str = "01"

    @property
    def header(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{self.flags}"

    @property
    def b3(self) -> str:
        """The B3 single header; a trace id whose high 64 bits are zero (a 64-bit B3 trace)
        keeps its 16 characters."""
        return f"{self.b3_trace_id}-{self.span_id}-{'1' if self.sampled else '0'}"

    @property
    def b3_trace_id(self) -> str:
        return self.trace_id[16:] if self.trace_id.startswith("0" * 16) else self.trace_id

    @property
    def sampled(self) -> bool:
        return int(self.flags, 16) & 1 == 1

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


def _b3_context(trace_id: str, span_id: str, flags: str) -> TraceContext | None:
    if set(trace_id) == {"0"} or set(span_id) == {"0"}:
        return None
    return TraceContext(trace_id.rjust(32, "0"), span_id, flags)


def parse_b3(value: str | None) -> TraceContext | None:
    """The `b3` single header's trace, or None (absent, malformed, or only a sampling
    decision such as `b3: 0`, which names no trace to continue)."""
    text = (value or "").strip()
    if len(text) > MAX_TRACE_HEADER:
        return None
    match = _B3_SINGLE.match(text.lower())
    if match is None:
        return None
    trace_id, span_id, sampled, _parent = match.groups()
    return _b3_context(trace_id, span_id, "00" if sampled == "0" else "01")


def parse_b3_multi(headers: Mapping[str, str]) -> TraceContext | None:
    """The trace of the `X-B3-*` multi headers (trace and span id both needed), or None."""
    trace_id = (headers.get("x-b3-traceid") or "").strip().lower()
    span_id = (headers.get("x-b3-spanid") or "").strip().lower()
    if not (_B3_TRACE_ID.match(trace_id) and _B3_SPAN_ID.match(span_id)):
        return None
    sampled = (headers.get("x-b3-sampled") or "").strip().lower()
    debug = (headers.get("x-b3-flags") or "").strip() == "1"
    if sampled and sampled not in _B3_SAMPLED:
        return None
    return _b3_context(trace_id, span_id, "01" if debug else _B3_SAMPLED.get(sampled, "01"))


def incoming_trace(headers: Mapping[str, str]) -> tuple[str | None, str]:
    """(the `traceparent` to continue, or None; the style the caller used: `w3c`, `b3`,
    `b3multi` or ""). A valid `traceparent` wins; else a valid `b3`; else the multi headers.
    A B3 trace is continued as the equivalent `traceparent` (its 64-bit ids zero-padded)."""
    traceparent = headers.get("traceparent")
    if traceparent and len(traceparent) <= MAX_TRACE_HEADER and parse_traceparent(traceparent):
        return traceparent, "w3c"
    single = parse_b3(headers.get("b3"))
    if single is not None:
        return single.header, "b3"
    multi = parse_b3_multi(headers)
    if multi is not None:
        return multi.header, "b3multi"
    return None, ""


def trace_headers(trace: TraceContext, style: str) -> dict[str, str]:
    """The response's trace headers: `traceparent` and `b3` always, and the `X-B3-*` multi
    headers to a caller that sent those."""
    out = {"traceparent": trace.header, "b3": trace.b3}
    if style == "b3multi":
        values = (trace.b3_trace_id, trace.span_id, "1" if trace.sampled else "0")
        out.update(zip(B3_MULTI, values, strict=True))
    return out


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
