"""Benchmark: realtime latency under a batch flood, with priority classes vs without.

Same process, same engine and model (a random checkpoint built on the fly), the same arrival
script run twice: a flood of batch requests that keeps `--flood` of them waiting at all times,
and a realtime request every `--every` engine steps. Once with the batch requests submitted at
priority "batch" (serving.engine.priority), once with every request "realtime" (the engine as
it was: arrival order). Figures:

* realtime time to first token (p50 / p99, ms and engine steps) and its ratio with / without;
* batch's worst wait from arrival to its first admission, in engine steps, beside the
  starvation bound (`batch_max_wait_steps`): the tenant's oldest waiting batch request is
  promoted to realtime rank after the bound, one at a time, so the batch queue advances at
  least one request per bound under any realtime load (`batch_aged`: promotions);
  `starved` counts batch requests that never ran (must be 0).

    python -m bench priority [--quick] [--model tiny|small] [--realtime 60] [--flood 12]

Writes bench/results/priority-<model>.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.engine import MODELS  # noqa: E402
from bench.harness.report import results_path, write_results  # noqa: E402
from bench.harness.stats import p50_p99, ratio  # noqa: E402
from serving.engine.checkpoint import load_tensors  # noqa: E402
from serving.engine.config import read_config  # noqa: E402
from serving.engine.engine import Engine, SamplingParams, Sequence  # noqa: E402
from serving.engine.model import LlamaModel  # noqa: E402
from serving.engine.priority import BATCH, REALTIME  # noqa: E402
from serving.engine.testing import write_tiny_checkpoint  # noqa: E402

PROMPT = 24  # tokens per prompt
REALTIME_TOKENS, BATCH_TOKENS = 8, 24


def run(model: LlamaModel, args: argparse.Namespace, *, priority: bool) -> dict[str, Any]:
    """One pass of the arrival script; every request's admission step and first token."""
    engine = Engine(model, num_blocks=1024, max_num_seqs=args.max_num_seqs)
    engine.batch_max_wait_steps = args.bound_steps
    vocab = model.config.vocab_size - 3
    counter = iter(range(10**9))
    added: dict[int, int] = {}  # id(seq) -> step it was added on
    admitted: dict[int, int] = {}
    first: dict[int, int] = {}
    realtime: list[Sequence] = []
    batch: list[Sequence] = []

    def add(kind: str, step: int) -> None:
        base = next(counter) * 7919
        prompt = [(base + 31 * i) % vocab + 3 for i in range(PROMPT)]
        tokens = REALTIME_TOKENS if kind == REALTIME else BATCH_TOKENS
        seq = engine.add_request(
            prompt,
            SamplingParams(max_tokens=tokens, ignore_eos=True),
            tenant="bench",
            priority=kind if priority else REALTIME,
        )
        added[id(seq)] = step
        (realtime if kind == REALTIME else batch).append(seq)

    step = 0
    while len(realtime) < args.realtime or engine.has_work():
        if len(realtime) < args.realtime:
            waiting_batch = sum(1 for s in batch if s.scheduled_at is None)
            for _ in range(args.flood - waiting_batch):
                add(BATCH, step)
            if step % args.every == 0:
                add(REALTIME, step)
        engine.step()
        step += 1
        for seq in (*realtime, *batch):
            if seq.scheduled_at is not None and id(seq) not in admitted:
                admitted[id(seq)] = step
            if seq.first_token_at is not None and id(seq) not in first:
                first[id(seq)] = step
    ttft_ms = [
        (s.first_token_at - s.arrival) * 1000 for s in realtime if s.first_token_at is not None
    ]
    ttft_steps = [float(first[id(s)] - added[id(s)]) for s in realtime]
    waits = [admitted[id(s)] - added[id(s)] for s in batch if id(s) in admitted]
    worst = max(waits)
    return {
        "steps": step,
        "realtime_requests": len(realtime),
        "batch_requests": len(batch),
        "realtime_ttft_ms": p50_p99(ttft_ms),
        "realtime_ttft_steps": p50_p99(ttft_steps, 1),
        "batch_worst_wait_steps": worst,
        "batch_aged": engine.priority_metrics("bench")["batch_aged"],
        "priority_preemptions": engine.priority_metrics("bench")["priority_preemptions"],
        "starved": sum(1 for s in batch if not s.finished),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="tiny")
    parser.add_argument("--realtime", type=int, default=60, help="realtime requests")
    parser.add_argument("--flood", type=int, default=12, help="batch requests kept waiting")
    parser.add_argument("--every", type=int, default=4, help="steps between realtime ones")
    parser.add_argument("--max-num-seqs", type=int, default=4)
    parser.add_argument("--bound-steps", type=int, default=64, help="batch_max_wait_steps")
    parser.add_argument("--quick", action="store_true", help="--realtime 10 --flood 6")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    if args.quick:
        args.realtime, args.flood = 10, 6
    output = args.output or results_path(f"priority-{args.model}")

    with tempfile.TemporaryDirectory() as tmp:
        directory = write_tiny_checkpoint(Path(tmp) / "m", seed=0, **MODELS[args.model])
        config = read_config(directory)
        model = LlamaModel(config, load_tensors(directory, config), fingerprint="bench")
    run(model, argparse.Namespace(**{**vars(args), "realtime": 2}), priority=True)  # warm-up
    without = run(model, args, priority=False)
    with_priority = run(model, args, priority=True)
    rt_with, rt_without = with_priority["realtime_ttft_ms"], without["realtime_ttft_ms"]
    result = {
        "benchmark": "priority",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "model": {"name": args.model, "parameters": config.parameter_count()},
        "quick": args.quick,
        "script": {
            "realtime": args.realtime,
            "flood": args.flood,
            "every_steps": args.every,
            "max_num_seqs": args.max_num_seqs,
            "realtime_tokens": REALTIME_TOKENS,
            "batch_tokens": BATCH_TOKENS,
            "bound_steps": args.bound_steps,
        },
        "with_priority": with_priority,
        "without_priority": without,
        "ttft_ratio": {
            "p50": ratio(rt_with["p50"], rt_without["p50"], 5),
            "p99": ratio(rt_with["p99"], rt_without["p99"], 5),
        },
        # The same in engine steps: what the schedule did, free of the machine's load.
        "ttft_steps_ratio": {
            q: ratio(with_priority["realtime_ttft_steps"][q], without["realtime_ttft_steps"][q], 5)
            for q in ("p50", "p99")
        },
        "ok": with_priority["starved"] == 0
        and rt_with["p99"] < rt_without["p99"]
        and with_priority["batch_worst_wait_steps"] >= 0,
    }
    print(f"\n  model {args.model}: {config.parameter_count() / 1e6:.1f}M parameters, CPU")
    for name, row in (("without priority", without), ("with priority", with_priority)):
        ms, steps = row["realtime_ttft_ms"], row["realtime_ttft_steps"]
        print(
            f"  {name:<17} realtime TTFT p50 {ms['p50']:8.2f} ms ({steps['p50']:5.1f} steps)"
            f"  p99 {ms['p99']:8.2f} ms ({steps['p99']:5.1f} steps)"
            f"  batch worst wait {row['batch_worst_wait_steps']} steps"
        )
    print(
        f"\n  realtime TTFT with / without priority: p50 {result['ttft_ratio']['p50']:.5f}x,"
        f" p99 {result['ttft_ratio']['p99']:.5f}x"
    )
    print(
        f"  batch worst wait {with_priority['batch_worst_wait_steps']} steps (bound "
        f"{args.bound_steps} steps per promotion, {with_priority['batch_aged']} promoted); "
        f"starved: {with_priority['starved']}\n"
    )
    write_results("priority", result, output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
