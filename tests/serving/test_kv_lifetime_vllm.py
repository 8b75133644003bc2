"""KV cache lifetime on a real vLLM engine (CPU), in a version core as a shared pool runs it:
the tenant whose `kv_cache` turns prefix caching off gets a salt of its own per request, so
vLLM never finds one of its blocks again, while its neighbour's repeats still hit; the
integrity scan says it does not apply (no block pool of the portal's)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from serving.dataplane.vllm_version import VllmCore
from serving.engine.testing import VLLM_SHAPE, write_tiny_checkpoint

# vLLM and torch warn on import (deprecations of theirs); the replicas run them the same way.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
]

ENGINE = {"name": "vllm", "dtype": "float32", "max_model_len": 512, "cpu_kv_space_gib": 0.0625,
          "max_num_seqs": 4, "enable_prefix_caching": True}  # fmt: skip
PROMPT = "the quick brown fox jumps over the lazy dog " * 6  # several full blocks


def _request(tenant: str, n: int) -> dict[str, Any]:
    return {
        "tenant": tenant,
        "request_id": f"{tenant}-{n}",
        "prompt": PROMPT,
        "sampling": {"max_tokens": 2, "temperature": 0.0, "top_p": 1.0},
    }


@pytest.mark.timeout(300)
def test_a_pool_tenant_with_prefix_caching_off_never_hits_in_vllm(tmp_path: Path) -> None:
    directory = write_tiny_checkpoint(tmp_path / "ck", seed=5, **VLLM_SHAPE)

    async def run() -> tuple[dict[str, Any], dict[str, Any]]:
        core = VllmCore("platform.vllm.pool", "pool", dict(ENGINE))
        try:
            await core.reconfigure(
                {
                    "artifact": str(directory),
                    "version": "tiny:v1",
                    "kv_mode": "shared",
                    "tenants": {
                        "off": {"salt": "11" * 32, "kv_cache": {"prefix_caching": False}},
                        "on": {"salt": "22" * 32},
                    },
                    "telemetry": {},
                }
            )
            for n in range(3):
                for tenant in ("off", "on"):
                    answer = await core.complete(_request(tenant, n))
                    assert answer["usage"]["completion_tokens"] >= 1
            return core.engine.metrics(), core._kv_stats()
        finally:
            if core.engine is not None:
                core.engine.shutdown()

    metrics, kv = asyncio.run(run())
    tenants = metrics["tenants"]
    assert tenants["off"]["prefix_queries"] > 0 and tenants["off"]["prefix_hits"] == 0
    assert tenants["on"]["prefix_hits"] > 0  # its repeats still hit: the engine's cache is on
    assert kv["integrity"]["applies"] is False
