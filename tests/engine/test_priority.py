"""Priority classes in the engine's scheduler: realtime admitted before batch, batch preempted
first (for blocks, for the tenant's share, for an engine slot), the starvation bound of batch
(aging), and the same rules across tenants of a shared pool under their fairness limits."""

from __future__ import annotations

import pytest

from serving.engine.engine import Engine, SamplingParams, Sequence
from serving.engine.model import LlamaModel
from serving.engine.priority import BATCH, REALTIME, check_priority


def _prompt(n: int, seed: int = 0) -> list[int]:
    return [(seed * 31 + i * 7) % 250 + 3 for i in range(n)]


def _params(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True)


def _add(engine: Engine, name: str, priority: str, *, tenant: str = "default", tokens: int = 8,
         prompt: int = 6, seed: int = 0) -> Sequence:  # fmt: skip
    return engine.add_request(_prompt(prompt, seed), _params(tokens), tenant=tenant,
                              request_id=name, priority=priority)  # fmt: skip


def _running(engine: Engine) -> set[str]:
    return {s.id for s in engine.running}


def test_priority_values_are_checked(tiny_model: LlamaModel) -> None:
    assert check_priority("batch") == BATCH
    engine = Engine(tiny_model)
    with pytest.raises(ValueError, match="priority must be one of realtime, batch"):
        _add(engine, "x", "urgent")
    assert not engine.has_work()
    assert engine.add_request(_prompt(4)).priority == REALTIME  # the default


def test_realtime_is_admitted_before_batch_that_waited_longer(tiny_model: LlamaModel) -> None:
    engine = Engine(tiny_model, max_num_seqs=1)
    b1, b2 = _add(engine, "b1", BATCH, tokens=3), _add(engine, "b2", BATCH, tokens=3)
    r1 = _add(engine, "r1", REALTIME, tokens=3)
    engine.step()
    assert _running(engine) == {"r1"}
    engine.run_until_done()
    assert r1.scheduled_at is not None and b1.scheduled_at is not None
    assert b2.scheduled_at is not None
    assert r1.scheduled_at < b1.scheduled_at < b2.scheduled_at  # batch keeps its own order


def test_a_realtime_arrival_takes_a_running_batch_sequences_slot_and_outputs_stay_exact(
    tiny_model: LlamaModel,
) -> None:
    engine = Engine(tiny_model, max_num_seqs=1)
    batch = _add(engine, "b", BATCH, tokens=12, seed=1)
    for _ in range(3):
        engine.step()
    assert _running(engine) == {"b"}
    realtime = _add(engine, "r", REALTIME, tokens=4, seed=2)
    engine.step()
    assert _running(engine) == {"r"} and batch.preempted == 1
    assert engine.metrics()["tenants"]["default"]["priority_preemptions"] == 1
    engine.run_until_done()
    reference = Engine(tiny_model).generate([_prompt(6, 1), _prompt(6, 2)], _params(12))
    assert batch.output_ids == reference[0].output_ids  # recomputed after its preemption
    assert realtime.output_ids == reference[1].output_ids[:4]


def test_without_realtime_work_a_realtime_arrival_waits_like_before(
    tiny_model: LlamaModel,
) -> None:
    """Two realtime sequences: no preemption for priority (arrival order, as ever)."""
    engine = Engine(tiny_model, max_num_seqs=1)
    first = _add(engine, "r0", REALTIME, tokens=5)
    engine.step()
    _add(engine, "r1", REALTIME, tokens=2)
    engine.step()
    assert _running(engine) == {"r0"} and first.preempted == 0


def test_when_blocks_run_out_batch_is_preempted_first_not_the_newest(
    tiny_model: LlamaModel,
) -> None:
    # Three 15-token prompts (a block each) growing to 55 tokens (4 blocks each): 7 blocks
    # run out at the third block. Without priority the newest (r_new) would go first.
    engine = Engine(tiny_model, num_blocks=7, block_size=16, max_num_seqs=4)
    r_old = _add(engine, "r_old", REALTIME, tokens=40, prompt=15, seed=1)
    batch = _add(engine, "b", BATCH, tokens=40, prompt=15, seed=2)
    r_new = _add(engine, "r_new", REALTIME, tokens=40, prompt=15, seed=3)
    engine.step()
    assert _running(engine) == {"r_old", "b", "r_new"}  # nothing else waits: batch runs too
    while not (r_old.preempted or batch.preempted or r_new.preempted):
        engine.step()
    assert (batch.preempted, r_old.preempted, r_new.preempted) == (1, 0, 0)
    engine.run_until_done()
    assert all(s.finish_reason == "length" for s in (r_old, batch, r_new))
    assert engine.pool.free_count() == 7


def test_batch_waits_at_most_the_bound_under_a_realtime_flood(tiny_model: LlamaModel) -> None:
    def admitted_after(bound_steps: int, give_up: int) -> tuple[int | None, Sequence]:
        engine = Engine(tiny_model, max_num_seqs=1)
        engine.batch_max_wait_steps, engine.batch_max_wait_s = bound_steps, 3600.0
        batch = _add(engine, "b", BATCH, tokens=3)
        flood = 0
        for step in range(1, give_up + 1):
            # Two realtime requests always waiting: without a bound, batch never runs.
            while sum(1 for s in engine.waiting if s.priority == REALTIME) < 2:
                _add(engine, f"r{flood}", REALTIME, tokens=2, seed=flood)
                flood += 1
            engine.step()
            if batch.scheduled_at is not None:
                return step, batch
        return None, batch

    starved, batch = admitted_after(bound_steps=10**6, give_up=120)
    assert starved is None and not batch.aged  # the flood starves batch without the bound
    step, batch = admitted_after(bound_steps=8, give_up=120)
    # Aged on its 8th waiting step, then it waits only for the realtime slot to free up
    # (2 tokens), ahead of every realtime request that came after it.
    assert step is not None and 8 <= step <= 8 + 2, step
    assert batch.aged and batch.preempted == 0


def test_aged_batch_is_not_preempted_for_priority(tiny_model: LlamaModel) -> None:
    engine = Engine(tiny_model, max_num_seqs=1)
    engine.batch_max_wait_s = 0.0  # ages on its first scheduling step
    batch = _add(engine, "b", BATCH, tokens=6)
    engine.step()
    assert batch.aged and _running(engine) == {"b"}
    _add(engine, "r", REALTIME, tokens=2)
    engine.step()
    assert _running(engine) == {"b"} and batch.preempted == 0
    assert engine.metrics()["tenants"]["default"]["batch_aged"] == 1


def test_shared_pool_realtime_first_across_tenants_within_their_limits(
    tiny_model: LlamaModel,
) -> None:
    engine = Engine(tiny_model, max_num_seqs=3, max_running={"a": 2, "b": 2})
    _add(engine, "rb0", REALTIME, tenant="b", tokens=30)
    engine.step()
    # A runs nothing, B one: fewest-running would pick A, but A's head is batch.
    _add(engine, "ba0", BATCH, tenant="a", tokens=30)
    _add(engine, "rb1", REALTIME, tenant="b", tokens=30)
    engine.step()
    assert _running(engine) == {"rb0", "rb1", "ba0"}  # B at its limit of 2; A gets the rest
    _add(engine, "rb2", REALTIME, tenant="b", tokens=2)
    engine.step()
    # B is at its limit and runs no batch of its own: its third realtime request waits, and
    # A's batch sequence keeps running (B may not take a neighbour's place beyond its share).
    assert "rb2" not in _running(engine) and "ba0" in _running(engine)


def test_shared_pool_realtime_takes_a_neighbours_batch_slot_only_down_to_an_equal_share(
    tiny_model: LlamaModel,
) -> None:
    engine = Engine(tiny_model, max_num_seqs=2, max_running={"a": 2, "b": 2})
    a0, a1 = (_add(engine, f"ba{i}", BATCH, tenant="a", tokens=40, seed=i) for i in range(2))
    engine.step()
    assert _running(engine) == {"ba0", "ba1"}
    _add(engine, "rb0", REALTIME, tenant="b", tokens=40)
    engine.step()
    assert _running(engine) == {"ba0", "rb0"} and a1.preempted == 1  # A's newest batch
    _add(engine, "rb1", REALTIME, tenant="b", tokens=40)
    engine.step()
    # A runs one, B one: B may not push A below its own count, however urgent.
    assert _running(engine) == {"ba0", "rb0"} and a0.preempted == 0
    assert engine.metrics()["tenants"]["a"]["priority_preemptions"] == 1


def test_a_tenant_at_its_share_makes_room_from_its_own_batch(tiny_model: LlamaModel) -> None:
    engine = Engine(tiny_model, max_num_seqs=4, max_running={"a": 1, "b": 1})
    own = _add(engine, "ba", BATCH, tenant="a", tokens=40)
    neighbour = _add(engine, "bb", BATCH, tenant="b", tokens=40)
    engine.step()
    _add(engine, "ra", REALTIME, tenant="a", tokens=40)
    engine.step()
    assert _running(engine) == {"ra", "bb"}
    assert own.preempted == 1 and neighbour.preempted == 0


def test_a_tenants_batch_queue_advances_one_promotion_per_bound(tiny_model: LlamaModel) -> None:
    """Under a realtime flood the batch queue still advances, one sequence per bound, and
    never more than one promoted sequence per tenant waits ahead of realtime work."""
    engine = Engine(tiny_model, max_num_seqs=1)
    engine.batch_max_wait_steps, engine.batch_max_wait_s = 5, 3600.0
    batch = [_add(engine, f"b{i}", BATCH, tokens=2, seed=i) for i in range(3)]
    admitted: dict[str, int] = {}
    flood = 0
    for step in range(1, 60):
        while sum(1 for s in engine.waiting if s.priority == REALTIME) < 2:
            _add(engine, f"r{flood}", REALTIME, tokens=2, seed=flood)
            flood += 1
        engine.step()
        assert sum(1 for s in engine.waiting if s.aged) <= 1
        admitted.update({s.id: step for s in batch if s.scheduled_at and s.id not in admitted})
        if len(admitted) == 3:
            break
    assert list(admitted) == ["b0", "b1", "b2"], admitted  # in their order, none starved
    steps = list(admitted.values())
    gaps = [later - earlier for earlier, later in zip(steps, steps[1:], strict=False)]
    assert min(gaps) >= 5, steps
    assert steps[-1] <= 3 * (5 + 2), steps  # each: the bound, then one realtime slot freeing
