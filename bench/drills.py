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

Detection (issue 18): each run says whether the fault took effect (the replicas' own reports),
whether a signal the fault declares noticed it (`detected` yes/no, `signal`), and MTTD = first
detection - the fault effective; a fault nobody noticed fails its run as "undetected". The
summary has one row per fault kind: detected yes/no over its runs, the signals, MTTD. The seed's
leak rate (001 §3.1: 512 MB/s) is the default gpu_memory_leak here, for --duration s (60 in
the seed); on a CPU cluster the leak is simulated device memory, and its row says so.

MTTR = mitigation - injection (from DrillRun). Per run it also records what the clients saw
(first and last bad answer after the injection), the verdict, the resilience score, and
whether the fault was left in the revision. The leak's total is capped by the replica's own
leak cap (serving.replica_limits), so at 512 MB/s it reaches its cap within seconds.

    python -m bench drills [--runs 5] [--kinds error_burst,latency_spike] \
        [--duration 20] [--quick] [--json PATH]

Writes bench/results/drills.json. Targets (kinds the rollback can fix, on the canary):
MTTD p95 <= 10 s, MTTR p95 <= 15 s.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.harness import env  # noqa: E402

# Own settings, Redis db (14 unless REDIS_URL is set), prefixes portal-bench-drills (SLI keys and
# Celery's queues included: bench/harness/settings.py).
env.isolate("drills", redis_db=14)
os.environ["PORTAL_TEST_RECONCILE"] = ""  # this process reconciles its own changes itself

import django  # noqa: E402

django.setup()

from bench.harness import BenchSession  # noqa: E402
from bench.harness.clients import Clients  # noqa: E402
from bench.harness.database import database_url  # noqa: E402
from bench.harness.report import environment, print_table, results_path, write_results  # noqa: E402
from bench.harness.stats import median, percentile_or_none  # noqa: E402
from tests.support.contracts import DRILLS as CONTRACT  # noqa: E402

RESULTS = results_path("drills")
TARGET_MTTD_P95_S, TARGET_MTTR_P95_S = 10.0, 15.0
SEED_LEAK_MB_PER_S = 512


class Bench:
    def __init__(self, args: argparse.Namespace, target: Any, work: Path) -> None:
        self.args, self.target, self.work = args, target, work
        self.client = target.serve_client()
        self.drills: dict[str, Any] = {}

    # --- setup --------------------------------------------------------------------------

    def build(self) -> None:
        from serving.deployments import services as deployments
        from serving.deployments.models import Deployment
        from serving.engine.testing import write_tiny_checkpoint
        from serving.ops.contracts import contract_set
        from serving.registry import services as registry
        from tenants.actors import Actor
        from tests.support.worlds import make_world

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
        from serving.deployments import reconcile as control

        control.reconcile(target=self.target, client=self.client)
        if present:
            self.client.wait_until(present, timeout=240)
        if absent:
            self.client.wait_until(absent, ["ABSENT"], timeout=120)
        control.refresh_status(client=self.client)

    # --- one run ------------------------------------------------------------------------

    def slot(self, kind: str) -> str:
        from incidents.drills.catalogue import CATALOGUE

        if kind in self.args.stable:
            return "stable"
        return "canary" if CATALOGUE[kind].blast == "traffic" else "stable"

    def prepare(self, group: str) -> dict[str, Any]:
        """The slot the run needs: a clean canary for request faults, stable alone for replica
        faults; a fault still in the revision is removed (and reported)."""
        from serving.deployments import services as deployments

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
        from serving.ops.health import deployment_health

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
        if kind == "gpu_memory_leak":  # seed 001 §3.1: 512 MB/s (for the drill's duration)
            data["parameters"] = {"mb_per_s": SEED_LEAK_MB_PER_S, "max_mb": self.leak_cap()}
        if kind in self.args.params:
            data["parameters"] = {**data.get("parameters", {}), **self.args.params[kind]}
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

    def leak_cap(self) -> int:
        """The seed's whole leak (rate x duration), within the replica's own leak cap."""
        from serving.deployments.replica_limits import leak_cap_mb

        revision = self.deployment.current_revision
        cap = leak_cap_mb(num_cpus=revision.num_cpus, num_gpus=revision.num_gpus)
        return int(min(SEED_LEAK_MB_PER_S * self.args.duration, cap))

    def one_run(self, kind: str, index: int, clients: Clients) -> dict[str, Any]:
        from incidents import drills
        from incidents.models import Incident
        from serving.ops.models import Rollback

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
        from incidents.drills.catalogue import CATALOGUE
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
            "effective": run.effect_at is not None,
            "effect_s": None
            if run.effect_at is None or injected is None
            else round(run.effect_at.timestamp() - injected, 2),
            "detected": bool(run.detected_by),
            "signal": run.detected_by or None,
            "simulated": bool((run.detection or {}).get("simulated")),
            "mttr_s": None if run.mttr_s is None else round(run.mttr_s, 2),
            "resilience_score": run.resilience_score,
            "deviated": run.deviated,
            "incident": incident.pk if incident else None,
            "breach_objective": breach.objective if breach else None,
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
    mttd = [r["mttd_s"] for r in runs if r.get("detected") and r.get("mttd_s") is not None]
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
        "effective": sum(1 for r in runs if r.get("effective")),
        "detected": sum(1 for r in runs if r.get("detected")),
        "detected_all": bool(runs) and all(r.get("detected") for r in runs),
        "signals": sorted({r["signal"] for r in runs if r.get("signal")}),
        "simulated": any(r.get("simulated") for r in runs),
        "mitigated": len(mttr),
        "mttd_p50_s": median(mttd, 2),
        "mttd_p95_s": percentile_or_none(mttd, 0.95),
        "mttr_p50_s": median(mttr, 2),
        "mttr_p95_s": percentile_or_none(mttr, 0.95),
        "score_p50": median(scores, 2),
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


def print_summaries(summaries: list[dict[str, Any]]) -> None:
    def f(value: Any) -> str:
        return "-" if value is None else f"{value:.1f}"

    def target(s: dict[str, Any]) -> str:
        return "n/a" if s["target_ok"] is None else ("OK" if s["target_ok"] else "NOT MET")

    print_table(
        [
            (s["kind"], s["slot"], s["runs"], s["passed"], s["failed"], s["aborted"], s["error"],
             f"{s['effective']}/{s['runs']}",
             ("yes" if s["detected_all"] else "no") + f" {s['detected']}/{s['runs']}",
             ",".join(s["signals"]) + (" (simulated)" if s["simulated"] else "") or "-",
             f(s["mttd_p50_s"]), f(s["mttd_p95_s"]),
             f(s["mttr_p50_s"]), f(s["mttr_p95_s"]), f(s["score_p50"]), target(s))
            for s in summaries
        ],
        header=("kind", "slot", "runs", "pass", "fail", "abrt", "err", "effect", "detected",
                "signal", "MTTD p50", "p95", "MTTR p50", "p95", "score", "target"),
    )  # fmt: skip


def one_record(bench: Bench, kind: str, index: int, clients: Clients) -> dict[str, Any]:
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
    c = record.get("client") or {}
    print(
        f"  {kind:<16} run {index}: {record['status']:<8} detected "
        f"{'yes' if record.get('detected') else 'no'} ({record.get('signal') or '-'}) MTTD "
        f"{record.get('mttd_s') if record.get('mttd_s') is not None else '-':>6}  "
        f"MTTR {record.get('mttr_s') if record.get('mttr_s') is not None else '-':>6}"
        f"  score {record.get('resilience_score')}  clients bad "
        f"{c.get('bad', '-')}/{c.get('slot_answers', '-')} "
        f"[{c.get('first_bad_s')}..{c.get('last_bad_s')}] s  "
        f"({record['bench_s']} s) {record.get('verdict', '')[:70]}"
    )
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per fault kind")
    parser.add_argument("--kinds", default="", help="comma-separated kinds (default: all)")
    parser.add_argument("--duration", type=int, default=20, help="each drill's duration_s")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="--runs 1 --duration 8 --settle 5, error_burst and the seed's leak (unless --kinds)",
    )
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
        args.runs, args.duration, args.settle = 1, 8, 5.0
        args.kinds = args.kinds or "error_burst,gpu_memory_leak"
    for name in ("httpx", "celery", "tenants", "serving", "incidents", "portal"):
        logging.getLogger(name).setLevel(logging.WARNING)

    from incidents.drills.catalogue import CATALOGUE

    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()] or [str(k) for k in CATALOGUE]
    unknown = [k for k in kinds if k not in CATALOGUE]
    if unknown:
        parser.error(f"unknown kinds {unknown}; the catalogue has {', '.join(CATALOGUE)}")
    # Request faults first: the canary is set once for them, then removed for replica faults.
    kinds.sort(key=lambda k: CATALOGUE[k].blast != "traffic" or k in args.stable)

    from portal.celery import app as celery_app

    records: list[dict[str, Any]] = []
    status = 0
    began = time.monotonic()
    load_start = os.getloadavg()
    try:
        with BenchSession("drills") as session:
            test_name = session.database()
            session.redis()
            print(
                f"kinds {', '.join(kinds)}; {args.runs} runs each, {args.duration} s; test "
                f"database {test_name}; load {', '.join(f'{v:.2f}' for v in load_start)}"
            )
            work = session.workdir()
            _, target = session.ray_head(work)
            bench = Bench(args, target, work)
            bench.build()
            child_env = {
                **os.environ,
                "DATABASE_URL": database_url(test_name),
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
            session.callback(setattr, celery_app.conf, "task_always_eager", True)
            session.celery_worker(child_env, work / "worker.log", queues="default,health,chaos")
            session.celery_beat(child_env, work)
            clients = Clients(bench.url, bench.key, args.clients)
            session.callback(clients.close)
            records.extend(
                one_record(bench, kind, index, clients)
                for kind in kinds
                for index in range(1, args.runs + 1)
            )
    except KeyboardInterrupt:
        print("\ninterrupted: stopped the Ray head, dropped the test database", file=sys.stderr)
        status = 130
    if not records:
        return status or 1
    summaries = []
    for kind in kinds:
        runs = [r for r in records if r["kind"] == kind]
        if runs:
            summaries.append(summarize(kind, runs[0]["slot"], runs))
    print_summaries(summaries)
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
            "quick": args.quick,
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
            **environment("ray", "celery"),
            "load_start": [round(v, 2) for v in load_start],
        },
        "runtime_s": runtime,
        "targets": {"mttd_p95_s": TARGET_MTTD_P95_S, "mttr_p95_s": TARGET_MTTR_P95_S, "ok": ok},
        "kinds": summaries,
        "runs": records,
    }
    write_results("drills", result, args.output)
    return status


if __name__ == "__main__":
    sys.exit(main())
