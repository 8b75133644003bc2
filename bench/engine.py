"""Benchmark: tokens/s of the built-in engine vs transformers `generate` on the same model.

Same process, same random checkpoint (built on the fly, nothing downloaded), same prompts,
greedy decoding of a fixed number of new tokens, CPU, batch 1 and 8. Runs alternate A/B and
the best of the repeats is kept for each side. Checks the greedy outputs are identical first.

    python -m bench engine [--quick] [--model tiny|small] [--new-tokens 128] [--repeats 5]

Writes bench/results/engine-<model>.json.
"""

from __future__ import annotations

import argparse
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

from bench.harness.report import print_table, results_path, write_results  # noqa: E402
from bench.harness.stats import ratio  # noqa: E402
from serving.engine.checkpoint import load_tensors  # noqa: E402
from serving.engine.config import read_config  # noqa: E402
from serving.engine.engine import Engine, SamplingParams  # noqa: E402
from serving.engine.model import LlamaModel  # noqa: E402
from serving.engine.testing import write_tiny_checkpoint  # noqa: E402

TARGET_BATCH8 = 1.5
MODELS: dict[str, dict[str, Any]] = {
    # The test suite's checkpoint (0.1M parameters): per-step overhead dominates.
    "tiny": {"vocab_size": 320},
    # ~5M parameters: the matmuls are real work on a CPU, so both sides converge.
    "small": {
        "hidden_size": 256,
        "intermediate_size": 688,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "vocab_size": 4096,
        "max_position_embeddings": 2048,
    },
}


def prompts(batch: int, length: int, vocab: int) -> list[list[int]]:
    return [[(7 * i + 13 * b) % (vocab - 3) + 3 for i in range(length)] for b in range(batch)]


def run_ours(model: LlamaModel, batch: list[list[int]], new_tokens: int) -> tuple[float, Any]:
    engine = Engine(model, num_blocks=512, max_num_seqs=64)
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    started = time.perf_counter()
    seqs = engine.generate(batch, params)
    return time.perf_counter() - started, [s.output_ids for s in seqs]


def run_hf(hf: Any, batch: list[list[int]], new_tokens: int) -> tuple[float, Any]:
    ids = torch.tensor(batch)
    started = time.perf_counter()
    with torch.inference_mode():
        out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return time.perf_counter() - started, out[:, ids.shape[1] :].tolist()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="tiny")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--quick", action="store_true", help="--new-tokens 16 --prompt-tokens 16 --repeats 1"
    )
    parser.add_argument("--output", type=Path, help="default bench/results/engine-<model>.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.new_tokens, args.prompt_tokens, args.repeats = 16, 16, 1
    args.output = args.output or results_path(f"engine-{args.model}")

    import transformers

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        spec = MODELS[args.model]
        directory = write_tiny_checkpoint(Path(tmp) / "bench-model", seed=0, **spec)
        config = read_config(directory)
        model = LlamaModel(config, load_tensors(directory, config))
        hf = transformers.LlamaForCausalLM.from_pretrained(directory, dtype=torch.float32)
        hf.eval()
    rows = []
    for batch_size in (1, 8):
        batch = prompts(batch_size, args.prompt_tokens, config.vocab_size)
        # Warm up both and check they agree token for token.
        _, ours_out = run_ours(model, batch, 8)
        _, hf_out = run_hf(hf, batch, 8)
        if ours_out != hf_out:
            raise SystemExit(f"outputs differ at batch {batch_size}: {ours_out} vs {hf_out}")
        ours_t, hf_t = [], []
        for _ in range(args.repeats):
            ours_t.append(run_ours(model, batch, args.new_tokens)[0])
            hf_t.append(run_hf(hf, batch, args.new_tokens)[0])
        tokens = batch_size * args.new_tokens
        ours_tps, hf_tps = tokens / min(ours_t), tokens / min(hf_t)
        rows.append(
            {
                "batch": batch_size,
                "new_tokens": args.new_tokens,
                "prompt_tokens": args.prompt_tokens,
                "ours_tokens_per_s": round(ours_tps, 1),
                "transformers_tokens_per_s": round(hf_tps, 1),
                "ratio": ratio(ours_tps, hf_tps),
            }
        )
    result = {
        "benchmark": "engine",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "quick": args.quick,
        "model": {"name": args.model, **spec, "parameters": config.parameter_count()},
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "threads": torch.get_num_threads(),
        },
        "rows": rows,
        "target_batch8": TARGET_BATCH8,
        "ok": rows[-1]["ratio"] >= TARGET_BATCH8,
    }
    print(f"\n  model: {config.parameter_count() / 1e6:.1f}M parameters, CPU, greedy\n")
    print_table(
        [
            (r["batch"], f"{r['ours_tokens_per_s']:.1f}", f"{r['transformers_tokens_per_s']:.1f}",
             f"{r['ratio']:.2f}x")
            for r in rows
        ],
        header=("batch", "ours tok/s", "hf tok/s", "ratio"),
    )  # fmt: skip
    verdict = "OK" if result["ok"] else "BELOW TARGET"
    print(f"\n  batch 8 target >= {TARGET_BATCH8}x: {verdict}\n")
    write_results("engine", result, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
