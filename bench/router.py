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

    .venv/bin/python bench/router.py [--requests 1000]

Writes bench/results/router.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from ray import serve  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse  # noqa: E402

from serving.dataplane import openai  # noqa: E402

RESULTS = REPO_ROOT / "bench" / "results" / "router.json"
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
    """The version-server interface the router calls, answering with the echo handler."""

    def __init__(self, **args: Any) -> None:
        self.args = args

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


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument(
        "--separate-loops",
        action="store_true",
        help="Serve's defaults (user code and handle router on their own loops) for both apps",
    )
    args = parser.parse_args(argv)

    import httpx
    import ray
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeDeploySchema

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray.init(
        num_cpus=2,
        _node_ip_address="127.0.0.1",
        include_dashboard=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(REPO_ROOT)}},
    )
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": args.port})
        from serving.control.compile import SAME_LOOP_ENV

        compiled = config(args.port)
        # Both sides run as the portal configures its apps (or both with Serve's defaults).
        loops = {} if args.separate_loops else SAME_LOOP_ENV
        for app in compiled["applications"]:
            app["runtime_env"] = {"env_vars": {**loops, "PYTHONPATH": str(REPO_ROOT)}}
        _get_global_client().deploy_apps(ServeDeploySchema.model_validate(compiled))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            apps = serve.status().applications
            if len(apps) == 3 and all(a.status == "RUNNING" for a in apps.values()):
                break
            time.sleep(0.5)
        else:
            raise SystemExit(f"applications not running: {serve.status().applications}")
        base = f"http://127.0.0.1:{args.port}"
        body = {"prompt": "echo me", "max_tokens": 1, "temperature": 0}
        headers = {"authorization": f"Bearer {KEY}"}
        canary_headers = {**headers, "x-ab-group": "canary"}
        routed_url = "/bench/echo/v1/completions"
        bare_t: list[float] = []
        routed_t: list[float] = []
        canary_t: list[float] = []
        with httpx.Client(base_url=base, timeout=30, trust_env=False) as client:
            for i in range(args.requests + 50):
                for url, sent, group, out in (
                    ("/bare", headers, None, bare_t),
                    (routed_url, headers, "stable", routed_t),
                    (routed_url, canary_headers, "canary", canary_t),
                ):
                    started = time.perf_counter()
                    response = client.post(url, json=body, headers=sent)
                    elapsed = (time.perf_counter() - started) * 1000
                    if response.status_code != 200 or "echo me" not in response.text:
                        raise SystemExit(f"{url}: {response.status_code} {response.text}")
                    if group and response.headers.get("x-ab-group") != group:
                        raise SystemExit(f"{url}: answered by {response.headers}, not {group}")
                    if i >= 50:
                        out.append(elapsed)
    finally:
        serve.shutdown()
        ray.shutdown()
    result = {
        "benchmark": "router",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "requests": args.requests,
        "separate_loops": args.separate_loops,
        "bare_ms": {"p50": round(statistics.median(bare_t), 3), "p99": round(pct(bare_t, 0.99), 3)},
        "routed_ms": {
            "p50": round(statistics.median(routed_t), 3),
            "p99": round(pct(routed_t, 0.99), 3),
        },
        "canary_ms": {
            "p50": round(statistics.median(canary_t), 3),
            "p99": round(pct(canary_t, 0.99), 3),
        },
    }
    for name, key in (("added_ms", "routed_ms"), ("canary_added_ms", "canary_ms")):
        result[name] = {q: round(result[key][q] - result["bare_ms"][q], 3) for q in ("p50", "p99")}
    result["router_logic_us"] = round(router_logic_us(), 1)
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
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
