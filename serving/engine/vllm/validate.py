"""A checkpoint's validation for vLLM: its architecture against vLLM's model registry, then one
load in vLLM with a two-token greedy answer. Both run in a child process (`python -m
serving.engine.vllm.validate DIR`): vLLM's import and its engine's processes never live in the
validation worker, a hung load is killed at the timeout, and the child's memory goes with it.
Remote code is never trusted (`trust_remote_code=False`): a checkpoint's `auto_map` runs
nothing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from serving.engine.config import CheckpointError, human_bytes

TIMEOUT_ENV = "PORTAL_VLLM_VALIDATION_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 600.0
# The load's KV cache on a CPU: enough for the check, small beside the model.
CHECK_KV_BYTES = 64 << 20


def validate_for_vllm(
    directory: Path,
    raw: dict[str, Any],
    *,
    step: Callable[[str], float],
    done: Callable[[str, float], None],
    max_bytes: int | None = None,
    timeout_s: float | None = None,
) -> dict[str, Any]:
    """The two steps ("vllm architecture", "vllm load"); CheckpointError names the field.
    Returns what the load reported (seconds, the first tokens)."""
    from serving.engine.vllm import available

    step("vllm architecture")
    if not available():
        raise CheckpointError(
            "vLLM is not installed where versions are validated (pip install 'aiops-portal[vllm]')",
            field="engines",
        )
    archs = raw.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise CheckpointError("config.json names no architecture", field="architectures")
    weights = sum(p.stat().st_size for p in Path(directory).glob("*.safetensors"))
    if weights == 0:
        raise CheckpointError("no *.safetensors weights", field="weights")
    if max_bytes is not None and weights > max_bytes:
        raise CheckpointError(
            f"the weights are {human_bytes(weights)}, over the validation limit of "
            f"{human_bytes(max_bytes)}",
            field="weights",
        )
    timeout = timeout_s or float(os.environ.get(TIMEOUT_ENV) or DEFAULT_TIMEOUT_S)
    report = _run_child(Path(directory), timeout)
    if report.get("engine_died"):
        # vLLM's engine process died under the load (seen on a busy CPU machine), which says
        # nothing yet about the checkpoint: one more load, and its verdict stands.
        report = _run_child(Path(directory), timeout)
    if not report.get("supported"):
        raise CheckpointError(
            f"vLLM does not support the architecture {archs[0][:100]}", field="architectures"
        )
    # One child did both: each step gets the seconds the child measured for it.
    done("vllm architecture", time.perf_counter() - float(report.get("registry_s", 0)))
    step("vllm load")
    if report.get("error"):
        raise CheckpointError(f"vLLM could not load it: {report['error']}", field="engines")
    done("vllm load", time.perf_counter() - float(report.get("seconds", 0)))
    return report


def _run_child(directory: Path, timeout: float) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    env["TOKENIZERS_PARALLELISM"] = "false"
    try:
        proc = subprocess.run(  # noqa: S603 (this module, on a path the registry stored)
            [sys.executable, "-m", "serving.engine.vllm.validate", str(directory)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise CheckpointError(
            f"vLLM did not load it within {timeout:g} s", field="engines"
        ) from None
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            try:
                report = dict(json.loads(line))
            except ValueError:
                break
            if report.get("engine_died"):  # the engine's own reason, from its process's lines
                said = [
                    ln.strip()
                    for ln in (proc.stderr or "").splitlines()
                    if ENGINE_REASON.search(ln)
                ]
                if said:
                    report["error"] = f"{report.get('error')} ({said[-1][:300]})"
            return report
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
    raise CheckpointError(
        f"the vLLM check ended with code {proc.returncode}: {tail[0][:300]}", field="engines"
    )


def _child(directory: str) -> dict[str, Any]:
    """In the child: the registry check, then one load and a two-token greedy answer."""
    began = time.perf_counter()
    from vllm.model_executor.models import ModelRegistry

    raw = json.loads((Path(directory) / "config.json").read_text())
    arch = raw["architectures"][0]
    registry_s = round(time.perf_counter() - began, 2)
    if arch not in set(ModelRegistry.get_supported_archs()):
        return {"supported": False, "registry_s": registry_s}
    import torch
    from vllm import LLM, SamplingParams

    memory: dict[str, Any] = {}
    if not torch.cuda.is_available():
        memory["kv_cache_memory_bytes"] = CHECK_KV_BYTES
        # The checkpoint's own precision, not vLLM's CPU default (bfloat16): its bfloat16
        # kernels use AMX where the CPU reports it, and on a VM whose AMX state is not kept
        # (seen on the CI machines) the engine's worker dies of SIGILL, which says nothing
        # about the checkpoint. A deployment still picks its own dtype.
        memory["dtype"] = "float32"

    started = time.perf_counter()
    try:
        llm = LLM(
            model=directory,
            tokenizer=directory,
            trust_remote_code=False,
            enforce_eager=True,
            max_model_len=min(256, int(raw.get("max_position_embeddings") or 256)),
            max_num_seqs=1,
            seed=0,
            **memory,
        )
        out = llm.generate(
            {"prompt_token_ids": [1, 2, 3]}, SamplingParams(max_tokens=2, temperature=0)
        )
        tokens = list(out[0].outputs[0].token_ids)
    except Exception as exc:  # the reason goes back to the registry
        import traceback

        traceback.print_exc()
        died = type(exc).__name__ == "EngineDeadError"
        return {
            "supported": True,
            "registry_s": registry_s,
            "error": _reason(exc),
            "engine_died": died,
        }
    return {
        "supported": True,
        "registry_s": registry_s,
        "seconds": round(time.perf_counter() - started, 2),
        "tokens": tokens,
    }


# A line of vLLM's engine processes that names why the engine died (its traceback's last
# lines, prefixed with the process): the load check and the test suite's reports quote it.
ENGINE_REASON = re.compile(r"(EngineCore|Worker).*(Error|Exception|Killed|signal|Segmentation)")


def _reason(exc: BaseException) -> str:
    """The first meaningful line (pydantic's errors end with a link, not the reason)."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith("For further information")]
    return (lines[-1] if lines else type(exc).__name__)[:300]


if __name__ == "__main__":
    print(json.dumps(_child(sys.argv[1])), flush=True)
