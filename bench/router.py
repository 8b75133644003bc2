"""Benchmark: latency the portal's router adds over a bare Serve deployment.

Both answer with the same trivial echo handler, on one local Ray cluster started by this
script (127.0.0.1 only), through the same Serve HTTP proxy:

* bare: an ingress deployment that parses the OpenAI completion body and echoes the prompt;
* routed: the portal's router application (key check, input guard, stable/canary choice,
  breaker, trace context, lifecycle) serving its stable slot in-process, as it does for every
  dedicated deployment, with the echo handler in place of the engine;
* canary: the same router, the request pinned to the canary group (`X-AB-Group: canary`),
  which is a separate echo version application reached through a deployment handle.

Requests alternate bare/routed/canary, sequentially, over keep-alive connections. The target
(<= 1 ms added at p50) is for the stable path; the canary hop is reported beside it.

    python -m bench router [--quick] [--requests 1000] [--json PATH]

The cluster is the portal's own local head (serving.control.cluster: 127.0.0.1 only, token
auth, ports of its own, stopped by PID); the applications go in through Serve's REST API, as
the portal's reconcile puts them. Writes bench/results/router.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

# Ray's replicas import this module too: only Django-free imports at module level.
from ray import serve  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse  # noqa: E402

from serving.dataplane import openai  # noqa: E402
from serving.dataplane.faults import FaultInjector  # noqa: E402

TARGET_P50_MS = 1.0
KEY = "ik_bench"


def _echo_body(prompt: str) -> dict[str, Any]:
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    return openai.completion_body("completions", "bench", "echo", prompt, "stop", usage)


@serve.deployment(name="bare")
class BareEcho:
    async def __call__(self, request: Request) -> JSONResponse:
        body = json.loads(await request.body())
        return JSONResponse(_echo_body(body["prompt"]))


class EchoCore:
    """The version-server interface the router calls, answering with the echo handler. It
    carries what the router uses of the in-process slot besides the calls: Serve's health
    check (`check_health`) and the chaos state (`chaos`, for the KV probe's keys)."""

    def __init__(self, **args: Any) -> None:
        self.args = args
        self.chaos = FaultInjector(f"echo-{os.getpid()}", started_at=time.time())

    def check_health(self) -> None:
        self.chaos.check_health()

    async def reconfigure(self, config: dict[str, Any]) -> None:
        self.config = config

    async def complete(self, request: dict[str, Any]) -> dict[str, Any]:
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        return {"text": request["prompt"], "finish_reason": "stop", "usage": usage}

    async def generate(self, request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        yield {"type": "start", "prompt_tokens": 1, "version": "echo", "pid": os.getpid()}
        yield {"type": "token", "text": request["prompt"]}
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        yield {"type": "end", "finish_reason": "stop", "usage": usage}

    def stats(self) -> dict[str, Any]:
        return {"pid": os.getpid()}


@serve.deployment(name="version")
class EchoVersion(EchoCore):
    """The echo core as its own Serve deployment (the canary slot)."""


def build_bare(args: dict[str, Any]) -> Any:
    return BareEcho.bind()  # type: ignore[attr-defined]


def build_echo_version(args: dict[str, Any]) -> Any:
    return EchoVersion.bind()  # type: ignore[attr-defined]


def config(port: int) -> dict[str, Any]:
    from serving.control.compile import DeploymentSpec, SlotSpec, compile_config
    from serving.dataplane.keys import hash_key

    spec = DeploymentSpec(
        tenant_id="bench",
        tenant_slug="bench",
        name="echo",
        revision=1,
        stable=SlotSpec("echo", "-", "-", "-"),
        canary=SlotSpec("echo-canary", "-", "-", "-"),
        canary_percent=0,
        key_hashes=(hash_key(KEY),),
        num_cpus=0.1,
    )
    compiled = compile_config([spec], http_port=port)
    for app in compiled["applications"]:
        if app["name"].endswith(".canary"):
            app["import_path"] = "bench.router:build_echo_version"
            app["args"] = {}
        elif "local" in app["args"]:
            app["args"]["local"]["server"] = "bench.router:EchoCore"
    compiled["applications"].append(
        {
            "name": "bare",
            "route_prefix": "/bare",
            "import_path": "bench.router:build_bare",
            "deployments": [{"name": "bare", "ray_actor_options": {"num_cpus": 0.1}}],
        }
    )
    return compiled


def router_logic_us(n: int = 20000) -> float:
    """The router's own work per request, in-process, no Ray: key check, guard, parsing,
    group choice, breaker, lifecycle, trace context."""
    from serving.dataplane.breaker import CircuitBreaker
    from serving.dataplane.guard import GuardConfig, check_lengths, parse_body
    from serving.dataplane.keys import bearer, hash_key, key_matches
    from serving.dataplane.lifecycle import Lifecycle
    from serving.dataplane.traffic import choose_group, continue_trace

    hashes = [hash_key(KEY), hash_key("ik_other")]
    guard = GuardConfig()
    breakers = {"stable": CircuitBreaker(), "canary": CircuitBreaker()}
    raw = json.dumps({"prompt": "echo me", "max_tokens": 1, "temperature": 0}).encode()
    started = time.perf_counter()
    for i in range(n):
        continue_trace("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        life = Lifecycle(f"r{i}")
        life.to("validating")
        assert key_matches(bearer(f"Bearer {KEY}"), hashes)
        body = parse_body(raw, guard)
        sampling = openai.sampling_fields(body)
        check_lengths(0, sampling["max_tokens"], guard)
        openai.prompt_of("completions", body)
        life.to("routing")
        group = choose_group(20, None, has_canary=True)
        breakers[group].allow()
        life.to("executing")
        breakers[group].record(True)
        life.to("completed")
    return (time.perf_counter() - started) / n * 1e6


def measure(base: str, requests: int, warmup: int) -> dict[str, list[float]]:
    """Alternate bare / stable / canary requests; the latencies (ms) after `warmup` rounds."""
    import httpx

    body = {"prompt": "echo me", "max_tokens": 1, "temperature": 0}
    headers = {"authorization": f"Bearer {KEY}"}
    canary_headers = {**headers, "x-ab-group": "canary"}
    routed_url = "/bench/echo/v1/completions"
    times: dict[str, list[float]] = {"bare": [], "stable": [], "canary": []}
    with httpx.Client(base_url=base, timeout=30, trust_env=False) as client:
        for i in range(requests + warmup):
            for url, sent, group in (
                ("/bare", headers, None),
                (routed_url, headers, "stable"),
                (routed_url, canary_headers, "canary"),
            ):
                started = time.perf_counter()
                response = client.post(url, json=body, headers=sent)
                elapsed = (time.perf_counter() - started) * 1000
                if response.status_code != 200 or "echo me" not in response.text:
                    raise SystemExit(f"{url}: {response.status_code} {response.text}")
                if group and response.headers.get("x-ab-group") != group:
                    raise SystemExit(f"{url}: answered by {response.headers}, not {group}")
                if i >= warmup:
                    times[group or "bare"].append(elapsed)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--quick", action="store_true", help="--requests 40 --warmup 5")
    parser.add_argument(
        "--separate-loops",
        action="store_true",
        help="Serve's defaults (user code and handle router on their own loops) for both apps",
    )
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.warmup = 40, 5

    from bench.harness import BenchSession
    from bench.harness.report import write_results
    from bench.harness.stats import p50_p99
    from serving.control.compile import SAME_LOOP_ENV

    with BenchSession("router") as session:
        _, target = session.ray_head(session.workdir())
        compiled = config(target.serve_http_options["port"])
        # Both sides run as the portal configures its apps (or both with Serve's defaults).
        loops = {} if args.separate_loops else SAME_LOOP_ENV
        for app in compiled["applications"]:
            app["runtime_env"] = {"env_vars": {**loops, "PYTHONPATH": str(REPO_ROOT)}}
        compiled["http_options"] = dict(target.serve_http_options)
        client = target.serve_client(timeout=30)
        client.put(compiled)
        names = [app["name"] for app in compiled["applications"]]
        client.wait_until(names, timeout=180)
        print(f"applications running: {', '.join(names)}", flush=True)
        times = measure(target.serve_url, args.requests, args.warmup)
    result = {
        "benchmark": "router",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "requests": args.requests,
        "separate_loops": args.separate_loops,
        "quick": args.quick,
        "bare_ms": p50_p99(times["bare"]),
        "routed_ms": p50_p99(times["stable"]),
        "canary_ms": p50_p99(times["canary"]),
    }
    for name, key in (("added_ms", "routed_ms"), ("canary_added_ms", "canary_ms")):
        result[name] = {q: round(result[key][q] - result["bare_ms"][q], 3) for q in ("p50", "p99")}
    result["router_logic_us"] = round(router_logic_us(2000 if args.quick else 20000), 1)
    result["target_added_p50_ms"] = TARGET_P50_MS
    result["ok"] = result["added_ms"]["p50"] <= TARGET_P50_MS
    print()
    for label, key in (
        ("bare", "bare_ms"),
        ("stable", "routed_ms"),
        ("added", "added_ms"),
        ("canary", "canary_ms"),
        ("added", "canary_added_ms"),
    ):
        row = result[key]
        print(f"  {label:<7} p50 {row['p50']:7.3f} ms   p99 {row['p99']:7.3f} ms")
    print(f"  the router's own logic (in-process): {result['router_logic_us']:.1f} us per request")
    print("  stable runs in the router's replica; the canary pays Serve's extra handle hop")
    verdict = "OK" if result["ok"] else "ABOVE TARGET"
    print(f"  target: added p50 <= {TARGET_P50_MS} ms: {verdict}\n")
    write_results("router", result, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
