"""vLLM's own priority scheduling behind the built-in engine's interface: a replica's vLLM runs
the "priority" policy, and a realtime request sent after a queue of batch ones gets its first
token before them (vLLM in this process, CPU build, a tiny checkpoint it can run)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from serving.engine.priority import BATCH, REALTIME
from serving.engine.scheduler import SamplingParams
from serving.engine.testing import write_tiny_checkpoint

pytestmark = [
    pytest.mark.slow,  # vLLM's engine core and worker processes (~30 s)
    pytest.mark.vllm,
    # vLLM's import uses torch APIs torch deprecates; elsewhere it is imported only in replicas.
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]


def test_vllm_serves_a_realtime_request_before_queued_batch_ones(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    from serving.engine.vllm.runtime import VllmEngine

    # vLLM's CPU attention needs head_dim 64 (the default tiny checkpoint has 16).
    directory = write_tiny_checkpoint(tmp_path / "tiny", hidden_size=128,
                                      num_attention_heads=2, num_key_value_heads=1)  # fmt: skip
    first_token: dict[str, float] = {}

    async def scenario() -> str:
        engine = VllmEngine(
            directory,  # float32: vLLM's CPU bfloat16 kernels die of SIGILL on some VMs' AMX
            {"max_num_seqs": 2, "cpu_kv_space_gib": 0.25, "max_model_len": 512, "dtype": "float32"},
        )
        try:
            policy = str(engine.llm.vllm_config.scheduler_config.policy)

            async def one(name: str, priority: str) -> None:
                stream = engine.submit([5, 6, 7, 8], SamplingParams(max_tokens=48, ignore_eos=True),
                                       tenant="t", request_id=name, cache_salt=b"salt",
                                       priority=priority)  # fmt: skip
                try:
                    async for _ in stream:
                        first_token.setdefault(name, time.monotonic())
                finally:
                    stream.close()

            tasks = [asyncio.create_task(one(f"b{i}", BATCH)) for i in range(6)]
            await asyncio.sleep(0.05)  # the batch requests are queued first
            tasks.append(asyncio.create_task(one("r", REALTIME)))
            await asyncio.gather(*tasks)
            return policy
        finally:
            engine.shutdown()

    assert asyncio.run(scenario()) == "priority"
    order = sorted(first_token, key=first_token.__getitem__)
    # Two run at once: the first two batch requests were running; the realtime one goes next,
    # ahead of the four batch requests that queued before it (arrival order would put it last).
    assert order.index("r") <= 2, order
    assert set(order) == {"r", *(f"b{i}" for i in range(6))}
