"""The engine behind its background thread, as replicas use it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from serving.engine.async_engine import AsyncEngine
from serving.engine.engine import Engine, SamplingParams
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
