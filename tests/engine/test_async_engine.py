"""The engine behind its background thread, as replicas use it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from serving.engine.async_engine import AsyncEngine
from serving.engine.engine import DuplicateRequest, Engine, SamplingParams
from serving.engine.model import LlamaModel
from serving.engine.testing import write_tiny_checkpoint
from tests.engine.conftest import load_model

PARAMS = SamplingParams(max_tokens=12, ignore_eos=True)


async def _collect(engine: AsyncEngine, prompt: list[int], rid: str) -> list[int]:
    return [e.token_id async for e in engine.generate(prompt, PARAMS, tenant="t", request_id=rid)]


def test_concurrent_requests_match_the_synchronous_engine(tiny_model: LlamaModel) -> None:
    prompts = [[5, 6, 7] * 5, [9] * 30, [40, 41]]
    expected = [s.output_ids for s in Engine(tiny_model).generate(prompts, PARAMS, tenant="t")]
    engine = AsyncEngine(Engine(tiny_model, num_blocks=64))

    async def main() -> list[list[int]]:
        return list(
            await asyncio.gather(*(_collect(engine, p, f"r{i}") for i, p in enumerate(prompts)))
        )

    try:
        assert asyncio.run(main()) == expected
        assert engine.metrics()["running"] == 0
        assert engine.metrics()["free_blocks"] == 64
    finally:
        engine.stop()


def test_swap_during_traffic_never_mixes_weights(tiny_model: LlamaModel, tmp_path: Path) -> None:
    new_model = load_model(write_tiny_checkpoint(tmp_path / "v2", seed=5), fingerprint="v2")
    prompt = [7, 8, 9, 10] * 4
    old_out = Engine(tiny_model).generate([prompt], PARAMS)[0].output_ids
    new_out = Engine(new_model).generate([prompt], PARAMS)[0].output_ids
    engine = AsyncEngine(Engine(tiny_model, num_blocks=128))

    async def main() -> list[list[int]]:
        tasks = [asyncio.create_task(_collect(engine, prompt, f"a{i}")) for i in range(4)]
        await asyncio.sleep(0.005)
        engine.swap_model(new_model)
        tasks += [asyncio.create_task(_collect(engine, prompt, f"b{i}")) for i in range(4)]
        return list(await asyncio.gather(*tasks))

    try:
        results = asyncio.run(main())
    finally:
        engine.stop()
    assert all(r in (old_out, new_out) for r in results)  # each request on one set of weights
    assert all(r == new_out for r in results[4:])


def test_a_cancelled_request_frees_its_blocks(tiny_model: LlamaModel) -> None:
    engine = AsyncEngine(Engine(tiny_model, num_blocks=32))
    long = SamplingParams(max_tokens=200, ignore_eos=True)

    async def main() -> None:
        stream = engine.generate([3] * 20, long, tenant="t", request_id="gone")
        await stream.__anext__()
        await stream.aclose()  # the client went away

    try:
        asyncio.run(main())
        assert engine.metrics()["running"] == 0
        assert engine.metrics()["free_blocks"] == 32
    finally:
        engine.stop()


def test_another_tenant_reusing_a_request_id_reaches_nothing_of_the_first(
    tiny_model: LlamaModel,
) -> None:
    """B sends A's request id while A's request runs: both are served, and B going away
    neither cancels A's sequence nor steals its tokens."""
    long = SamplingParams(max_tokens=24, ignore_eos=True)
    prompt = [5, 6, 7, 8] * 3
    expected = Engine(tiny_model).generate([prompt], long, tenant="a")[0].output_ids
    engine = AsyncEngine(Engine(tiny_model, num_blocks=64))

    async def tenant_a(started: asyncio.Event, b_left: asyncio.Event) -> list[int]:
        out = []
        async for event in engine.generate(prompt, long, tenant="a", request_id="shared-id"):
            out.append(event.token_id)
            if len(out) == 1:
                started.set()
                await b_left.wait()
        return out

    async def tenant_b(started: asyncio.Event, b_left: asyncio.Event) -> int:
        await started.wait()
        stream = engine.generate([9, 9, 9], long, tenant="b", request_id="shared-id")
        first = await stream.__anext__()  # its own token, not one of A's
        await stream.aclose()  # B goes away: its own sequence is aborted, A's is not
        b_left.set()
        return first.token_id

    async def main() -> tuple[list[int], int]:
        started, b_left = asyncio.Event(), asyncio.Event()
        a, b = await asyncio.wait_for(
            asyncio.gather(tenant_a(started, b_left), tenant_b(started, b_left)), timeout=30
        )
        return a, b

    try:
        a_tokens, b_first = asyncio.run(main())
        assert a_tokens == expected  # every token of A's, none lost to B
        assert b_first == Engine(tiny_model).generate([[9, 9, 9]], long)[0].output_ids[0]
        assert engine.metrics()["free_blocks"] == 64
    finally:
        engine.stop()


def test_a_tenant_reusing_its_own_live_request_id_is_refused(tiny_model: LlamaModel) -> None:
    long = SamplingParams(max_tokens=16, ignore_eos=True)
    engine = AsyncEngine(Engine(tiny_model, num_blocks=64))

    async def main() -> list[int]:
        first = engine.submit([3, 4, 5], long, tenant="a", request_id="dup")
        try:
            with pytest.raises(DuplicateRequest):
                engine.submit([3, 4, 5], long, tenant="a", request_id="dup")
            return [event.token_id async for event in first]  # the first is untouched
        finally:
            first.close()

    try:
        assert len(asyncio.run(main())) == 16
        assert engine.metrics()["running"] == 0
    finally:
        engine.stop()


def test_a_submission_closed_before_it_is_read_frees_its_sequence(
    tiny_model: LlamaModel,
) -> None:
    engine = AsyncEngine(Engine(tiny_model, num_blocks=32))

    async def main() -> None:
        submission = engine.submit(
            [3] * 20, SamplingParams(max_tokens=200, ignore_eos=True), tenant="t",
            request_id="never-read",
        )  # fmt: skip
        submission.close()  # the client left before the first token was awaited
        submission.close()  # idempotent

    try:
        asyncio.run(main())
        assert engine.metrics()["running"] == 0 and engine.metrics()["waiting"] == 0
        assert engine.metrics()["free_blocks"] == 32
        assert engine.engine.sequences == {}
    finally:
        engine.stop()


def test_a_caller_waits_at_most_the_step_in_progress(tiny_model: LlamaModel) -> None:
    """Submitting or reading metrics (the replica's event loop) takes the engine lock between
    two steps: it waits for the step in progress only, never for the engine to run dry. With a
    plain lock the stepping thread took it back at once, and the replica's event loop (every
    answer, a realtime request's too) waited for the whole flood."""
    inner = Engine(tiny_model, num_blocks=256)
    steps = 0
    step = inner.step

    def counted() -> Any:
        nonlocal steps
        steps += 1
        spin_until = time.perf_counter() + 0.002
        while time.perf_counter() < spin_until:
            pass  # a step that holds the interpreter, as a loaded replica's do
        return step()

    inner.step = counted  # type: ignore[method-assign]
    engine = AsyncEngine(inner)
    long = SamplingParams(max_tokens=400, ignore_eos=True)

    async def main() -> list[int]:
        flood = [engine.submit([5, 6, 7, 8] * 4, long, tenant="t", request_id=f"f{i}")
                 for i in range(8)]  # fmt: skip
        while steps < 5:
            await asyncio.sleep(0.001)
        waited = []
        for _ in range(20):
            before = steps
            assert engine.metrics()["running"] == 8
            waited.append(steps - before)
            await asyncio.sleep(0)
        for submission in flood:
            async for _ in submission:
                pass
        return waited

    try:
        waited = asyncio.run(main())
    finally:
        engine.stop()
    assert max(waited) <= 1, waited  # the step in progress, then the caller's turn
    assert engine.metrics()["running"] == 0  # and the callers never stalled the steps
