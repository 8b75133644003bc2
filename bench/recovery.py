"""Benchmark: recovery time of a version slot with the standby copy vs a reload from disk.

Seed 000 §3.3 keeps an INT4 snapshot beside the FP16 backbone and recovers in 4.3 ms instead of
12.7 ms. Here: two version slots (serving.dataplane.version.VersionCore, the code a replica
runs), each with two versions of one random checkpoint loaded once (A, then B). Each run rolls
back to A and forward to B again, timing `reconfigure` until the new weights serve, then one
greedy answer. Three slots: one keeps the last good weights in memory as they are
(serving.dataplane.standby, `standby_precision: same`), one keeps a float16 copy and casts it
back to the engine's float32 on restore (`standby_precision: float16`), and the baseline slot
has no standby copy and reads, builds and test-runs the checkpoint from disk. They alternate,
run by run. Also the memory each standby copy holds, measured on what it holds, and whether the
float16 restore answers the same greedy tokens as the weights loaded from disk.

    python -m bench recovery [--quick] [--model tiny|small] [--runs 20] [--json PATH]

Writes bench/results/recovery.json. Target: the standby swap is at least 2x faster.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

from bench.engine import MODELS  # noqa: E402
from bench.harness.report import print_table, results_path, write_results  # noqa: E402
from bench.harness.stats import p50_p99, ratio  # noqa: E402
from serving.dataplane.standby import Standby, tensor_bytes  # noqa: E402
from serving.dataplane.version import VersionCore  # noqa: E402
from serving.engine.testing import write_tiny_checkpoint  # noqa: E402

TARGET_SPEEDUP = 2.0
SEED_MS = {"standby": 4.3, "reload": 12.7}  # seed 000 §3.3 (INT4 snapshot vs reload, GPU)
TENANT = "7"


def _slot_config(directory: Path, version: str) -> dict[str, Any]:
    return {
        "version": version,
        "artifact": str(directory),
        "tenants": {TENANT: {"salt": "ab" * 32}},
    }


async def _answer(core: VersionCore, n: int) -> str:
    request = {
        "request_id": f"bench-{n}",
        "tenant": TENANT,
        "prompt": "Recover quickly",
        "sampling": {"max_tokens": 2, "temperature": 0, "top_p": 1.0},
    }
    return str((await core.complete(request))["version"])


async def _switch(core: VersionCore, config: dict[str, Any], n: int) -> tuple[float, float]:
    """(ms until the new weights serve, ms until the first answer from them)."""
    started = time.perf_counter()
    await core.reconfigure(config)
    swapped = time.perf_counter()
    served = await _answer(core, n)
    if served != config["version"]:
        raise SystemExit(f"expected {config['version']} to answer, got {served}")
    return (swapped - started) * 1000, (time.perf_counter() - started) * 1000


SIDES = ("standby", "standby_fp16", "disk")


async def _tokens(core: VersionCore, n: int) -> str:
    request = {
        "request_id": f"bench-tokens-{n}",
        "tenant": TENANT,
        "prompt": "Recover quickly and say the same thing",
        "sampling": {"max_tokens": 16, "temperature": 0, "top_p": 1.0},
    }
    return str((await core.complete(request))["text"])


async def _run(a: dict[str, Any], b: dict[str, Any], runs: int) -> dict[str, Any]:
    cores = {name: VersionCore("bench", "stable", {"num_blocks": 64}) for name in SIDES}
    cores["disk"].standby = Standby(enabled=False)
    half = {"standby_precision": "float16"}
    configs = {
        name: ({**a, **half}, {**b, **half}) if name == "standby_fp16" else (a, b) for name in SIDES
    }
    swap: dict[str, list[float]] = {name: [] for name in SIDES}
    answer: dict[str, list[float]] = {name: [] for name in SIDES}
    try:
        for name, core in cores.items():
            await core.reconfigure(configs[name][0])
            await core.reconfigure(configs[name][1])
        n = 0
        for _ in range(runs):
            for index in (0, 1):  # roll back to A, forward to B
                for name, core in cores.items():  # alternate the sides
                    n += 1
                    swapped, answered = await _switch(core, configs[name][index], n)
                    swap[name].append(swapped)
                    answer[name].append(answered)
        if any(cores[s].standby.disk_loads != 2 for s in ("standby", "standby_fp16")) or (
            cores["disk"].standby.restores != 0
        ):
            raise SystemExit("a standby side read from disk, or the baseline did not")
        # B serves everywhere, A is held: the float16 side's copy of A is what it holds.
        memory = {
            "standby_bytes": cores["standby"].standby.bytes,
            "standby_fp16_bytes": cores["standby_fp16"].standby.bytes,
            "model_bytes": tensor_bytes(cores["standby"].engine.engine.model),
        }
        # Roll back once more: do the float16 restore's greedy tokens match a disk load's?
        for name in SIDES:
            await cores[name].reconfigure(configs[name][0])
        texts = {name: await _tokens(cores[name], i) for i, name in enumerate(SIDES)}
        memory["fp16_same_greedy_tokens"] = texts["standby_fp16"] == texts["disk"]
    finally:
        for core in cores.values():
            core.chaos.close()
            if core.engine is not None:
                core.engine.stop()
    return {"swap": swap, "answer": answer, "memory": memory}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="small")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="--model tiny --runs 3")
    parser.add_argument("--output", type=Path, help="default bench/results/recovery.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.runs = "tiny", 3
    args.output = args.output or results_path("recovery")
    with tempfile.TemporaryDirectory() as tmp:
        spec = MODELS[args.model]
        a = _slot_config(write_tiny_checkpoint(Path(tmp) / "a", seed=1, **spec), "A")
        b = _slot_config(write_tiny_checkpoint(Path(tmp) / "b", seed=2, **spec), "B")
        measured = asyncio.run(_run(a, b, args.runs))
    swap = {k: p50_p99(v) for k, v in measured["swap"].items()}
    answer = {k: p50_p99(v) for k, v in measured["answer"].items()}
    speedup = ratio(swap["disk"]["p50"], swap["standby"]["p50"])
    fp16_speedup = ratio(swap["disk"]["p50"], swap["standby_fp16"]["p50"])
    memory = measured["memory"]
    result = {
        "benchmark": "recovery",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "quick": args.quick,
        "model": {"name": args.model, **spec, "bytes": memory["model_bytes"]},
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },
        "runs": args.runs,
        "switches_per_side": len(measured["swap"]["standby"]),
        "swap_ms": swap,
        "first_answer_ms": answer,
        "speedup_p50": speedup,
        "fp16_speedup_p50": fp16_speedup,
        "fp16_memory_ratio": ratio(memory["standby_fp16_bytes"], memory["standby_bytes"]),
        "answer_speedup_p50": ratio(answer["disk"]["p50"], answer["standby"]["p50"]),
        "memory": memory,
        "seed_ms": SEED_MS,
        "seed_speedup": ratio(SEED_MS["reload"], SEED_MS["standby"]),
        "target_speedup": TARGET_SPEEDUP,
        "ok": speedup >= TARGET_SPEEDUP and fp16_speedup >= TARGET_SPEEDUP,
    }
    print(f"\n  model: {args.model}, {memory['model_bytes'] / 1e6:.2f} MB of weights, CPU\n")
    rows = [
        (name, f"{swap[name]['p50']:.2f}", f"{swap[name]['p99']:.2f}", f"{answer[name]['p50']:.2f}")
        for name in SIDES
    ]
    header = ("recovery from", "swap p50 ms", "swap p99 ms", "first answer p50 ms")
    print_table(rows, header=header)
    print(
        f"\n  standby vs disk: {speedup:.1f}x, float16 standby vs disk: {fp16_speedup:.1f}x "
        f"(seed: {result['seed_speedup']:.1f}x, {SEED_MS['standby']} vs {SEED_MS['reload']} ms);"
        f" standby holds {memory['standby_bytes'] / 1e6:.2f} MB, float16 standby "
        f"{memory['standby_fp16_bytes'] / 1e6:.2f} MB; float16 restore answers the disk load's "
        f"greedy tokens: {memory['fp16_same_greedy_tokens']}\n"
    )
    write_results("recovery", result, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
