"""Benchmark: MTTD and MTTR of the chaos drills, per fault kind, on a real demo deployment.

Everything real, on this machine: a local Ray head (127.0.0.1, token auth, stopped by PID at
the end, also on Ctrl-C or `kill`) serving a tiny Llama deployment, a Celery worker on the
queues default, health and chaos (it reconciles the revisions it writes, as in production),
Celery beat (the health tick every --tick s, the drill resume sweep every 15 s), the bench's
own PostgreSQL test database (`test_portal_bench_drills`) and Redis db (14), and client threads
sending completions through the Serve proxy.

Every fault kind of `incidents.drills.CATALOGUE` (or those --kinds names) runs --runs times
through the drill engine itself (`drill_create` + `run_start`; the worker steps the run):

* request faults (blast "traffic": error_burst, latency_spike) go into a canary (v2 at
  --canary-percent %, re-added before each run) on half its requests: the contract's fast rules
  should open a drill incident and roll the canary back (MTTR = the rollback's mitigation);
* replica faults (replica_crash, replica_hang, gpu_memory_leak) go into the stable slot (no
  canary): nothing can be rolled back, MTTR is the steady state's recovery (the drill's probes:
  error rate <= 10%, throughput >= half of what it was just before), MTTD may be "not detected"
  when the contract does not see the fault: a finding, not a bench error.

MTTD = the run's first drill incident - injection; MTTR = mitigation - injection (both from
DrillRun). Per run it also records what the clients saw (first and last bad answer after the
injection), the verdict, the resilience score, and whether the fault was left in the revision.

    .venv/bin/python bench/drills.py [--runs 5] [--kinds error_burst,latency_spike] \
        [--duration 20] [--quick]

Writes bench/results/drills.json. Targets (kinds the rollback can fix, on the canary):
MTTD p95 <= 10 s, MTTR p95 <= 15 s.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

BENCH_PREFIX = "portal-bench-drills"
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/portal_bench")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/14")
os.environ["CACHE_KEY_PREFIX"] = BENCH_PREFIX
os.environ["CHANNEL_PREFIX"] = f"{BENCH_PREFIX}:asgi"
os.environ["RATE_LIMIT_KEY_PREFIX"] = f"{BENCH_PREFIX}:rl"
os.environ["PORTAL_TEST_RECONCILE"] = ""  # this process reconciles its own changes itself

import django  # noqa: E402

django.setup()

import logging  # noqa: E402

import httpx  # noqa: E402
from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402
from django.test.utils import setup_test_environment, teardown_test_environment  # noqa: E402

from bench.isolated import clear_redis, ensure_base_database  # noqa: E402

RESULTS = REPO_ROOT / "bench" / "results" / "drills.json"
TARGET_MTTD_P95_S, TARGET_MTTR_P95_S = 10.0, 15.0
PR_SET_PDEATHSIG = 1
# The demo's contract (tests' FAST_CONTRACT + the demo's p95 objective) with a latency fast
# rule: without one a latency spike on the canary is never an incident (the objectives alone
# only burn the 30-day budget, which a 20 s spike hardly touches).
CONTRACT = """\
apiVersion: aiops.portal/v1
kind: SlaContract
metadata:
  name: bench-drills-sla
spec:
  window: 30d
  objectives:
    - name: availability
      sli: availability
      target: 0.99
    - name: p95-latency
      sli: latency_p95
      threshold_ms: 500
  fast:
    - name: error-spike
      sli: error_rate
      above: 0.1
      for: 15s
      min_requests: 10
      action: rollback
    - name: latency-spike
      sli: latency_p95
      above_ms: 500
      for: 15s
      min_requests: 10
      action: rollback
"""
PROMPT = {"prompt": "The quick brown fox", "max_tokens": 1, "temperature": 0}


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def die_with_parent() -> None:
    """preexec_fn of the worker and beat: SIGTERM when the bench goes, even on SIGKILL."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def free_ports(count: int) -> list[int]:
    """Distinct free loopback ports, none of Redis', the portal's or Ray's worker range."""
    held, ports = [], []
    try:
        while len(ports) < count:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            held.append(sock)
            port = sock.getsockname()[1]
            if port not in (6379, 8000) and not 10002 <= port < 20000:
                ports.append(port)
    finally:
        for sock in held:
            sock.close()
    return ports


def start_process(args: list[str], env: dict[str, str], log: Path, ready: str) -> Any:
    handle = log.open("w")
    process = subprocess.Popen(  # noqa: S603 (sys.executable and fixed flags)
        args,
        cwd=REPO_ROOT,
        env=env,
        stdout=handle,
        stderr=subprocess.STDOUT,
        preexec_fn=die_with_parent,  # noqa: PLW1509 (prctl only)
    )
    deadline = time.monotonic() + 120
    while ready not in log.read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise SystemExit(f"{args[3]} did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    return process


def bench_redis_patterns() -> tuple[str, ...]:
    # SLI keys use tests.settings' fixed prefix: the bench's own Redis db keeps them apart.
    return (
        f"{BENCH_PREFIX}:*",
        f"{BENCH_PREFIX}*",
        f"{settings.SLI_KEY_PREFIX}:*",
        "_kombu.*",
        "unacked*",
        "celery-task-meta-*",
        "default",
        "health",
        "chaos",
    )


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def median(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


class Clients:
    """Client threads through the Serve proxy; every answer is logged as (sent, done, status,
    group) (group from `x-ab-group`, "?" when the proxy answered without the router)."""

    def __init__(self, url: str, key: str, threads: int) -> None:
        self.url, self.key = url, key
        self.log: list[tuple[float, float, int, str]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]
        for thread in self.threads:
            thread.start()

    def _run(self) -> None:
        headers = {"authorization": f"Bearer {self.key}"}
        with httpx.Client(timeout=30, trust_env=False) as http:
            while not self.stop.is_set():
                sent = time.time()
                try:
                    response = http.post(self.url, json=PROMPT, headers=headers)
                    status, group = response.status_code, response.headers.get("x-ab-group", "?")
                except httpx.HTTPError:
                    status, group = 0, "?"
                with self.lock:
                    self.log.append((sent, time.time(), status, group))
                if status != 200:
                    time.sleep(0.05)  # a dead proxy answers at once: no busy loop

    def between(self, start: float, end: float) -> list[tuple[float, float, int, str]]:
        with self.lock:
            return [entry for entry in self.log if start <= entry[1] <= end]

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=35)


class Bench:
    def __init__(self, args: argparse.Namespace, target: Any, work: Path) -> None:
        self.args, self.target, self.work = args, target, work
        self.client = target.serve_client()
        self.drills: dict[str, Any] = {}

    # --- setup --------------------------------------------------------------------------

    def build(self) -> None:
        from serving import deployments
        from serving import services as registry
        from serving.contracts import contract_set
        from serving.engine.testing import write_tiny_checkpoint
        from serving.models import Deployment
        from tenants.actors import Actor
        from tests.conftest import make_world

        world = make_world("Bench")
        self.tenant, self.actor = world.tenant, Actor(user=world.owner)
        # The world's deployment: stable "served:s1" in the router's replica, num_cpus 0.25.
        self.deployment = Deployment.objects.get(tenant=world.tenant, name="assistant")
        Deployment.objects.filter(tenant=world.tenant).exclude(pk=self.deployment.pk).update(
            deleted_at=self.deployment.created_at
        )
        Deployment.objects.filter(pk=self.deployment.pk).update(health_interval_s=self.args.tick)
        _, self.key = deployments.inference_key_create(
            tenant=self.tenant, actor=self.actor, deployment=self.deployment, name="bench"
        )
        contract_set(
            tenant=self.tenant, actor=self.actor, deployment=self.deployment, source=CONTRACT
        )
        version = registry.version_register_path(
            tenant=self.tenant,
            actor=self.actor,
            model=world.model,
            label="canary",
            path=str(write_tiny_checkpoint(self.work / "canary", seed=7)),
        )
        self.v2 = registry.version_validate(tenant=self.tenant, version_id=version.pk)
        self.app = f"{self.tenant.slug}.assistant"
        self.url = f"{self.target.serve_url}/{self.tenant.slug}/assistant/v1/completions"

    def reconcile(self, present: list[str], absent: list[str]) -> None:
        from serving.control import reconcile as control

        control.reconcile(target=self.target, client=self.client)
        if present:
            self.client.wait_until(present, timeout=240)
        if absent:
            self.client.wait_until(absent, ["ABSENT"], timeout=120)
        control.refresh_status(client=self.client)

    # --- one run ------------------------------------------------------------------------

    def slot(self, kind: str) -> str:
        from incidents.drills import CATALOGUE

        if kind in self.args.stable:
            return "stable"
        return "canary" if CATALOGUE[kind].blast == "traffic" else "stable"

    def prepare(self, group: str) -> dict[str, Any]:
        """The slot the run needs: a clean canary for request faults, stable alone for replica
        faults; a fault still in the revision is removed (and reported)."""
        from serving import deployments

        self.deployment.refresh_from_db()
        current = self.deployment.current_revision
        leftover = dict(current.faults or {})
        changes: dict[str, Any] = {}
        if leftover:
            changes["faults"] = {}
        if group == "canary" and current.canary_version_id is None:
            changes.update(canary_version=self.v2.pk, canary_percent=self.args.canary_percent)
        if group == "stable" and current.canary_version_id is not None:
            changes.update(canary_version_id=None, canary_percent=0)
        if changes:
            deployments.deployment_change(
                tenant=self.tenant,
                actor=self.actor,
                deployment=self.deployment,
                changes=changes,
                reason=f"bench: prepare the {group} slot",
            )
            canary = f"{self.app}.canary"
            if group == "canary":
                self.reconcile([self.app, canary], [])
            else:
                self.reconcile([self.app], [canary])
        return leftover

    def firing(self, group: str) -> list[str]:
        from serving.health import deployment_health

        slots = deployment_health(self.deployment.pk).get("slots") or {}
        return [f.get("name") for f in (slots.get(group) or {}).get("firing") or []]

    def settle(self, group: str) -> dict[str, Any]:
        """--settle s of clean traffic on the slot (the drill's probes read the last 15 s):
        the contract quiet, requests seen, no errors. Gives up after 90 s more (the drill's own
        steady-state check then decides)."""
        from incidents import drills

        started = time.monotonic()
        while True:
            window = drills.measure(self.deployment.pk, group, time.time())
            quiet = not self.firing(group)
            clean = window["requests"] >= 10 and window["error_rate"] <= 0.02
            waited = time.monotonic() - started
            if (waited >= self.args.settle and quiet and clean) or waited > self.args.settle + 90:
                return {**window, "quiet": quiet, "waited_s": round(waited, 1)}
            time.sleep(1.0)

    def drill(self, kind: str, group: str, baseline: dict[str, Any]) -> Any:
        from incidents import drills

        probes: list[dict[str, Any]] = [{"sli": "error_rate", "max": 0.1}]
        if group == "stable":  # replica faults show as lost throughput before anything else
            floor = round(max(0.5, 0.5 * baseline["rps"]), 2)
            probes.append({"sli": "rps", "min": floor, "name": f"rps >= {floor}"})
        data = {
            "group": group,
            "duration_s": self.args.duration,
            "traffic_share": self.args.traffic_share if group == "canary" else 1.0,
            "replica_share": 1.0,
            "steady_state": {"contract": True, "probes": probes},
        }
        if kind in self.args.params:
            data["parameters"] = self.args.params[kind]
        drill = self.drills.get(kind)
        if drill is None:
            drill = drills.drill_create(
                tenant=self.tenant,
                actor=self.actor,
                deployment=self.deployment,
                name=f"bench {kind}",
                fault=kind,
                **data,
            )
            self.drills[kind] = drill
        else:
            drill = drills.drill_update(tenant=self.tenant, actor=self.actor, drill=drill, **data)
            self.drills[kind] = drill
        return drill

    def one_run(self, kind: str, index: int, clients: Clients) -> dict[str, Any]:
        from incidents import drills
        from incidents.models import Incident
        from serving.models import Rollback

        group = self.slot(kind)
        load = os.getloadavg()[0]
        leftover = self.prepare(group)
        baseline = self.settle(group)
        drill = self.drill(kind, group, baseline)
        run = drills.run_start(tenant=self.tenant, actor=self.actor, drill=drill, trigger="bench")
        limit = self.args.duration + drills.RECOVERY_WAIT_S + 90
        deadline = time.monotonic() + limit
        never_ended = None
        while True:
            run.refresh_from_db()
            if not run.is_active:
                break
            if time.monotonic() > deadline:
                if never_ended is None:  # a finding: record where it hung, then stop it
                    never_ended = {"status": run.status, "after_s": limit}
                    with contextlib.suppress(Exception):
                        drills.run_stop(tenant=self.tenant, actor=self.actor, run=run)
                    deadline = time.monotonic() + 90
                else:
                    break
            time.sleep(0.5)
        record = self.record(kind, group, index, run, clients, baseline, load)
        record["never_ended"] = never_ended
        record["leftover_before"] = leftover or None
        record["rollbacks"] = [
            {
                "switched_s": round(
                    r.traffic_switched_at.timestamp() - run.injected_at.timestamp(), 2
                ),
                "detected_s": round(r.detected_at.timestamp() - run.injected_at.timestamp(), 2),
            }
            for r in Rollback.objects.filter(
                deployment=self.deployment, created_at__gte=run.created_at
            )
            if run.injected_at and r.traffic_switched_at
        ]
        # Incidents of this run's time that are not drills: a drill's breach paged as real.
        record["real_incidents"] = [
            {
                "objective": i.first_breach.objective if i.first_breach else None,
                "group": i.dedup_key,
            }
            for i in Incident.objects.filter(
                tenant=self.tenant, is_drill=False, triggered_at__gte=run.created_at
            ).select_related("first_breach")
        ]
        self.deployment.refresh_from_db()
        faults = dict(self.deployment.current_revision.faults or {})
        record["fault_left"] = faults.get(group) or None
        if not self.args.keep_incidents:
            self.resolve(run)
        return record

    def record(
        self,
        kind: str,
        group: str,
        index: int,
        run: Any,
        clients: Clients,
        baseline: dict[str, Any],
        load: float,
    ) -> dict[str, Any]:
        from incidents.drills import CATALOGUE
        from incidents.models import Incident

        injected = run.injected_at.timestamp() if run.injected_at else None
        end = (run.finished_at or run.stepped_at).timestamp()
        client: dict[str, Any] = {}
        if injected is not None:
            params = run.snapshot.get("parameters") or {}
            slow = 1.0
            if "delay_ms" in params:
                slow = max(0.25, 0.8 * float(params["delay_ms"]) / 1000.0)
            answers = clients.between(injected, end)
            mine = [a for a in answers if group == "stable" or a[3] in ("canary", "?")]
            bad = [a for a in mine if a[2] != 200 or a[1] - a[0] >= slow]
            statuses: dict[str, int] = {}
            for a in answers:
                statuses[str(a[2])] = statuses.get(str(a[2]), 0) + 1
            client = {
                "answers": len(answers),
                "slot_answers": len(mine),
                "bad": len(bad),
                "slow_s": slow,
                "statuses": statuses,
                "first_bad_s": round(bad[0][1] - injected, 2) if bad else None,
                "last_bad_s": round(bad[-1][1] - injected, 2) if bad else None,
                # A stalled request (the proxy holding it while Serve replaces the replica)
                # shows its stall by when it was sent and how long it took.
                "first_bad_sent_s": round(min(a[0] for a in bad) - injected, 2) if bad else None,
                "worst_latency_s": round(max(a[1] - a[0] for a in mine), 2) if mine else None,
                "bad_sample": [
                    [round(a[0] - injected, 2), round(a[1] - a[0], 2), a[2]] for a in bad[:8]
                ],
            }
        incident = Incident.objects.filter(pk=run.incident_id).first()
        breach = incident.first_breach if incident is not None else None
        # Every breach of the run's incident: which rule fired when, and what it did.
        breaches = [
            {
                "objective": b.objective,
                "kind": b.kind,
                "action": b.action,
                "at_s": round(b.detected_at.timestamp() - injected, 2),
            }
            for b in (incident.breaches.order_by("detected_at") if incident else [])
            if injected is not None
        ]
        return {
            "kind": kind,
            "slot": group,
            "run": index,
            "drill_run": run.pk,
            "blast": CATALOGUE[kind].blast,
            "status": run.status,
            "verdict": run.verdict,
            "mttd_s": None if run.mttd_s is None else round(run.mttd_s, 2),
            "mttr_s": None if run.mttr_s is None else round(run.mttr_s, 2),
            "resilience_score": run.resilience_score,
            "deviated": run.deviated,
            "incident": incident.pk if incident else None,
            "detected_by": breach.objective if breach else None,
            "breaches": breaches,
            "incident_status": incident.status if incident else None,
            "wall_s": round(end - run.created_at.timestamp(), 1),
            "events": list(run.events.values_list("kind", flat=True)),
            # When each step happened (s after the injection): a starved chaos queue shows here.
            "timeline": [
                [kind_, round(at.timestamp() - injected, 2)]
                for kind_, at in run.events.values_list("kind", "at")
                if injected is not None
            ],
            "client": client,
            "baseline": baseline,
            "load_1m": round(load, 2),
        }

    def resolve(self, run: Any) -> None:
        """Resolve this run's drill incidents (an on-call would): an open one would absorb the
        next run's breaches (see the README)."""
        from incidents import services as incidents
        from incidents.models import Incident

        open_ = Incident.objects.filter(tenant=self.tenant, is_drill=True).exclude(
            status="resolved"
        )
        for incident in open_:
            with contextlib.suppress(Exception):
                incidents.incident_resolve(
                    tenant=self.tenant,
                    actor=self.actor,
                    incident=incident,
                    reason=f"bench run {run.pk}",
                )


def summarize(kind: str, slot: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    mttd = [r["mttd_s"] for r in runs if r.get("mttd_s") is not None]
    mttr = [r["mttr_s"] for r in runs if r.get("mttr_s") is not None]
    scores = [r["resilience_score"] for r in runs if r.get("resilience_score") is not None]
    counts = {
        s: sum(1 for r in runs if r.get("status") == s)
        for s in ("passed", "failed", "aborted", "error")
    }
    fixable = slot == "canary"
    summary: dict[str, Any] = {
        "kind": kind,
        "slot": slot,
        "runs": len(runs),
        **counts,
        "detected": len(mttd),
        "mitigated": len(mttr),
        "mttd_p50_s": median(mttd),
        "mttd_p95_s": pct(mttd, 0.95),
        "mttr_p50_s": median(mttr),
        "mttr_p95_s": pct(mttr, 0.95),
        "score_p50": median(scores),
        "rollback_fixable": fixable,
    }
    if fixable:
        summary["target_ok"] = (
            bool(runs)
            and len(mttd) == len(runs)
            and len(mttr) == len(runs)
            and summary["mttd_p95_s"] <= TARGET_MTTD_P95_S
            and summary["mttr_p95_s"] <= TARGET_MTTR_P95_S
        )
    else:
        summary["target_ok"] = None
    return summary


def print_table(summaries: list[dict[str, Any]]) -> None:
    def f(value: Any) -> str:
        return "-" if value is None else f"{value:.1f}"

    print()
    print(
        f"  {'kind':<20}{'slot':<8}{'runs':>5}{'pass':>5}{'fail':>5}{'abrt':>5}{'err':>4}"
        f"{'det':>6}{'MTTD p50':>10}{'p95':>7}{'MTTR p50':>10}{'p95':>7}{'score':>7}"
        "  target"
    )
    for s in summaries:
        target = "n/a" if s["target_ok"] is None else ("OK" if s["target_ok"] else "NOT MET")
        print(
            f"  {s['kind']:<20}{s['slot']:<8}{s['runs']:>5}{s['passed']:>5}{s['failed']:>5}"
            f"{s['aborted']:>5}{s['error']:>4}{s['detected']:>4}/{s['runs']:<1}"
            f"{f(s['mttd_p50_s']):>10}{f(s['mttd_p95_s']):>7}{f(s['mttr_p50_s']):>10}"
            f"{f(s['mttr_p95_s']):>7}{f(s['score_p50']):>7}  {target}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per fault kind")
    parser.add_argument("--kinds", default="", help="comma-separated kinds (default: all)")
    parser.add_argument("--duration", type=int, default=20, help="each drill's duration_s")
    parser.add_argument("--quick", action="store_true", help="--runs 2 --duration 12")
    parser.add_argument("--tick", type=float, default=1.0, help="health tick interval (s)")
    parser.add_argument(
        "--settle", type=float, default=15.0, help="clean traffic on the slot before each run (s)"
    )
    parser.add_argument("--canary-percent", type=float, default=30.0)
    parser.add_argument(
        "--traffic-share",
        type=float,
        default=0.5,
        help="share of the canary's requests a request fault hits",
    )
    parser.add_argument("--clients", type=int, default=2, help="client threads")
    parser.add_argument(
        "--keep-incidents",
        action="store_true",
        help="leave drill incidents open between runs (shows the dedup issue)",
    )
    parser.add_argument(
        "--stable",
        default="",
        help="comma-separated request-fault kinds to inject into the stable slot instead "
        "(nothing to roll back to: the incident stays open)",
    )
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KIND.NAME=VALUE",
        help="a fault parameter (repeatable), e.g. token_starvation.prompt_chars=600",
    )
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    args.stable = {k.strip() for k in args.stable.split(",") if k.strip()}
    args.params = {}
    for item in args.param:
        name, _, value = item.partition("=")
        kind, _, param = name.partition(".")
        if not param or not value:
            parser.error(f"--param {item!r}: give KIND.NAME=VALUE")
        with contextlib.suppress(ValueError):
            value = float(value) if "." in value else int(value)
        args.params.setdefault(kind, {})[param] = value
    if args.quick:
        args.runs, args.duration = 2, 12
    for name in ("httpx", "celery", "tenants", "serving", "incidents", "portal"):
        logging.getLogger(name).setLevel(logging.WARNING)

    from incidents.drills import CATALOGUE

    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()] or [str(k) for k in CATALOGUE]
    unknown = [k for k in kinds if k not in CATALOGUE]
    if unknown:
        parser.error(f"unknown kinds {unknown}; the catalogue has {', '.join(CATALOGUE)}")
    # Request faults first: the canary is set once for them, then removed for replica faults.
    kinds.sort(key=lambda k: CATALOGUE[k].blast != "traffic" or k in args.stable)

    from portal.celery import app as celery_app
    from serving.control.cluster import LocalHeadConfig, local_target, start_head, stop_head

    signal.signal(signal.SIGTERM, _interrupt)  # `kill` cleans up like Ctrl-C
    ensure_base_database(settings)
    setup_test_environment(debug=False)
    db = settings.DATABASES["default"]
    old_name = db["NAME"]
    db.setdefault("TEST", {})["NAME"] = f"test_{old_name}_drills"
    test_name = connection.creation.create_test_db(
        verbosity=0, autoclobber=True, keepdb=False, serialize=False
    )
    clear_redis(settings.REDIS_URL, *bench_redis_patterns())
    work = Path(tempfile.mkdtemp(prefix="portal-bench-drills-"))
    ports = free_ports(7)
    head = LocalHeadConfig(
        data_dir=work / "ray",
        gcs_port=ports[0],
        dashboard_port=ports[1],
        serve_port=ports[2],
        client_server_port=ports[3],
        dashboard_agent_port=ports[4],
        autoscaler_metrics_port=ports[5],
        dashboard_metrics_port=ports[6],
        num_cpus=2,
        num_gpus=0,
    )
    processes: list[Any] = []
    clients: Clients | None = None
    records: list[dict[str, Any]] = []
    status = 0
    began = time.monotonic()
    load_start = os.getloadavg()
    print(
        f"kinds {', '.join(kinds)}; {args.runs} runs each, {args.duration} s; test database "
        f"{test_name}; load {', '.join(f'{v:.2f}' for v in load_start)}"
    )
    try:
        print("starting the Ray head ...")
        start_head(head)
        target = local_target(head)
        bench = Bench(args, target, work)
        bench.build()
        env = {
            **os.environ,
            "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{test_name}",
            "PORTAL_TEST_WORKER": "1",
            "PORTAL_TEST_RECONCILE": "1",  # the drill's revisions are reconciled on commit
            "RAY_ADDRESS": target.address,
            "RAY_DASHBOARD_URL": target.dashboard_url,
            "RAY_AUTH_TOKEN": target.token,
            "RAY_SERVE_URL": target.serve_url,
            "PORTAL_RAY_SERVE_HOST": "127.0.0.1",
            "EMAIL_FILE_PATH": str(work / "mail"),
            "HEALTH_TICK_S": str(args.tick),
        }
        print("deploying stable ...")
        bench.reconcile([bench.app], [])
        celery_app.conf.task_always_eager = False  # run_start's step goes to the worker
        python = sys.executable
        processes.append(
            start_process(
                [
                    python,
                    "-m",
                    "celery",
                    "-A",
                    "portal",
                    "worker",
                    "-Q",
                    "default,health,chaos",
                    "--concurrency",
                    "2",
                    "--without-gossip",
                    "--without-mingle",
                    "-l",
                    "INFO",
                ],
                env,
                work / "worker.log",
                "ready",
            )
        )
        processes.append(
            start_process(
                [
                    python,
                    "-m",
                    "celery",
                    "-A",
                    "portal",
                    "beat",
                    "-S",
                    "celery.beat:PersistentScheduler",
                    "-s",
                    str(work / "beat-schedule"),
                    "-l",
                    "INFO",
                ],
                env,
                work / "beat.log",
                "beat: Starting",
            )
        )
        clients = Clients(bench.url, bench.key, args.clients)
        for kind in kinds:
            for index in range(1, args.runs + 1):
                started = time.monotonic()
                try:
                    record = bench.one_run(kind, index, clients)
                except KeyboardInterrupt:
                    raise
                except Exception as exc:  # one broken run must not end the others
                    logging.getLogger(__name__).exception("run %s %d", kind, index)
                    record = {
                        "kind": kind,
                        "slot": bench.slot(kind),
                        "run": index,
                        "status": "error",
                        "verdict": f"{type(exc).__name__}: {exc}",
                    }
                record["bench_s"] = round(time.monotonic() - started, 1)
                records.append(record)
                c = record.get("client") or {}
                print(
                    f"  {kind:<16} run {index}: {record['status']:<8} MTTD "
                    f"{record.get('mttd_s') if record.get('mttd_s') is not None else '-':>6}  "
                    f"MTTR {record.get('mttr_s') if record.get('mttr_s') is not None else '-':>6}"
                    f"  score {record.get('resilience_score')}  clients bad "
                    f"{c.get('bad', '-')}/{c.get('slot_answers', '-')} "
                    f"[{c.get('first_bad_s')}..{c.get('last_bad_s')}] s  "
                    f"({record['bench_s']} s) {record.get('verdict', '')[:70]}"
                )
    except KeyboardInterrupt:
        print("\ninterrupted: stopping the Ray head, dropping the test database", file=sys.stderr)
        status = 130
    finally:
        # The cleanup runs to the end, whatever arrives meanwhile.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            if clients is not None:
                clients.close()
            for process in processes:
                process.terminate()
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
            stopped = stop_head(head)
            print(f"Ray head stopped ({len(stopped)} processes)")
            celery_app.conf.task_always_eager = True
            clear_redis(settings.REDIS_URL, *bench_redis_patterns())
            connection.close()
            connection.creation.destroy_test_db(old_name, verbosity=0, keepdb=False)
            teardown_test_environment()
            shutil.rmtree(work, ignore_errors=True)
        finally:
            signal.signal(signal.SIGINT, previous)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if not records:
        return status or 1
    summaries = []
    for kind in kinds:
        runs = [r for r in records if r["kind"] == kind]
        if runs:
            summaries.append(summarize(kind, runs[0]["slot"], runs))
    print_table(summaries)
    fixable = [s for s in summaries if s["rollback_fixable"]]
    ok = all(s["target_ok"] for s in fixable) if fixable else None
    runtime = round(time.monotonic() - began, 1)
    print(
        f"\n  targets (rollback-fixable kinds: {', '.join(s['kind'] for s in fixable) or '-'}): "
        f"MTTD p95 <= {TARGET_MTTD_P95_S:g} s, MTTR p95 <= {TARGET_MTTR_P95_S:g} s: "
        f"{'n/a' if ok is None else 'OK' if ok else 'NOT MET'}; runtime {runtime:.0f} s"
    )
    result = {
        "benchmark": "drills",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "config": {
            "runs": args.runs,
            "duration_s": args.duration,
            "kinds": kinds,
            "health_tick_s": args.tick,
            "settle_s": args.settle,
            "canary_percent": args.canary_percent,
            "traffic_share": args.traffic_share,
            "clients": args.clients,
            "keep_incidents": args.keep_incidents,
            "stable_override": sorted(args.stable),
            "parameters": args.params,
            "contract": CONTRACT,
        },
        "environment": {
            "cpus": os.cpu_count(),
            "load_start": [round(v, 2) for v in load_start],
            "load_end": [round(v, 2) for v in os.getloadavg()],
        },
        "runtime_s": runtime,
        "targets": {"mttd_p95_s": TARGET_MTTD_P95_S, "mttr_p95_s": TARGET_MTTR_P95_S, "ok": ok},
        "kinds": summaries,
        "runs": records,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {args.output}")
    return status


if __name__ == "__main__":
    sys.exit(main())
