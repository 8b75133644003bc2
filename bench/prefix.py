"""Benchmark: time to first token with a 512-token cached prefix vs cold, salted vs unsalted.

Same process, same engine and model (a random checkpoint built on the fly). Each sample is
one request alone on the engine, timed from `add_request` to its first token:

* cold: a prompt of 512 + 16 tokens whose prefix is not cached (fresh prefix every time);
* warm: the same 512-token prefix as a request before it, a new 16-token suffix;
* salted vs unsalted: the warm and cold runs with the per-tenant salt (the default) and
  without, interleaved; the salt costs one HMAC per request.

    python -m bench prefix [--quick] [--model tiny|small] [--samples 60]

Writes bench/results/prefix-<model>.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.engine import MODELS  # noqa: E402
from bench.harness.report import results_path, write_results  # noqa: E402
from bench.harness.stats import median, ratio  # noqa: E402
from serving.engine.checkpoint import load_tensors  # noqa: E402
from serving.engine.config import read_config  # noqa: E402
from serving.engine.engine import Engine, SamplingParams, tenant_cache_salt  # noqa: E402
from serving.engine.model import LlamaModel  # noqa: E402
from serving.engine.testing import write_tiny_checkpoint  # noqa: E402

PREFIX, SUFFIX = 512, 16
FIRST = SamplingParams(max_tokens=1, ignore_eos=True)


def ttft(engine: Engine, prompt: list[int], *, salted: bool) -> tuple[float, int]:
    started = time.perf_counter()
    seq = engine.add_request(prompt, FIRST, tenant="bench", salted=salted)
    while seq.first_token_at is None:
        engine.step()
    return time.perf_counter() - started, seq.cached_tokens


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="tiny")
    parser.add_argument("--samples", type=int, default=60)
    parser.add_argument("--quick", action="store_true", help="--samples 8, fewer HMACs")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    if args.quick:
        args.samples = 8
    output = args.output or results_path(f"prefix-{args.model}")

    with tempfile.TemporaryDirectory() as tmp:
        directory = write_tiny_checkpoint(Path(tmp) / "m", seed=0, **MODELS[args.model])
        config = read_config(directory)
        model = LlamaModel(config, load_tensors(directory, config), fingerprint="bench")
    vocab = config.vocab_size - 3
    blocks = 4 * (PREFIX + SUFFIX) // 16 + 64  # room for a few prompts at once
    engine = Engine(model, num_blocks=blocks, cache_secret=b"bench-secret")
    counter = iter(range(10**9))

    def fresh(length: int) -> list[int]:
        base = next(counter) * 7919
        return [(base + 31 * i) % vocab + 3 for i in range(length)]

    samples: dict[str, list[float]] = {
        k: [] for k in ("cold", "warm", "cold_unsalted", "warm_unsalted")
    }
    hits: dict[str, set[int]] = {k: set() for k in samples}
    for warmup in range(3 + args.samples):
        for salted in (True, False):
            suffix = "" if salted else "_unsalted"
            prefix = fresh(PREFIX)
            cold_t, cold_hit = ttft(engine, prefix + fresh(SUFFIX), salted=salted)
            warm_t, warm_hit = ttft(engine, prefix + fresh(SUFFIX), salted=salted)
            if warmup >= 3:
                samples["cold" + suffix].append(cold_t)
                samples["warm" + suffix].append(warm_t)
                hits["cold" + suffix].add(cold_hit)
                hits["warm" + suffix].add(warm_hit)
    medians = {k: float(median(v)) for k, v in samples.items()}
    if hits["warm"] != {PREFIX} or hits["cold"] != {0}:
        raise SystemExit(f"unexpected prefix hits: {hits}")

    # The salt itself, measured directly: the HMAC each request pays.
    n = 2000 if args.quick else 20000
    started = time.perf_counter()
    for i in range(n):
        tenant_cache_salt(b"bench-secret", f"tenant-{i % 50}")
    salt_s = (time.perf_counter() - started) / n

    speedup = medians["cold"] / medians["warm"]
    salt_ab = (medians["warm"] - medians["warm_unsalted"]) / medians["warm_unsalted"]
    salt_direct = salt_s / medians["warm"]
    result = {
        "benchmark": "prefix",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "model": {"name": args.model, "parameters": config.parameter_count()},
        "prefix_tokens": PREFIX,
        "suffix_tokens": SUFFIX,
        "samples": args.samples,
        "quick": args.quick,
        "median_ttft_ms": {k: round(v * 1000, 3) for k, v in medians.items()},
        "warm_vs_cold_speedup": ratio(medians["cold"], medians["warm"], 2),
        "salt_cost_ab": round(salt_ab, 4),
        "salt_cost_direct": round(salt_direct, 5),
        "targets": {"speedup": 3.0, "salt_cost": 0.01},
        "ok": speedup >= 3.0 and salt_direct < 0.01,
    }
    print(f"\n  model {args.model}: {config.parameter_count() / 1e6:.1f}M parameters, CPU")
    for key, value in result["median_ttft_ms"].items():
        print(f"  median TTFT {key:<14} {value:8.3f} ms")
    print(f"\n  cached prefix speed-up: {speedup:.2f}x (target >= 3x)")
    print(f"  salt cost, HMAC per request / warm TTFT: {salt_direct * 100:.3f}% (target < 1%)")
    print(f"  salt cost, salted vs unsalted warm TTFT (A/B, noisy): {salt_ab * 100:+.2f}%\n")
    write_results("prefix", result, output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
