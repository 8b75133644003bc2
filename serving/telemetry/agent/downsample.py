"""Downsampling: the 1 s and 1 min rows (means and peaks) of every device and every replica's
GPU memory, built from the 5 Hz samples."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any


@dataclass
class _Span:
    start: float
    n: int = 0
    sums: dict[str, float] = field(default_factory=dict)
    peaks: dict[str, float] = field(default_factory=dict)
    last: dict[str, Any] = field(default_factory=dict)


_MEANS = ("gpu_util", "mem_util", "mem_used", "temperature_c", "power_w", "sm_clock_mhz")
_PEAKS = {"mem_used": "mem_used_max", "temperature_c": "temperature_max_c"}


class Downsampler:
    """Means (and peaks) of every device and every replica's GPU memory over each second and
    each minute; `add()` returns the rows of the spans that ended."""

    def __init__(self, node: str, simulated: bool) -> None:
        self.node, self.simulated = node, simulated
        self.spans: dict[tuple[int, str, Any], _Span] = {}

    def add(self, snapshot: Mapping[str, Any]) -> tuple[list[Any], list[Any]]:
        now = float(snapshot["at"])
        items: list[tuple[str, Any, dict[str, Any]]] = [
            ("device", d["uuid"], d) for d in snapshot["devices"]
        ]
        items += [
            ("process", (p["device_uuid"], p["deployment_id"], p["replica"], p["tenant_id"]), p)
            for p in snapshot["processes"]
            if p["tenant_id"] is not None
        ]
        devices: list[Any] = []
        processes: list[Any] = []
        for resolution in (1, 60):
            start = now - now % resolution
            seen = set()
            for kind, key, values in items:
                span_key = (resolution, kind, key)
                seen.add(span_key)
                span = self.spans.get(span_key)
                if span is not None and span.start < start:
                    self._emit(resolution, kind, span, devices, processes)
                    span = None
                if span is None:
                    span = self.spans[span_key] = _Span(start=start)
                self._fold(span, kind, values)
            # A device or replica that went away: its last span is written once it ends.
            for span_key in [k for k in self.spans if k[0] == resolution and k not in seen]:
                if self.spans[span_key].start < start:
                    self._emit(
                        resolution, span_key[1], self.spans.pop(span_key), devices, processes
                    )
        return devices, processes

    @staticmethod
    def _fold(span: _Span, kind: str, values: Mapping[str, Any]) -> None:
        span.n += 1
        names = _MEANS if kind == "device" else ("used_memory",)
        for name in names:
            value = float(values.get(name) or 0)
            span.sums[name] = span.sums.get(name, 0.0) + value
            if name in _PEAKS:
                span.peaks[name] = max(span.peaks.get(name, value), value)
        span.last = dict(values)

    def _emit(
        self, resolution: int, kind: str, span: _Span, devices: list[Any], processes: list[Any]
    ) -> None:
        from serving.telemetry.models import GpuDeviceSample, GpuProcessSample

        at = datetime.fromtimestamp(span.start, tz=UTC)
        mean = {k: v / span.n for k, v in span.sums.items()}
        last = span.last
        if kind == "device":
            devices.append(
                GpuDeviceSample(
                    node=self.node,
                    device_uuid=last["uuid"],
                    device_index=last["index"],
                    name=str(last["name"])[:128],
                    simulated=self.simulated,
                    resolution=resolution,
                    at=at,
                    samples=span.n,
                    gpu_util=mean["gpu_util"],
                    mem_util=mean["mem_util"],
                    mem_used=int(mean["mem_used"]),
                    mem_used_max=int(span.peaks["mem_used"]),
                    mem_total=int(last["mem_total"]),
                    temperature_c=mean["temperature_c"],
                    temperature_max_c=span.peaks["temperature_c"],
                    power_w=mean["power_w"],
                    sm_clock_mhz=mean["sm_clock_mhz"],
                    xid_errors=last.get("xid_errors"),
                )
            )
        else:
            processes.append(
                GpuProcessSample(
                    tenant_id=last["tenant_id"],
                    deployment_id=last["deployment_id"],
                    replica=str(last["replica"])[:128],
                    node=self.node,
                    device_uuid=last["device_uuid"],
                    resolution=resolution,
                    at=at,
                    used_memory=int(mean["used_memory"]),
                )
            )
