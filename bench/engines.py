"""Benchmark: the built-in engine vs vLLM, and the portal in front of vLLM vs vLLM's own server.

Two parts, one checkpoint (a Llama built on the fly with a head dim vLLM's CPU attention runs;
nothing downloaded), greedy decoding, CPU:

* engines: in this process, the built-in engine (serving.engine.async_engine) and vLLM's async
  engine behind the portal's adapter (serving.engine.vllm.runtime), the same prompts at batch
  1 / 8 / 32: tokens/s and mean time to first token. Greedy tokens are compared first.
* portal: the same vLLM engine served three ways on this machine, one after the other: vLLM's
  own OpenAI server (`python -m vllm.entrypoints.openai.api_server`); vLLM in a bare Serve
  deployment (Serve proxy -> one replica: what Ray Serve itself costs); and the portal's
  deployment (Serve proxy -> router -> the vLLM stable slot's application) on a local Ray
  head. Requests at concurrency 1 (added p50 latency; goal <= 1 ms), 8 and 32 (throughput
  ratio portal / bare; goal >= 0.95), each ratio also against bare Serve.

    python -m bench engines [--quick] [--part engines|portal|both] [--new-tokens 32]

Everything listens on 127.0.0.1. Writes bench/results/engines.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from ray import serve  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse  # noqa: E402

from bench.harness.report import print_table, write_results  # noqa: E402
from bench.harness.stats import p50_p99, ratio  # noqa: E402
from serving.engine.testing import VLLM_SHAPE, write_tiny_checkpoint  # noqa: E402

KEY = "ik_bench"
KV_BYTES = 256 << 20
MAX_LEN = 1024
# Bigger than the suite's: real matmuls on a CPU (4 layers, 256 wide, head dim 64).
SHAPE = {
    **VLLM_SHAPE,
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": MAX_LEN,
}
TARGET_RATIO = 0.95
TARGET_ADDED_MS = 1.0


def _prompts(n: int, length: int) -> list[list[int]]:
    return [[3 + (i * 7 + j * 13) % 300 for j in range(length)] for i in range(n)]


async def _run_batch(engine: Any, prompts: list[list[int]], new_tokens: int) -> dict[str, Any]:
    from serving.engine.engine import SamplingParams

    params = SamplingParams(max_tokens=new_tokens, temperature=0.0)
    salt = b"bench"

    async def one(i: int, ids: list[int]) -> tuple[float, list[int]]:
        started = time.perf_counter()
        stream = engine.submit(
            ids, params, tenant="t", request_id=f"r{i}-{started}", cache_salt=salt
        )
        first, out = None, []
        try:
            async for event in stream:
                first = first or time.perf_counter() - started
                if event.token_id >= 0:
                    out.append(event.token_id)
        finally:
            stream.close()
        return first or 0.0, out

    started = time.perf_counter()
    results = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    elapsed = time.perf_counter() - started
    tokens = sum(len(out) for _, out in results)
    return {
        "tokens_per_s": round(tokens / elapsed, 1),
        "ttft_ms": round(1000 * sum(t for t, _ in results) / len(results), 2),
        "outputs": [out for _, out in results],
    }


async def part_engines(
    directory: Path, batches: list[int], new_tokens: int, repeats: int
) -> dict[str, Any]:
    from serving.engine.async_engine import AsyncEngine
    from serving.engine.checkpoint import load_for_serving
    from serving.engine.engine import Engine
    from serving.engine.vllm.runtime import VllmEngine

    model, _, _ = load_for_serving(directory, gpu=False, fingerprint="bench")
    builtin = AsyncEngine(Engine(model, num_blocks=4096, block_size=16, max_num_seqs=max(batches)))
    started = time.perf_counter()
    vllm = VllmEngine(
        directory,
        {"dtype": "float32", "max_model_len": MAX_LEN, "max_num_seqs": max(batches),
         "cpu_kv_space_gib": KV_BYTES / (1 << 30), "enable_prefix_caching": False},
    )  # fmt: skip
    load_s = round(time.perf_counter() - started, 1)
    rows = []
    try:
        check = _prompts(1, 16)
        a = await _run_batch(builtin, check, 8)
        b = await _run_batch(vllm, check, 8)
        same = a["outputs"] == b["outputs"]
        for batch in batches:
            prompts = _prompts(batch, 64)
            best: dict[str, dict[str, Any]] = {}
            for _ in range(repeats):  # alternate, keep each side's best
                for name, engine in (("builtin", builtin), ("vllm", vllm)):
                    run = await _run_batch(engine, prompts, new_tokens)
                    if name not in best or run["tokens_per_s"] > best[name]["tokens_per_s"]:
                        best[name] = run
            rows.append(
                {
                    "batch": batch,
                    "builtin_tokens_per_s": best["builtin"]["tokens_per_s"],
                    "vllm_tokens_per_s": best["vllm"]["tokens_per_s"],
                    "builtin_ttft_ms": best["builtin"]["ttft_ms"],
                    "vllm_ttft_ms": best["vllm"]["ttft_ms"],
                    "vllm_over_builtin": ratio(
                        best["vllm"]["tokens_per_s"], best["builtin"]["tokens_per_s"]
                    ),
                }
            )
    finally:
        builtin.stop()
        vllm.shutdown()
    return {"greedy_identical": same, "vllm_load_s": load_s, "rows": rows}


async def _load(
    url: str, headers: dict[str, str], concurrency: int, requests: int, new_tokens: int
) -> dict[str, Any]:
    import httpx

    body = {"model": "m", "prompt": "The quick brown fox jumps over the lazy dog.",
            "max_tokens": new_tokens, "temperature": 0}  # fmt: skip
    latencies: list[float] = []
    left = [requests]

    async def worker(client: httpx.AsyncClient) -> None:
        while left[0] > 0:
            left[0] -= 1
            started = time.perf_counter()
            response = await client.post(url, json=body, headers=headers)
            if response.status_code != 200:
                raise SystemExit(f"{url}: {response.status_code} {response.text[:300]}")
            latencies.append((time.perf_counter() - started) * 1000)

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=120, trust_env=False, limits=limits) as client:
        await asyncio.gather(*(worker(client) for _ in range(min(concurrency, 4))))  # warm up
        left[0], latencies[:] = requests, []
        started = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return {"req_per_s": round(len(latencies) / elapsed, 2), "latency_ms": p50_p99(latencies)}


def _measure(
    url: str, headers: dict[str, str], plan: dict[int, int], new_tokens: int
) -> dict[str, Any]:
    return {
        str(c): asyncio.run(_load(url, headers, c, n, 1 if c == 1 else new_tokens))
        for c, n in plan.items()
    }


def _bare_server(
    directory: Path, port: int, log: Path, max_num_seqs: int
) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    args = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(directory),
        "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
        "--max-model-len", str(MAX_LEN), "--max-num-seqs", str(max_num_seqs), "--enforce-eager",
        "--kv-cache-memory-bytes", str(KV_BYTES), "--served-model-name", "m",
        "--disable-log-stats", "--seed", "0",
    ]  # fmt: skip
    return subprocess.Popen(args, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)  # noqa: S603


def _wait_http(url: str, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=2, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{url} not up within {timeout} s")


def part_portal(
    session: Any, directory: Path, plan: dict[int, int], new_tokens: int, max_num_seqs: int
) -> dict[str, Any]:
    """vLLM's own server, then on one Ray head: vLLM in a bare Serve deployment (Serve's own
    cost), then the portal's deployment. One engine alive at a time."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    work = session.workdir()
    proc = _bare_server(directory, port, work / "vllm-server.log", max_num_seqs)
    try:
        _wait_http(f"http://127.0.0.1:{port}/health", 300, proc)
        bare = _measure(f"http://127.0.0.1:{port}/v1/completions", {}, plan, new_tokens)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    _, target = session.ray_head(session.workdir())
    engine = _engine(max_num_seqs)
    serve_bare = _serve_measure(target, _serve_bare_app(directory, engine), "/bare", {}, plan,
                                new_tokens)  # fmt: skip
    auth = {"authorization": f"Bearer {KEY}"}
    portal = _serve_measure(target, _portal_apps(directory, engine), "/bench/m/v1/completions",
                            auth, plan, new_tokens)  # fmt: skip
    rows = [_row(int(c), bare[c], serve_bare[c], portal[c]) for c in map(str, plan)]
    return {"rows": rows}


def _row(
    concurrency: int, bare: dict[str, Any], serve: dict[str, Any], portal: dict[str, Any]
) -> dict[str, Any]:
    p50 = {name: r["latency_ms"]["p50"] for name, r in (("bare", bare), ("serve", serve),
                                                           ("portal", portal))}  # fmt: skip
    return {
        "concurrency": concurrency,
        "bare_req_per_s": bare["req_per_s"],
        "serve_req_per_s": serve["req_per_s"],
        "portal_req_per_s": portal["req_per_s"],
        "throughput_ratio": ratio(portal["req_per_s"], bare["req_per_s"]),
        "throughput_ratio_vs_serve": ratio(portal["req_per_s"], serve["req_per_s"]),
        "bare_p50_ms": p50["bare"],
        "serve_p50_ms": p50["serve"],
        "portal_p50_ms": p50["portal"],
        "added_p50_ms": round(p50["portal"] - p50["bare"], 3),
        "added_p50_ms_vs_serve": round(p50["portal"] - p50["serve"], 3),
    }


def _engine(max_num_seqs: int) -> dict[str, Any]:
    from serving.engine.choice import clean_engine

    return clean_engine(
        {"name": "vllm", "dtype": "float32", "max_model_len": MAX_LEN, "max_num_seqs": max_num_seqs,
         "cpu_kv_space_gib": KV_BYTES / (1 << 30), "enable_prefix_caching": True}
    )  # fmt: skip


def _serve_measure(
    target: Any,
    applications: list[dict[str, Any]],
    path: str,
    headers: dict[str, str],
    plan: dict[int, int],
    new_tokens: int,
) -> dict[str, Any]:
    """Put `applications` (alone) on the head's Serve, measure `path`, then remove them."""
    for app in applications:
        env = {**(app.get("runtime_env") or {}).get("env_vars", {}), "PYTHONPATH": str(REPO_ROOT)}
        app["runtime_env"] = {"env_vars": env}
    config = {"http_options": dict(target.serve_http_options), "applications": applications}
    client = target.serve_client(timeout=30)
    client.put(config)
    names = [app["name"] for app in applications]
    client.wait_until(names, timeout=300)
    try:
        return _measure(f"{target.serve_url}{path}", headers, plan, new_tokens)
    finally:
        client.put({**config, "applications": []})
        client.wait_until(names, ["ABSENT"], timeout=120)


def _portal_apps(directory: Path, engine: dict[str, Any]) -> list[dict[str, Any]]:
    from serving.control.compile import DeploymentSpec, SlotSpec, compile_config
    from serving.dataplane.keys import hash_key

    spec = DeploymentSpec(
        tenant_id="bench", tenant_slug="bench", name="m", revision=1,
        stable=SlotSpec("m:v1", str(directory), "bench", "bench", engine=engine),
        key_hashes=(hash_key(KEY),), num_cpus=0.5, max_ongoing_requests=128,
        cache_salt_hex="00" * 16,
    )  # fmt: skip
    return list(compile_config([spec])["applications"])


def _serve_bare_app(directory: Path, engine: dict[str, Any]) -> list[dict[str, Any]]:
    from serving.control.compile import SAME_LOOP_ENV

    return [
        {
            "name": "bare",
            "route_prefix": "/bare",
            "import_path": "bench.engines:build_serve_bare",
            "args": {"path": str(directory), "engine": engine},
            "runtime_env": {"env_vars": dict(SAME_LOOP_ENV)},
            "deployments": [
                {"name": "bare", "max_ongoing_requests": 128,
                 "ray_actor_options": {"num_cpus": 0.5}},
            ],
        }
    ]  # fmt: skip


@serve.deployment(name="bare")
class ServeBareVllm:
    """vLLM in a bare Serve deployment: the same engine adapter, no router, key, guard, salt,
    SLI or lifecycle; what Ray Serve itself costs in front of vLLM."""

    def __init__(self, path: str, engine: dict[str, Any]) -> None:
        from serving.engine.checkpoint import load_tokenizer
        from serving.engine.vllm.runtime import VllmEngine

        self.tokenizer = load_tokenizer(Path(path))
        self.engine = VllmEngine(Path(path), engine)
        self.count = 0

    async def __call__(self, request: Request) -> JSONResponse:
        from serving.engine.engine import SamplingParams

        body = await request.json()
        ids = self.tokenizer.encode(body["prompt"]).ids
        params = SamplingParams(max_tokens=int(body["max_tokens"]), temperature=0.0)
        self.count += 1
        stream = self.engine.submit(
            ids, params, tenant="b", request_id=f"b{self.count}", cache_salt=b"b"
        )
        try:
            out = [event.token_id async for event in stream if event.token_id >= 0]
        finally:
            stream.close()
        text = self.tokenizer.decode(out)
        return JSONResponse({"choices": [{"text": text, "index": 0}]})


def build_serve_bare(args: dict[str, Any]) -> Any:
    return ServeBareVllm.bind(args["path"], args["engine"])  # type: ignore[attr-defined]


def _print_engines(rows: list[dict[str, Any]]) -> None:
    keys = ["batch", "builtin_tokens_per_s", "vllm_tokens_per_s", "vllm_over_builtin"]
    keys += ["builtin_ttft_ms", "vllm_ttft_ms"]
    print_table([[r[k] for k in keys] for r in rows], header=keys)


def _print_portal(rows: list[dict[str, Any]]) -> None:
    keys = ["concurrency", "bare_req_per_s", "serve_req_per_s", "portal_req_per_s"]
    keys += ["throughput_ratio", "throughput_ratio_vs_serve", "bare_p50_ms", "serve_p50_ms"]
    keys += ["portal_p50_ms", "added_p50_ms", "added_p50_ms_vs_serve"]
    print_table([[r[k] for k in keys] for r in rows], header=keys)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=["engines", "portal", "both"], default="both")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="batch 1/8, few requests")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    batches = [1, 8] if args.quick else [1, 8, 32]
    if args.quick:
        args.new_tokens, args.repeats, args.requests = 8, 1, 16
    plan = {1: args.requests // 2, 8: args.requests} if args.quick else {
        1: args.requests // 2, 8: args.requests, 32: args.requests}  # fmt: skip

    from bench.harness import BenchSession

    result: dict[str, Any] = {
        "benchmark": "engines", "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "quick": args.quick, "shape": SHAPE, "new_tokens": args.new_tokens,
    }  # fmt: skip
    with BenchSession("engines") as session, tempfile.TemporaryDirectory() as tmp:
        directory = write_tiny_checkpoint(Path(tmp) / "ck", seed=0, vocab_size=512, **SHAPE)
        if args.part in ("engines", "both"):
            result["engines"] = asyncio.run(
                part_engines(directory, batches, args.new_tokens, args.repeats)
            )
            _print_engines(result["engines"]["rows"])
            print(f"  greedy tokens identical: {result['engines']['greedy_identical']}")
        if args.part in ("portal", "both"):
            result["portal"] = part_portal(session, directory, plan, args.new_tokens, max(batches))
            _print_portal(result["portal"]["rows"])
    result["targets"] = {"throughput_ratio": TARGET_RATIO, "added_p50_ms": TARGET_ADDED_MS}
    write_results("engines", result, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
