"""Every benchmark still runs: `python -m bench <scenario> --quick --json <tmp>` in a subprocess,
on the test run's PostgreSQL server and Redis db (DATABASE_URL / REDIS_URL; each bench makes its
own test_<db>_bench_<scenario> database and clears only its own portal-bench-<scenario> keys).

The figures' presence is checked (keys there, numbers finite), never their values: timing
belongs to bench/, as ratios measured in the same run (docs: CONVENTIONS). Quick-mode runtimes
on the 2-core VM: api_list ~6 s, engine ~6 s, prefix ~2 s, gpu_check ~2 s (simulated provider
without a GPU), health_tick ~9 s, pages ~10 s, ws_fanout ~17 s, recovery ~2 s, artifacts ~13 s (16 MiB
through the portal's ASGI server); with their own Ray head (marked `ray`): router ~24 s, rollback ~55 s
(embedded PostgreSQL and Valkey), drills ~50 s, engines ~75 s (three vLLM engine loads),
detection ~60 s (one run per SLI, the golden-prompt probe every 5 s)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

REPO_ROOT = Path(__file__).resolve().parent.parent

# Dotted paths into each scenario's JSON (an integer step indexes a list): its figures.
FIGURES: dict[str, list[str]] = {
    "api_list": [
        "ratio",
        "scoped.timing.req_per_s",
        "bare.timing.req_per_s",
        "scoped.timing.p95_ms",
        "scoped.queries.pages.1.queries",
    ],
    "engine": [
        "rows.0.ours_tokens_per_s",
        "rows.0.transformers_tokens_per_s",
        "rows.0.ratio",
        "rows.1.ratio",
    ],
    "prefix": [
        "warm_vs_cold_speedup",
        "median_ttft_ms.cold",
        "median_ttft_ms.warm",
        "salt_cost_ab",
        "salt_cost_direct",
    ],
    "priority": [
        "ttft_ratio.p50",
        "ttft_ratio.p99",
        "ttft_steps_ratio.p99",
        "with_priority.realtime_ttft_ms.p99",
        "without_priority.realtime_ttft_ms.p99",
        "with_priority.batch_worst_wait_steps",
        "with_priority.starved",
    ],
    "gpu_check": [
        "timings.devices.p50_ms",
        "timings.processes.p99_ms",
        "utilisation_repeats.0.identical_share",
        "violation_count",
    ],
    "health_tick": [
        "sizes.0.tick.p50_ms_per_deployment",
        "sizes.0.tick_with_probes.p50_ms_per_deployment",
        "sizes.0.tick_between.p50_ms",
        "sizes.0.naive.p50_ms_per_deployment",
        "sizes.0.ratio_tick_to_naive",
        "sizes.0.sql.tick.queries",
        "sizes.0.workers.2w_2s.p50_ms_per_deployment",
        "sizes.0.workers.speedup_2_workers",
    ],
    "pages": [
        "pages.shell.p95_ms",
        "pages.home.p95_ms",
        "pages.home.vs_shell_p95",
        "pages.health series 7d.p95_ms",
        "pages.deployments.queries",
        "slowest.p95_ms",
    ],
    "ws_fanout": [
        "runs.0.latency_ms.p50",
        "runs.0.latency_ms.p99",
        "runs.0.drops",
        "runs.1.p99_vs_baseline",
        "target.layers.pubsub.p99_ms",
    ],
    "router": [
        "bare_ms.p50",
        "routed_ms.p99",
        "canary_ms.p50",
        "added_ms.p50",
        "canary_added_ms.p50",
        "router_logic_us",
    ],
    "rollback": [
        "detection_s.p50",
        "detection_s.p95",
        "switch_client_s.p95",
        "switch_portal_s.p50",
        "runs.0.reconcile_s",
        "modes.embedded.detection_s.p50",  # --quick runs on the embedded PostgreSQL and Valkey
        "modes.embedded.shield_s.p50",  # with the breaker on: it shields, the rollback lands
        "modes.embedded.landed_s.p50",
    ],
    "engines": [
        "engines.rows.0.builtin_tokens_per_s",
        "engines.rows.0.vllm_tokens_per_s",
        "engines.rows.1.vllm_over_builtin",
        "engines.rows.1.vllm_ttft_ms",
        "portal.rows.0.added_p50_ms",
        "portal.rows.0.added_p50_ms_vs_serve",
        "portal.rows.1.throughput_ratio",
        "portal.rows.1.throughput_ratio_vs_serve",
    ],
    "artifacts": [
        "size_bytes",
        "copy.mb_per_s",
        "fetch_cold.mb_per_s",
        "fetch_warm.s",
        "ratio_fetch_to_copy",
    ],
    "recovery": [
        "swap_ms.standby.p50",
        "swap_ms.disk.p50",
        "first_answer_ms.standby.p50",
        "speedup_p50",
        "memory.standby_bytes",
        "memory.standby_fp16_bytes",
    ],
    "drills": [
        "kinds.0.mttd_p50_s",
        "kinds.0.mttr_p50_s",
        "kinds.0.score_p50",
        "runs.0.mttd_s",
        "kinds.0.detected",
        "kinds.1.mttd_p50_s",  # the seed-rate leak: a number only when it was detected
        "runtime_s",
    ],
    "detection": [
        "slis.latency_p99_jitter.detection_s.p50",
        "slis.state_divergence.detection_s.p95",
        "slis.output_consistency.detection_s.p50",
        "runs.0.evaluation_s",
        "health_tick_s",
        "consistency_probe_s",
        "kv_probe_control.cross_tenant_hits",
    ],
}
TIMEOUT_S = {"router": 240, "rollback": 300, "drills": 360, "engines": 360, "detection": 300}


def figure(result: Any, dotted: str) -> Any:
    value = result
    for step in dotted.split("."):
        value = value[int(step)] if isinstance(value, list) else value[step]
    return value


def run_quick(scenario: str, tmp_path: Path) -> dict[str, Any]:
    out = tmp_path / f"{scenario}.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PORTAL_TEST"))}
    db = settings.DATABASES["default"]
    # The base database of this test run (pytest-django renamed `NAME` to its test database).
    base = db.get("TEST", {}).get("NAME") or db["NAME"]
    base = base.removeprefix("test_")
    env["DATABASE_URL"] = os.environ.get(
        "DATABASE_URL", f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{base}"
    )
    env["REDIS_URL"] = os.environ.get("REDIS_URL", settings.REDIS_URL)
    completed = subprocess.run(  # noqa: S603 (this interpreter, a fixed module)
        [sys.executable, "-m", "bench", scenario, "--quick", "--json", str(out)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S.get(scenario, 180),
        check=False,
    )
    tail = (completed.stdout + completed.stderr)[-4000:]
    assert completed.returncode == 0, f"{scenario} exited {completed.returncode}:\n{tail}"
    assert out.exists(), f"{scenario} wrote no results:\n{tail}"
    result = json.loads(out.read_text())
    assert result["benchmark"] == scenario
    for dotted in FIGURES[scenario]:
        value = figure(result, dotted)
        assert isinstance(value, int | float) and not isinstance(value, bool), (dotted, value)
        assert math.isfinite(value), (dotted, value)
    return result


@pytest.mark.parametrize(
    "scenario",
    ["api_list", "engine", "prefix", "health_tick", "pages", "ws_fanout", "artifacts", "recovery"],
)
def test_quick_bench(scenario: str, tmp_path: Path) -> None:
    run_quick(scenario, tmp_path)


def test_quick_priority(tmp_path: Path) -> None:
    """Every batch request of the flood ran (the starvation bound); how much priority cuts
    realtime latency is bench/'s figure, not a test's."""
    result = run_quick("priority", tmp_path)
    assert result["with_priority"]["starved"] == result["without_priority"]["starved"] == 0


def test_quick_gpu_check(tmp_path: Path) -> None:
    result = run_quick("gpu_check", tmp_path)
    # Without a GPU it runs against the simulated provider, and says so.
    assert result["simulated"] == (result["provider"] == "simulated")
    if result["simulated"]:
        assert all("Simulated" in d["name"] for d in result["devices"])


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.parametrize("scenario", ["router", "rollback", "drills"])
def test_quick_bench_with_ray(scenario: str, tmp_path: Path) -> None:
    """Each starts its own Ray head (127.0.0.1, fresh ports, never 6379; stopped by PID)."""
    run_quick(scenario, tmp_path)


@pytest.mark.slow
@pytest.mark.ray
def test_quick_detection(tmp_path: Path) -> None:
    """Each signal SLI's alert fired under its fault, and the KV pollution probe's control
    left the golden answers alone (isolation holds); how fast is bench/, not a test."""
    result = run_quick("detection", tmp_path)
    for sli, row in result["slis"].items():
        assert row["detected"] == row["runs"] == 1, (sli, row)
    assert all(run["quiet_before"] for run in result["runs"]), result["runs"]
    assert result["replicas_seen"] == 1, "a replica crashed or was replaced under the faults"
    control = result["kv_probe_control"]
    assert control["replay_queries"] > 0 and control["golden_probes"] >= 1, control
    assert control["cross_tenant_hits"] == 0 and control["consistency_alert"] is False, control


@pytest.mark.slow
@pytest.mark.ray
def test_quick_engines(tmp_path: Path) -> None:
    """vLLM in this process, vLLM's own server, and the portal on its own Ray head."""
    result = run_quick("engines", tmp_path)
    assert result["engines"]["greedy_identical"] is True  # the same checkpoint, the same tokens
