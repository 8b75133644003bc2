"""Device-memory fragmentation as the seeds define it: 1 - largest free block / total free.

What counts as free on a real GPU, per device:

- memory no process has reserved: NVML's `free`. The driver maps free physical pages into a
  fresh virtual range, so this is one block for the next cudaMalloc (up to page granularity);
- memory a replica's CUDA caching allocator reserved but holds no tensor in: the `inactive`
  blocks of its segments (torch.cuda.memory_snapshot(); serving.engine.memory's
  `allocator_report` publishes their sum and the largest with the replica's SLI window, as
  `kv.device_memory`). Such a block serves only allocations that
  fit in it, in that process: this is where fragmentation lives.

So total free = NVML free + every replica's inactive bytes on the device, and the largest free
block = the larger of NVML free and the largest inactive block. A device none of whose replicas
published an allocator report is measured from NVML alone (fragmentation 0, source `nvml`).
The simulated provider makes its own plausible figure (source `simulated`).
Pure functions, no Django: the agent (serving.telemetry.agent) applies them to each sample.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

SOURCE_SIMULATED = "simulated"
SOURCE_NVML = "nvml"
SOURCE_ALLOCATOR = "nvml+cuda_allocator"


def fragmentation(largest_free: int, total_free: int) -> float:
    """1 - largest / total, in [0, 1]; 0 when nothing is free (nothing to fragment)."""
    if total_free <= 0:
        return 0.0
    if largest_free < 0 or largest_free > total_free:
        raise ValueError(f"largest free block {largest_free} outside 0..{total_free}")
    return round(1.0 - largest_free / total_free, 4)


def device_figures(
    nvml_free: int, reports: Iterable[Mapping[str, Any]]
) -> tuple[int, int, float, str]:
    """(largest free block, total free, fragmentation, source) of one device from NVML's free
    memory and the allocator reports of the replicas on it (each `{"inactive": bytes,
    "largest_inactive": bytes}`)."""
    reports = list(reports)
    inactive = sum(max(0, int(r.get("inactive", 0))) for r in reports)
    largest_inactive = max((max(0, int(r.get("largest_inactive", 0))) for r in reports), default=0)
    total = max(0, nvml_free) + inactive
    largest = max(max(0, nvml_free), largest_inactive)
    source = SOURCE_ALLOCATOR if reports else SOURCE_NVML
    return largest, total, fragmentation(largest, total), source


def enrich_devices(
    devices: list[dict[str, Any]],
    processes: Iterable[Mapping[str, Any]],
    replicas: Iterable[Mapping[str, Any]],
) -> list[dict[str, Any]]:
    """The sample's devices with `mem_largest_free`, `fragmentation` and
    `fragmentation_source` filled in where the provider left them None (NVML cannot see an
    allocator): from NVML's free memory and the allocator reports of the replicas that
    attribution (serving.telemetry.agent.attribution) put on each device. A provider that set
    them itself (the simulated one) is left alone."""
    by_replica = {
        str(r.get("replica")): (r.get("kv") or {}).get("device_memory")
        for r in replicas
        if r.get("replica") is not None
    }
    reports: dict[str, list[Mapping[str, Any]]] = {}
    seen: set[tuple[str, str]] = set()
    for process in processes:
        name = process.get("replica")
        report = by_replica.get(str(name)) if name is not None else None
        key = (str(process.get("device_uuid")), str(name))
        if isinstance(report, Mapping) and key not in seen:
            seen.add(key)
            reports.setdefault(str(process.get("device_uuid")), []).append(report)
    out = []
    for device in devices:
        if device.get("fragmentation") is None:
            largest, _, frag, source = device_figures(
                int(device.get("mem_free") or 0), reports.get(str(device.get("uuid")), [])
            )
            device = {
                **device,
                "mem_largest_free": largest,
                "fragmentation": frag,
                "fragmentation_source": source,
            }
        out.append(device)
    return out
