"""The load test of a version check: the version's own engine in this process, driven by
`concurrency` clients at a time, greedy, each answer `max_tokens` long (EOS ignored, so every
level generates the same work). Measures per request the latency and the time to first token,
the gaps between tokens, and the level's tokens per second."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path
from typing import Any

# Bounded by serving.ops.checks.limits before anything here runs.
KV_BLOCKS = 512


def quantile(values: list[float], q: float) -> float | None:
    """The q-quantile (nearest rank) of `values`; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, int(round(q * len(ordered) + 0.5)) - 1))
    return round(ordered[index], 3)


def load_engine(directory: Path, fingerprint: str) -> tuple[Any, Any]:
    """(AsyncEngine, tokenizer) of the checkpoint, loaded the way a replica loads it (the
    same loader, with its test forward pass), on CPU: a check never takes a GPU from serving."""
    from serving.engine.async_engine import AsyncEngine
    from serving.engine.checkpoint import load_for_serving
    from serving.engine.engine import Engine

    model, tokenizer, _chat = load_for_serving(directory, gpu=False, fingerprint=fingerprint)
    return AsyncEngine(Engine(model, num_blocks=KV_BLOCKS, max_num_seqs=32)), tokenizer


async def _level(
    engine: Any,
    prompt_ids: list[list[int]],
    *,
    concurrency: int,
    requests: int,
    max_tokens: int,
    deadline: float,
) -> dict[str, Any]:
    from serving.engine.engine import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    numbers = itertools.count()
    latency: list[float] = []
    ttft: list[float] = []
    gaps: list[float] = []
    tokens = errors = 0

    async def client() -> None:
        nonlocal tokens, errors
        while (n := next(numbers)) < requests and time.monotonic() < deadline:
            started = time.monotonic()
            try:
                times = [
                    time.monotonic()
                    async for _event in engine.generate(
                        prompt_ids[n % len(prompt_ids)],
                        params,
                        tenant="version-check",
                        request_id=f"check-{concurrency}-{n}",
                    )
                ]
            except Exception:  # a refused or failed request is the version's error
                errors += 1
                continue
            if not times:
                errors += 1
                continue
            tokens += len(times)
            latency.append((times[-1] - started) * 1000)
            ttft.append((times[0] - started) * 1000)
            gaps.extend((b - a) * 1000 for a, b in itertools.pairwise(times))

    started = time.monotonic()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    wall = max(time.monotonic() - started, 1e-9)
    return {
        "concurrency": concurrency,
        "requests": len(latency) + errors,
        "errors": errors,
        "tokens": tokens,
        "seconds": round(wall, 3),
        "tokens_per_s": round(tokens / wall, 3),
        "latency_ms": {f"p{int(q * 100)}": quantile(latency, q) for q in (0.5, 0.95, 0.99)},
        "ttft_ms": {f"p{int(q * 100)}": quantile(ttft, q) for q in (0.5, 0.95, 0.99)},
        "itl_ms": {"p95": quantile(gaps, 0.95)},
        # Kept for the objectives (fraction under a threshold), never stored whole.
        "_latency": latency,
        "_ttft": ttft,
        "_itl": gaps,
    }


def run_levels(
    engine: Any,
    tokenizer: Any,
    prompts: list[str],
    *,
    concurrencies: list[int],
    requests: int,
    max_tokens: int,
    max_duration_s: float,
) -> list[dict[str, Any]]:
    """One measurement per concurrency level, each stopped after `requests` requests or
    `max_duration_s` seconds, whichever comes first."""
    prompt_ids = [tokenizer.encode(p).ids or [0] for p in prompts]

    async def run() -> list[dict[str, Any]]:
        levels = []
        for concurrency in concurrencies:
            deadline = time.monotonic() + max_duration_s
            levels.append(
                await _level(
                    engine,
                    prompt_ids,
                    concurrency=concurrency,
                    requests=requests,
                    max_tokens=max_tokens,
                    deadline=deadline,
                )
            )
        return levels

    return asyncio.run(run())
