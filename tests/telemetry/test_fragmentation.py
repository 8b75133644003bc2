"""Device-memory fragmentation, 1 - largest free block / total free (seed 000 §2.2): the math,
the CUDA caching allocator's segments read as free blocks, NVML's free memory combined with the
replicas' allocator reports, and the simulated provider's labelled figure. No GPU here: the
allocator segments are written in torch.cuda.memory_snapshot()'s shape."""

from __future__ import annotations

import pytest

from serving.engine.memory import allocator_report, device_free, free_blocks_of_segments
from serving.telemetry.providers.fragmentation import (
    SOURCE_ALLOCATOR,
    SOURCE_NVML,
    SOURCE_SIMULATED,
    device_figures,
    enrich_devices,
    fragmentation,
)
from serving.telemetry.providers.simulated import FRAG_MAX, SimulatedProvider

GIB = 1 << 30
MIB = 1 << 20


def test_fragmentation_is_one_minus_largest_over_total() -> None:
    # The seed's case: 1.2 GB is the largest free block, the index 0.63.
    total = int(1.2 * GIB / (1 - 0.63))
    assert fragmentation(int(1.2 * GIB), total) == pytest.approx(0.63, abs=1e-3)
    assert fragmentation(4 * GIB, 4 * GIB) == 0.0  # one block: nothing fragmented
    assert fragmentation(GIB, 4 * GIB) == 0.75
    assert fragmentation(0, 0) == 0.0  # nothing free: nothing to fragment
    with pytest.raises(ValueError, match="outside"):
        fragmentation(5 * GIB, 4 * GIB)
    with pytest.raises(ValueError, match="outside"):
        fragmentation(-1, 4 * GIB)


def _segment(device: int, *blocks: tuple[str, int]) -> dict[str, object]:
    """One segment as torch.cuda.memory_snapshot() lists it."""
    return {
        "device": device,
        "total_size": sum(size for _, size in blocks),
        "blocks": [{"state": state, "size": size} for state, size in blocks],
    }


def test_free_blocks_are_the_inactive_runs_of_each_segment() -> None:
    segments = [
        _segment(
            0,
            ("active_allocated", 2 * MIB),
            ("inactive", 6 * MIB),
            ("inactive", 2 * MIB),
            ("active_allocated", 4 * MIB),
            ("inactive", 3 * MIB),
        ),  # fmt: skip
        _segment(0, ("inactive", 20 * MIB)),  # a whole cached segment
        _segment(0, ("active_allocated", 20 * MIB)),
        _segment(0, ("inactive", MIB), ("active_pending_free", MIB), ("inactive", MIB)),
    ]
    # Adjacent inactive blocks are one free range; a block pending free is not free yet.
    assert free_blocks_of_segments(segments) == [8 * MIB, 3 * MIB, 20 * MIB, MIB, MIB]
    assert free_blocks_of_segments([]) == []


def test_a_device_combines_nvml_free_memory_with_the_replicas_allocators() -> None:
    reports = [
        {"inactive": 6 * GIB, "largest_inactive": GIB},
        {"inactive": 2 * GIB, "largest_inactive": 2 * GIB},
    ]
    largest, total, frag, source = device_figures(2 * GIB, reports)
    assert (largest, total, source) == (2 * GIB, 10 * GIB, SOURCE_ALLOCATOR)
    assert frag == 0.8
    # A large untouched region outside every allocator is the largest block.
    largest, total, frag, _ = device_figures(30 * GIB, reports)
    assert (largest, total) == (30 * GIB, 38 * GIB) and frag == pytest.approx(1 - 30 / 38, 1e-3)
    # No allocator report: NVML's free memory is one block for the driver.
    assert device_figures(5 * GIB, []) == (5 * GIB, 5 * GIB, 0.0, SOURCE_NVML)


def _device(uuid: str, free: int, **extra: object) -> dict[str, object]:
    return {"index": 0, "uuid": uuid, "name": "H100", "mem_free": free, "fragmentation": None,
            "mem_largest_free": None, "fragmentation_source": None, **extra}  # fmt: skip


def test_enrich_uses_the_reports_of_the_replicas_attributed_to_each_device() -> None:
    devices = [_device("GPU-0", 4 * GIB), _device("GPU-1", 4 * GIB)]
    processes = [
        {"pid": 11, "device_uuid": "GPU-0", "replica": "r-a"},
        {"pid": 12, "device_uuid": "GPU-1", "replica": "r-b"},
        {"pid": 13, "device_uuid": "GPU-1", "replica": None},  # not a portal replica
    ]
    replicas = [
        {
            "replica": "r-a",
            "kv": {"device_memory": {"inactive": 4 * GIB, "largest_inactive": GIB}},
        },  # fmt: skip
        {"replica": "r-b", "kv": {"device_memory": None}},  # a CPU engine: no allocator
    ]
    out = enrich_devices(devices, processes, replicas)
    assert out[0]["fragmentation"] == 0.5 and out[0]["fragmentation_source"] == SOURCE_ALLOCATOR
    assert out[0]["mem_largest_free"] == 4 * GIB
    assert out[1]["fragmentation"] == 0.0 and out[1]["fragmentation_source"] == SOURCE_NVML
    # A provider's own figure (the simulated one) is left as it is.
    simulated = _device("SIM-GPU-0", GIB, fragmentation=0.4, fragmentation_source="simulated")
    assert enrich_devices([simulated], processes, replicas) == [simulated]


def test_the_simulated_provider_labels_a_plausible_figure() -> None:
    provider = SimulatedProvider(devices=2, seed=3)
    for _ in range(5):
        idle = provider.devices()
    provider.attach(pid=100, device_index=0, used_memory=30 * GIB)
    for _ in range(60):
        busy = provider.devices()
    for device in idle + busy:
        assert device.fragmentation_source == SOURCE_SIMULATED
        assert device.fragmentation is not None and 0.0 <= device.fragmentation <= FRAG_MAX
        assert device.mem_largest_free is not None
        assert 0 <= device.mem_largest_free <= device.mem_free
        assert device.fragmentation == fragmentation(device.mem_largest_free, device.mem_free)
    # A device serving batches fragments; an idle one's free memory stays nearly one block.
    assert busy[0].fragmentation is not None and busy[1].fragmentation is not None
    assert busy[0].fragmentation > 0.15 > busy[1].fragmentation
    # Seeded: the same walk again.
    first, second = SimulatedProvider(devices=1, seed=5), SimulatedProvider(devices=1, seed=5)
    assert [first.devices()[0].fragmentation for _ in range(10)] == [
        second.devices()[0].fragmentation for _ in range(10)
    ]


def test_off_cuda_there_is_no_allocator_to_read() -> None:
    assert allocator_report("cpu") is None
    assert device_free("cpu") is None
