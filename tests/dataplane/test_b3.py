"""B3 trace propagation beside W3C traceparent (serving.dataplane.traffic): the `b3` single
header and the `X-B3-*` multi headers continue the same trace when no valid traceparent is
given; malformed ones are ignored; the answer carries both forms."""

from __future__ import annotations

from serving.dataplane.traffic import (
    continue_trace,
    incoming_trace,
    parse_b3,
    parse_b3_multi,
    trace_headers,
)

TRACE128 = "80f198ee56343ba864fe8b2a57d3eff7"
TRACE64 = "463ac35c9f6413ad"
SPAN = "e457b5a2e4d86bd1"
PARENT = "05e3ac9a4f6e3b90"
W3C = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_single_header_forms() -> None:
    full = parse_b3(f"{TRACE128}-{SPAN}-1-{PARENT}")
    assert full is not None and full.trace_id == TRACE128 and full.span_id == SPAN
    assert full.sampled
    assert parse_b3(f"{TRACE128}-{SPAN}").sampled  # deferred: we sample
    unsampled = parse_b3(f"{TRACE128}-{SPAN}-0")
    assert unsampled is not None and not unsampled.sampled and unsampled.flags == "00"
    assert parse_b3(f"{TRACE128}-{SPAN}-d").sampled  # debug
    short = parse_b3(f"{TRACE64}-{SPAN}-1")
    assert short is not None and short.trace_id == "0" * 16 + TRACE64
    assert short.b3_trace_id == TRACE64  # a 64-bit trace answers as 64-bit


def test_malformed_single_headers_are_ignored() -> None:
    bad = [
        None,
        "",
        "0",
        "1",
        "d",
        f"{TRACE128[:-1]}-{SPAN}",  # 31 hex
        f"{TRACE128}0-{SPAN}",  # 33 hex
        f"{TRACE64[:-2]}-{SPAN}",  # 14 hex
        f"{TRACE128}-{SPAN[:-1]}",
        f"{TRACE128}-{SPAN}-2",
        f"{TRACE128}-{SPAN}-1-{PARENT[:-1]}",
        f"{TRACE128}-{SPAN}-1-{PARENT}-extra",
        f"{'g' * 32}-{SPAN}",
        f"{'0' * 32}-{SPAN}",
        f"{TRACE128}-{'0' * 16}",
        f"{TRACE128}-{SPAN}" + " " * 600 + "x",
        "x" * 10000,
    ]
    for value in bad:
        assert parse_b3(value) is None, value


def test_multi_headers() -> None:
    sampled = parse_b3_multi({"x-b3-traceid": TRACE128, "x-b3-spanid": SPAN, "x-b3-sampled": "1"})
    assert sampled is not None and sampled.trace_id == TRACE128 and sampled.sampled
    off = parse_b3_multi({"x-b3-traceid": TRACE64, "x-b3-spanid": SPAN, "x-b3-sampled": "0"})
    assert off is not None and not off.sampled and off.trace_id.endswith(TRACE64)
    debug = {"x-b3-traceid": TRACE64, "x-b3-spanid": SPAN, "x-b3-sampled": "0", "x-b3-flags": "1"}
    assert parse_b3_multi(debug).sampled  # type: ignore[union-attr]
    for bad in (
        {"x-b3-traceid": TRACE128},  # no span id
        {"x-b3-spanid": SPAN},
        {"x-b3-traceid": TRACE128 + "0", "x-b3-spanid": SPAN},
        {"x-b3-traceid": TRACE128, "x-b3-spanid": SPAN + "00"},
        {"x-b3-traceid": TRACE128, "x-b3-spanid": SPAN, "x-b3-sampled": "maybe"},
        {"x-b3-traceid": "0" * 16, "x-b3-spanid": SPAN},
    ):
        assert parse_b3_multi(bad) is None, bad


def test_traceparent_wins_then_b3_then_multi() -> None:
    multi = {"x-b3-traceid": TRACE64, "x-b3-spanid": SPAN}
    both = {"traceparent": W3C, "b3": f"{TRACE128}-{SPAN}-1", **multi}
    assert incoming_trace(both) == (W3C, "w3c")
    # A malformed traceparent does not hide a good b3.
    value, style = incoming_trace({"traceparent": "00-zz", "b3": f"{TRACE128}-{SPAN}-1", **multi})
    assert style == "b3" and value == f"00-{TRACE128}-{SPAN}-01"
    value, style = incoming_trace({"b3": "garbage", **multi})
    assert style == "b3multi" and value == f"00-{'0' * 16}{TRACE64}-{SPAN}-01"
    assert incoming_trace({}) == (None, "")
    assert incoming_trace({"b3": "1", "x-b3-traceid": "nope"}) == (None, "")


def test_the_answer_continues_the_trace_in_both_forms() -> None:
    value, style = incoming_trace({"b3": f"{TRACE128}-{SPAN}-1"})
    trace = continue_trace(value)
    assert trace.trace_id == TRACE128 and trace.span_id != SPAN
    out = trace_headers(trace, style)
    assert out["traceparent"].split("-")[1] == TRACE128
    assert out["b3"] == f"{TRACE128}-{trace.span_id}-1"
    assert "x-b3-traceid" not in out
    value, style = incoming_trace(
        {"x-b3-traceid": TRACE64, "x-b3-spanid": SPAN, "x-b3-sampled": "0"}
    )
    trace = continue_trace(value)
    out = trace_headers(trace, style)
    assert out["x-b3-traceid"] == TRACE64 and out["x-b3-spanid"] == trace.span_id
    assert out["x-b3-sampled"] == "0" and out["b3"] == f"{TRACE64}-{trace.span_id}-0"
    assert out["traceparent"] == f"00-{'0' * 16}{TRACE64}-{trace.span_id}-00"
    # No trace given: a new one, in both forms.
    fresh = trace_headers(continue_trace(None), "")
    assert fresh["b3"].split("-")[0] == fresh["traceparent"].split("-")[1]
