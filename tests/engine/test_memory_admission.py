"""The engine's GPU memory admission (serving.engine.memory) on the real engine and a tiny
checkpoint: the sizes match what the engine allocates, a request over its tenant's cap is
refused before it runs (413), a capped tenant's KV blocks never grow past the cap however many
requests it sends, and a batch the device cannot hold now is refused (503), fragmentation
included. No GPU here: the device's free memory is the one thing faked (the hardware edge)."""

from __future__ import annotations

import pytest
import torch

from serving.dataplane.engine_calls import engine_refusal
from serving.engine.async_engine import AsyncEngine
from serving.engine.engine import Engine, SamplingParams
from serving.engine.memory import (
    CAP_FIELD,
    MIB,
    MemoryRefused,
    Shapes,
    memory_caps,
    replica_bytes,
)
from serving.engine.model import LlamaModel


def _prompt(n: int, start: int = 3) -> list[int]:
    return [(start + 7 * i) % 300 + 3 for i in range(n)]


def _bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def test_the_sizes_are_what_the_engine_allocates(tiny_model: LlamaModel) -> None:
    engine = Engine(tiny_model, num_blocks=64, block_size=16)
    assert engine.memory.block_bytes == engine.cache.bytes_per_block
    cache_bytes = sum(_bytes(t) for t in [*engine.cache.k, *engine.cache.v])
    assert 64 * engine.memory.block_bytes == cache_bytes
    weights = [tiny_model.embed, tiny_model.norm]
    weights += [tiny_model.lm_head] if tiny_model.lm_head is not tiny_model.embed else []
    for layer in tiny_model.layers:
        weights += [layer.ln1, layer.qkv, layer.o, layer.ln2, layer.gate_up, layer.down]
    assert engine.memory.shapes.weight_bytes() == sum(_bytes(t) for t in weights)
    # The registry's summary of the version sizes the same replica as the loaded model.
    assert Shapes.of(tiny_model.config.summary()) == engine.memory.shapes
    sizes = replica_bytes(engine.memory.shapes, kv_blocks=64, block_size=16, max_num_seqs=4)
    assert sizes["kv_cache"] == cache_bytes
    assert sizes["total"] == sizes["weights"] + sizes["kv_cache"] + sizes["activations"]
    # Activations grow with the batch; the largest tensor is part of the whole.
    small = engine.memory.shapes.activations([(16, 16)])
    big = engine.memory.shapes.activations([(512, 512)], [100] * 8)
    assert 0 < small[1] <= small[0] < big[1] <= big[0]


def _capped(model: LlamaModel, blocks: int, **kwargs: int) -> tuple[Engine, int]:
    """An engine whose tenant "t" has a cap leaving room for about `blocks` KV blocks."""
    engine = Engine(model, num_blocks=256, block_size=16, max_prefill_tokens=256, **kwargs)
    guard = engine.memory
    need = guard.shapes.weight_bytes() + guard.step_reserve() + blocks * guard.block_bytes
    cap_mb = -(-need // MIB)
    memory_caps(engine, {"t": cap_mb, "free": None}, shared=False)
    return engine, cap_mb


def test_a_request_over_its_tenants_cap_is_refused_before_it_runs(
    tiny_model: LlamaModel,
) -> None:
    engine, cap_mb = _capped(tiny_model, blocks=8)
    cap_blocks = engine.memory.cap_blocks("t")
    assert cap_blocks is not None and 8 <= cap_blocks < 60  # the tiny model's: 39
    assert engine.pool.quota("t") == cap_blocks and engine.pool.quota("free") == 256
    huge = SamplingParams(max_tokens=cap_blocks * 16, ignore_eos=True)  # one block too many
    with pytest.raises(MemoryRefused) as refused:
        engine.add_request(_prompt(16), huge, tenant="t")
    assert refused.value.status == 413 and refused.value.code == "gpu_memory_cap_exceeded"
    assert CAP_FIELD in refused.value.message and f"{cap_mb:,} MiB" in refused.value.message
    assert f"room for {cap_blocks}" in refused.value.message
    assert not engine.has_work()  # nothing queued, nothing allocated
    # The client's answer names it (the version slot maps engine refusals).
    answer = engine_refusal(refused.value)
    assert answer is not None and (answer.status, answer.code) == (413, "gpu_memory_cap_exceeded")
    # The same request from an uncapped tenant is admitted; one within the room runs.
    engine.check_admissible(16, cap_blocks * 16, "free")
    fits = engine.add_request(_prompt(16), SamplingParams(max_tokens=8), tenant="t")
    engine.run_until_done([fits])
    assert fits.finish_reason in ("stop", "length")


def test_a_capped_tenants_blocks_never_grow_past_its_cap(tiny_model: LlamaModel) -> None:
    engine, cap_mb = _capped(tiny_model, blocks=12)
    cap_blocks = engine.memory.cap_blocks("t")
    assert cap_blocks is not None
    params = SamplingParams(max_tokens=24, ignore_eos=True)  # 3 blocks each, 120 in all
    seqs = [engine.add_request(_prompt(24, start=i), params, tenant="t") for i in range(40)]
    neighbour = engine.add_request(_prompt(24), params, tenant="free")
    most = 0
    weights = engine.memory.shapes.weight_bytes()
    while engine.has_work():
        engine.step()
        held = engine.pool.stats["t"].blocks_used
        most = max(most, held)
        assert held <= cap_blocks
        used = weights + held * engine.memory.block_bytes + engine.memory.step_reserve()
        assert used <= cap_mb * MIB
    # It used its room and queued the rest instead of growing (120 blocks were asked for).
    assert cap_blocks - 3 < most <= cap_blocks < 120
    assert all(len(s.output_ids) == 24 for s in [*seqs, neighbour])


def test_a_batch_the_device_cannot_hold_is_refused_for_now(tiny_model: LlamaModel) -> None:
    engine = Engine(tiny_model, num_blocks=256, block_size=16)
    shapes = engine.memory.shapes
    prompt = _prompt(200)
    alone, _ = shapes.activations([(200, 200)])
    free = {"bytes": alone + MIB, "largest": alone}  # FAKE: the GPU's free memory (no GPU here)
    engine.memory.free_memory = lambda: (free["bytes"], free["largest"])
    running = [engine.add_request(_prompt(8, start=i), SamplingParams(max_tokens=40,
               ignore_eos=True)) for i in range(3)]  # fmt: skip
    engine.step()
    # The prompt alone fits; beside the running batch's decodes it no longer does.
    contexts = [len(s.tokens) for s in running]
    with_batch, largest_with_batch = shapes.activations([(200, 200)], contexts)
    assert with_batch > alone
    free["bytes"] = (alone + with_batch) // 2
    with pytest.raises(MemoryRefused) as refused:
        engine.add_request(prompt, SamplingParams(max_tokens=8))
    assert refused.value.status == 503 and refused.value.code == "insufficient_gpu_memory"
    answer = engine_refusal(refused.value)
    assert answer is not None and answer.status == 503
    # Enough memory in all, but fragmented: no free block holds the largest tensor.
    free["bytes"], free["largest"] = 100 * with_batch, largest_with_batch - 1
    with pytest.raises(MemoryRefused, match="largest free block"):
        engine.add_request(prompt, SamplingParams(max_tokens=8))
    free["largest"] = largest_with_batch
    seq = engine.add_request(prompt, SamplingParams(max_tokens=8, ignore_eos=True))
    engine.run_until_done([seq, *running])
    assert len(seq.output_ids) == 8


def test_the_async_engine_applies_caps_and_refuses_at_admission(tiny_model: LlamaModel) -> None:
    engine = AsyncEngine(Engine(tiny_model, num_blocks=128, max_prefill_tokens=256))
    try:
        engine.set_quotas({"t": 100}, None)
        guard = engine.engine.memory
        cap_mb = -(-(guard.shapes.weight_bytes() + guard.step_reserve()) // MIB)
        engine.set_memory_caps({"t": cap_mb}, shared=False)
        blocks = guard.cap_blocks("t")
        assert blocks is not None and 0 < blocks < 60  # the tiny model's: 39 of 16 tokens
        assert engine.engine.pool.quota("t") == min(100, blocks)
        with pytest.raises(MemoryRefused, match="gpu_memory_cap|room for"):
            engine.check_admissible(16, blocks * 16, "t")  # one block more than the room
        engine.check_admissible(16, blocks * 16 - 16, "t")
        engine.check_admissible(16, 8, "t")
        # In a shared pool the weights are the platform's: the same cap leaves more blocks.
        engine.set_quotas({"t": 100}, 0)
        engine.set_memory_caps({"t": cap_mb}, shared=True)
        shared_blocks = guard.cap_blocks("t")
        assert shared_blocks is not None and shared_blocks > blocks
        # No cap: the quota is what the pool's share says.
        engine.set_quotas({"t": 100}, 0)
        engine.set_memory_caps({}, shared=True)
        assert engine.engine.pool.quota("t") == 100
    finally:
        engine.stop()


def test_the_devices_free_memory_is_read_at_most_every_tenth_of_a_second() -> None:
    from serving.engine.memory import _every

    calls = []
    read = _every(0.1, lambda: calls.append(1) or len(calls))
    assert [read(), read(), read()] == [1, 1, 1]
    import time

    time.sleep(0.12)
    assert read() == 2
