"""The engine against transformers on the same tiny checkpoint, and its scheduling rules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from serving.engine.engine import (
    DuplicateRequest,
    Engine,
    EngineFull,
    SamplingParams,
    tenant_cache_salt,
)
from serving.engine.model import LlamaModel
from serving.engine.testing import write_tiny_checkpoint
from tests.engine.conftest import hf_logits, load_model

ATOL = 1e-4
GREEDY = SamplingParams(max_tokens=10, ignore_eos=True)


def _prompt(n: int, start: int = 3) -> list[int]:
    return [(start + 7 * i) % 300 + 3 for i in range(n)]


def _assert_matches_reference(hf: Any, seq: Any) -> None:
    """Every logit row the engine sampled from equals transformers on the full context."""
    full = seq.prompt_ids + seq.output_ids[:-1]
    ref = hf_logits(hf, full)[len(seq.prompt_ids) - 1 :]
    got = torch.stack(seq.logits)
    assert got.shape == ref.shape
    diff = (got - ref).abs().max().item()
    assert diff < ATOL, f"max |logit diff| {diff:.2e}"


def test_dense_logits_equal_transformers(tiny_model: LlamaModel, hf_model: Any) -> None:
    ids = _prompt(37)
    diff = (tiny_model.reference_logits(torch.tensor(ids)) - hf_logits(hf_model, ids)).abs()
    assert diff.max().item() < ATOL


def test_alone_and_batched_decoding_equal_transformers(
    tiny_model: LlamaModel, hf_model: Any
) -> None:
    engine = Engine(tiny_model, num_blocks=64, keep_logits=True)
    alone = engine.generate([_prompt(21)], GREEDY)[0]
    _assert_matches_reference(hf_model, alone)
    # Prefills of different lengths and decodes of other sequences share forward passes.
    prompts = [_prompt(n, start=n) for n in (1, 5, 16, 17, 40, 33, 2, 64)]
    batched = engine.generate(prompts, GREEDY)
    for seq in batched:
        _assert_matches_reference(hf_model, seq)
    assert engine.pool.free_count() == 64


def test_prefix_cache_hits_give_the_same_logits(tiny_model: LlamaModel, hf_model: Any) -> None:
    engine = Engine(tiny_model, num_blocks=64, keep_logits=True)
    shared = _prompt(48)
    first = engine.generate([shared + [7, 8, 9]], GREEDY)[0]
    second = engine.generate([shared + [10, 11]], GREEDY)[0]
    assert first.cached_tokens == 0
    assert second.cached_tokens == 48  # three full 16-token blocks
    _assert_matches_reference(hf_model, second)
    # A prompt that is entirely cached still computes its last token.
    again = engine.generate([shared], GREEDY)[0]
    assert again.cached_tokens == 32
    _assert_matches_reference(hf_model, again)
    stats = engine.pool.tenant_stats("default")
    assert stats.prefix_queries == 51 + 50 + 48
    assert stats.prefix_hits == 48 + 32


def test_continuous_batching_admits_new_requests_mid_decode(tiny_model: LlamaModel) -> None:
    engine = Engine(tiny_model, num_blocks=64)
    long = engine.add_request(_prompt(8), SamplingParams(max_tokens=20, ignore_eos=True))
    for _ in range(5):
        engine.step()
    late = engine.add_request(_prompt(8, 50), SamplingParams(max_tokens=5, ignore_eos=True))
    outputs = engine.step()
    assert {o.request_id for o in outputs} == {long.id, late.id}  # one forward, both
    engine.run_until_done()
    assert late.finished_at is not None and long.finished_at is not None
    assert late.finished_at < long.finished_at


def test_preemption_when_blocks_run_out_keeps_outputs_exact(
    tiny_model: LlamaModel, hf_model: Any
) -> None:
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    prompts = [_prompt(30, s) for s in (1, 2, 3, 4)]
    # 4 sequences of 70 tokens need 20 blocks; 12 force preemptions.
    engine = Engine(tiny_model, num_blocks=12, keep_logits=False)
    seqs = engine.generate(prompts, params)
    assert engine.pool.tenant_stats("default").preemptions > 0
    assert sum(s.preempted for s in seqs) > 0
    roomy = Engine(tiny_model, num_blocks=64)
    for seq, ref in zip(seqs, roomy.generate(prompts, params), strict=True):
        assert seq.output_ids == ref.output_ids
    assert engine.pool.free_count() == 12


def test_tenants_never_share_prefix_blocks(tiny_model: LlamaModel) -> None:
    engine = Engine(tiny_model, num_blocks=64, cache_secret=b"server-secret")
    prompt = _prompt(64)
    engine.generate([prompt], GREEDY, tenant="a")
    engine.generate([prompt], GREEDY, tenant="b")  # B sends A's exact prompt
    engine.generate([prompt], GREEDY, tenant="a")  # A repeats
    a, b = engine.pool.tenant_stats("a"), engine.pool.tenant_stats("b")
    assert b.prefix_hits == 0
    assert a.prefix_hits == 48  # (64 - 1) // 16 full blocks reusable
    assert tenant_cache_salt(b"server-secret", "a") != tenant_cache_salt(b"server-secret", "b")
    assert tenant_cache_salt(b"s1", "a") != tenant_cache_salt(b"s2", "a")


def test_a_flooding_tenant_cannot_evict_another_tenants_blocks(tiny_model: LlamaModel) -> None:
    engine = Engine(
        tiny_model, num_blocks=48, quotas={"a": 16, "b": 16}, cache_secret=b"server-secret"
    )
    prompt_a = _prompt(64)
    engine.generate([prompt_a], GREEDY, tenant="a")
    for i in range(12):  # B floods long distinct prompts, far beyond its 16 blocks
        engine.generate([_prompt(100, 10 + i)], GREEDY, tenant="b")
    b = engine.pool.tenant_stats("b")
    assert b.evictions > 0 and b.blocks_used <= 16
    assert engine.pool.tenant_stats("a").evictions == 0
    again = engine.generate([prompt_a], GREEDY, tenant="a")[0]
    assert again.cached_tokens == 48


def test_quota_refuses_a_request_that_can_never_fit(tiny_model: LlamaModel) -> None:
    engine = Engine(tiny_model, num_blocks=64, quotas={"small": 2})
    with pytest.raises(EngineFull, match="may hold 2"):
        engine.add_request(_prompt(40), GREEDY, tenant="small")


def test_hot_swap_keeps_in_flight_requests_on_their_weights(
    tiny_model: LlamaModel, tmp_path: Path
) -> None:
    new_model = load_model(write_tiny_checkpoint(tmp_path / "v2", seed=1), fingerprint="tiny-v2")
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    prompt = _prompt(20)
    engine = Engine(tiny_model, num_blocks=64)
    old = engine.add_request(prompt, params)
    for _ in range(4):
        engine.step()
    engine.swap_model(new_model)
    new = engine.add_request(prompt, params)  # same prompt: no prefix hit across weights
    engine.run_until_done()
    assert new.cached_tokens == 0
    assert old.output_ids == Engine(tiny_model).generate([prompt], params)[0].output_ids
    assert new.output_ids == Engine(new_model).generate([prompt], params)[0].output_ids
    assert old.output_ids != new.output_ids


def test_swap_refuses_a_different_architecture(tiny_model: LlamaModel, tmp_path: Path) -> None:
    other = load_model(write_tiny_checkpoint(tmp_path / "wide", hidden_size=96))
    with pytest.raises(ValueError, match="same architecture"):
        Engine(tiny_model).swap_model(other)


def test_sampling_is_reproducible_with_a_seed(tiny_model: LlamaModel) -> None:
    params = SamplingParams(max_tokens=16, temperature=0.9, top_p=0.9, seed=7, ignore_eos=True)
    one = Engine(tiny_model).generate([_prompt(9)], params)[0].output_ids
    two = Engine(tiny_model).generate([_prompt(9)], params)[0].output_ids
    assert one == two
    assert len(set(one)) > 1


def test_gqa_with_one_kv_head_and_tied_embeddings(tmp_path: Path) -> None:
    import transformers

    directory = write_tiny_checkpoint(
        tmp_path / "gqa", num_key_value_heads=1, tie_word_embeddings=True, seed=3
    )
    hf = transformers.LlamaForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    engine = Engine(load_model(directory), num_blocks=32, keep_logits=True)
    for seq in engine.generate([_prompt(19), _prompt(3, 9)], GREEDY):
        _assert_matches_reference(hf, seq)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
    ],
)
def test_bad_sampling_params(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_bad_prompts(tiny_model: LlamaModel) -> None:
    engine = Engine(tiny_model)
    with pytest.raises(ValueError, match="must not be empty"):
        engine.add_request([], GREEDY)
    with pytest.raises(ValueError, match="exceeds the model's context"):
        engine.add_request([5] * 1020, GREEDY)


# Shared pools: each tenant's share of the batch, fair turns, request ids per tenant -----------

SHORT = SamplingParams(max_tokens=4, ignore_eos=True)


def _running(engine: Engine, tenant: str) -> int:
    return sum(1 for s in engine.running if s.tenant == tenant)


def test_a_flooding_tenant_runs_its_share_and_another_tenant_is_admitted_next_step(
    tiny_model: LlamaModel,
) -> None:
    engine = Engine(tiny_model, num_blocks=256, max_num_seqs=8)
    engine.set_limits({"a": 2, "b": 2}, 1)
    flood = [engine.add_request(_prompt(8, i), SHORT, tenant="a") for i in range(20)]  # 10x
    engine.step()
    assert _running(engine, "a") == 2  # slots were free, but A may run only its share
    single = engine.add_request(_prompt(8, 99), SHORT, tenant="b")
    engine.step()
    assert single in engine.running  # the next step, not after A's queue
    most_a = 0
    while engine.has_work():
        engine.step()
        most_a = max(most_a, _running(engine, "a"))
    assert most_a <= 2
    assert single.finished_at is not None
    assert single.finished_at < sorted(s.finished_at or 0 for s in flood)[2]
    assert all(s.output_ids == Engine(tiny_model).generate([s.prompt_ids], SHORT)[0].output_ids
               for s in (flood[0], single))  # fmt: skip


def test_free_slots_go_to_the_tenant_running_fewest_in_turn(tiny_model: LlamaModel) -> None:
    engine = Engine(tiny_model, num_blocks=256, max_num_seqs=4)
    engine.set_limits({"a": 4, "b": 4}, 1)
    for i in range(10):
        engine.add_request(_prompt(8, i), SHORT, tenant="a")
    for i in range(10):
        engine.add_request(_prompt(8, 50 + i), SHORT, tenant="b")
    engine.step()
    # A arrived first with ten, yet the four slots are shared in turn.
    assert (_running(engine, "a"), _running(engine, "b")) == (2, 2)
    # Each tenant's own requests keep their order.
    assert [s.id for s in engine.running if s.tenant == "a"] == ["req-0", "req-1"]


def test_a_tenant_without_a_limit_gets_the_default_share(tiny_model: LlamaModel) -> None:
    engine = Engine(tiny_model, num_blocks=256, max_num_seqs=8)
    engine.set_limits({"a": 3}, 1)
    for i in range(5):
        engine.add_request(_prompt(8, i), SHORT, tenant="unlisted")
    engine.step()
    assert _running(engine, "unlisted") == 1
    tenants = engine.metrics()["tenants"]
    assert (tenants["unlisted"]["running"], tenants["unlisted"]["waiting"]) == (1, 4)
    assert tenants["unlisted"]["max_running"] == 1
    assert tenants["a"]["max_running"] == 3 and tenants["a"]["running"] == 0


def test_without_limits_one_tenants_engine_admits_in_arrival_order(
    tiny_model: LlamaModel,
) -> None:
    engine = Engine(tiny_model, num_blocks=256, max_num_seqs=4)
    for i in range(10):
        engine.add_request(_prompt(8, i), SHORT, tenant="a")
    late = engine.add_request(_prompt(8, 77), SHORT, tenant="b")
    engine.step()
    assert _running(engine, "a") == 4 and late in engine.waiting  # dedicated: plain FIFO


def test_request_ids_are_per_tenant(tiny_model: LlamaModel) -> None:
    engine = Engine(tiny_model, num_blocks=64)
    long = SamplingParams(max_tokens=30, ignore_eos=True)
    mine = engine.add_request(_prompt(8), long, tenant="a", request_id="r1")
    theirs = engine.add_request(_prompt(8), long, tenant="b", request_id="r1")  # no collision
    engine.step()
    engine.abort("r1", tenant="b")  # B cancels its own, never A's
    assert theirs.finish_reason == "abort" and mine in engine.running
    with pytest.raises(DuplicateRequest, match="r1"):
        engine.add_request(_prompt(8), long, tenant="a", request_id="r1")
    engine.abort("r1", tenant="c")  # nobody's: nothing happens
    engine.run_until_done()
    assert mine.finish_reason == "length" and len(mine.output_ids) == 30
    assert engine.sequences == {}
    again = engine.add_request(_prompt(8), SHORT, tenant="a", request_id="r1")  # free again
    engine.run_until_done([again])
    assert again.finish_reason == "length"
