"""The request inspector's prefix-hit count from a real vLLM engine (CPU, a tiny checkpoint),
in a version core as a replica runs it: vLLM's per-request `num_cached_tokens` reaches the
answer (and a stream's end event), so the router's lifecycle carries it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from serving.dataplane.lifecycle import Lifecycle
from serving.engine.testing import VLLM_SHAPE, write_tiny_checkpoint

# vLLM and torch warn on import (deprecations of theirs); the replicas run them the same way.
pytestmark = [
    pytest.mark.slow,  # vLLM's engine core and worker processes
    pytest.mark.vllm,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
]

ENGINE = {"name": "vllm", "dtype": "float32", "max_model_len": 512, "cpu_kv_space_gib": 0.0625,
          "max_num_seqs": 4, "enable_prefix_caching": True}  # fmt: skip
PROMPT = "the quick brown fox jumps over the lazy dog " * 6  # several full blocks


def _request(n: int) -> dict[str, Any]:
    return {
        "tenant": "t",
        "request_id": f"r-{n}",
        "prompt": PROMPT,
        "sampling": {"max_tokens": 2, "temperature": 0.0, "top_p": 1.0},
    }


@pytest.mark.timeout(300)
def test_vllm_reports_each_requests_prefix_hits(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    from serving.dataplane.vllm_version import VllmCore

    directory = write_tiny_checkpoint(tmp_path / "ck", seed=5, **VLLM_SHAPE)

    async def run() -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
        core = VllmCore("acme.chat", "stable", dict(ENGINE))
        try:
            await core.reconfigure(
                {"artifact": str(directory), "version": "tiny:v1",
                 "tenants": {"t": {"salt": "22" * 32}}, "telemetry": {}}
            )  # fmt: skip
            first = await core.complete(_request(1))
            again = await core.complete(_request(2))
            events = [event async for event in core.generate(_request(3))]
            return first, again, events
        finally:
            if core.engine is not None:
                core.engine.shutdown()

    first, again, events = asyncio.run(run())
    assert first["prefix_hit_tokens"] == 0
    assert again["prefix_hit_tokens"] > 0 and again["version"] == "tiny:v1"
    end = events[-1]
    assert end["type"] == "end" and end["prefix_hit_tokens"] > 0
    life = Lifecycle("r-3")
    life.answered(events[0])  # the start event: who answered
    life.answered(end)
    assert life.prefix_hit_tokens == end["prefix_hit_tokens"] and life.version == "tiny:v1"
    assert life.completion_tokens == end["usage"]["completion_tokens"]
