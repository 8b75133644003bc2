"""Benchmark: how soon the alert of each new signal SLI fires under the fault it is meant to
catch (issue 17, "Measured"; seed 000 §4.3 gives the thresholds).

Everything real, on this machine: a local Ray head (127.0.0.1, token auth, stopped by PID at
the end) serving a tiny Llama deployment on the built-in engine, the bench's own PostgreSQL test
database and Redis db (15 unless REDIS_URL is set), two client threads sending completions
through the Serve proxy, and, in this process, the health tick (`serving.ops.health.tick`,
act=True: the breach record and its incident, exactly as the beat's task runs it) every --tick
s and the golden-prompt probe (`serving.ops.consistency.consistency_probe`, the beat's
`serving.consistency_probe`) every --probe-interval s while output consistency is measured.
The deployment's contract names the three SLIs with the seeds' thresholds:

* `latency_p99_jitter` max 15 ms (window 1m) under the `latency_spike` fault (half the
  requests wait --delay-ms ms); onset = the first client answer that took 80% of the delay;
* `state_divergence` max 0.03 under a failed reload: the stable slot moves to a version whose
  weights vanished after validation, the replica's hot reload fails and it keeps serving the
  old weights; onset = the failed reload as the replica reports it;
* `output_consistency` min 1.0 under a bad reload (the `weight_swap_jitter` fault's forced
  reload of an artifact whose weights were replaced): onset = the reload's end as the replica
  reports it. The KV pollution probe (`kv_pollution_probe`: a synthetic tenant replaying the
  tenant's fresh prompts) runs as a control first: KV isolation holds, so it must not change a
  golden answer; the JSON says whether the consistency alert stayed quiet under it.

Detection = the objective's breach record (`SlaBreach.detected_at`) - onset; the first tick
whose evaluation shows the objective failing is reported beside it (`evaluation_s`). Before
each fault the objective must be measured and passing (settled); open incidents are resolved.

    python -m bench detection [--quick] [--runs 5] [--tick 2] [--probe-interval 60] [--json PATH]

Writes bench/results/detection.json: per SLI p50/p95 of the detection time, the tick and probe
intervals used. --quick: one run of each, probe every 5 s.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.harness import env  # noqa: E402

# Own settings, Redis db (15 unless REDIS_URL is set), prefixes portal-bench-detection.
env.setup("detection", redis_db=15)

from django.conf import settings  # noqa: E402

from bench.harness import BenchSession  # noqa: E402
from bench.harness.clients import Clients  # noqa: E402
from bench.harness.report import environment, results_path, write_results  # noqa: E402
from bench.harness.stats import median, percentile  # noqa: E402
from serving.slo.signals import POINT_S  # noqa: E402

OBJECTIVES = {"latency_p99_jitter": "jitter", "state_divergence": "divergence"}
OBJECTIVES["output_consistency"] = "consistency"
CONTRACT = """\
apiVersion: aiops.portal/v1
kind: SlaContract
metadata:
  name: detection
spec:
  window: 1h
  objectives:
    - {name: jitter, sli: latency_p99_jitter, max: 15, window: 1m}
    - {name: divergence, sli: state_divergence, max: 0.03}
    - {name: consistency, sli: output_consistency, min: 1.0}
"""
SETTLE_TIMEOUT_S = 150.0  # the jitter window (1m) must pass clean after the previous spike
DETECT_TIMEOUT_S = 120.0
DRILL = "bench-detection"


def replace_file(source: Path, target: Path) -> None:
    """`target` gets `source`'s bytes as a new file (a copy beside it, renamed over it): a
    replica maps its weights file, and rewriting it in place kills the replica (SIGBUS)."""
    staged = target.with_name(f".{target.name}.staged")
    shutil.copyfile(source, staged)
    os.replace(staged, target)


class Loop(threading.Thread):
    """Calls `step` every `interval` s (drift-free) until closed; errors are kept, not raised."""

    def __init__(self, interval: float, step: Callable[[], None]) -> None:
        super().__init__(daemon=True)
        self.interval, self.step = interval, step
        self.stop = threading.Event()
        self.errors: list[str] = []

    def run(self) -> None:
        from django.db import connection

        next_at = time.monotonic()
        try:
            while not self.stop.is_set():
                try:
                    self.step()
                except Exception as exc:  # a finding for the report, the loop goes on
                    self.errors.append(repr(exc)[:300])
                next_at += self.interval
                self.stop.wait(max(0.0, next_at - time.monotonic()))
        finally:
            connection.close()

    def close(self) -> None:
        self.stop.set()
        self.join(timeout=120)


class Bench:
    def __init__(self, args: argparse.Namespace, target: Any, work: Path) -> None:
        self.args, self.target, self.work = args, target, work
        self.client = target.serve_client()
        self.evaluations: list[tuple[float, dict[str, bool | None]]] = []
        self.lock = threading.Lock()
        self.nonce = 0
        self.probes: list[float] = []  # when each golden-prompt probe ended
        self.replica_ids: set[str] = set()

    # --- setup ----------------------------------------------------------------------------

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
        versions: list[int] = []
        for label, seed in (("good", 1), ("broken", 7)):
            directory = write_tiny_checkpoint(self.work / label, seed=seed)
            version = registry.version_register_path(
                tenant=self.tenant, actor=self.actor, model=world.model, label=label,
                path=str(directory),
            )  # fmt: skip
            ready = registry.version_validate(tenant=self.tenant, version_id=version.pk)
            if ready is None or not (ready.golden or {}).get("prompts"):
                raise SystemExit(f"version {label} did not validate with golden answers")
            versions.append(ready.pk)
        self.good_id, self.broken_id = versions
        # The broken version's weights vanish after validation: a reload to it fails.
        (self.work / "broken" / "model.safetensors").unlink()
        self.weights = self.work / "good" / "model.safetensors"
        shutil.copyfile(self.weights, self.work / "good-weights.bak")
        other = write_tiny_checkpoint(self.work / "other", seed=8)
        self.other_weights = other / "model.safetensors"
        Deployment.objects.filter(tenant=self.tenant).update(deleted_at=self.tenant.created_at)
        self.deployment, self.key = deployments.deployment_create(
            tenant=self.tenant, actor=self.actor, name="chat", version_id=self.good_id,
            settings={"num_cpus": 0.25},
        )  # fmt: skip
        Deployment.objects.filter(pk=self.deployment.pk).update(health_interval_s=self.args.tick)
        contract_set(
            tenant=self.tenant, actor=self.actor, deployment=self.deployment, source=CONTRACT
        )
        self.app = f"{self.tenant.slug}.chat"
        self.url = f"{self.target.serve_url}/{self.tenant.slug}/chat/v1/completions"

    def reconcile(self) -> None:
        from serving.deployments import reconcile as control

        control.reconcile(target=self.target, client=self.client)
        self.client.wait_until([self.app], timeout=240)
        control.refresh_status(client=self.client)  # the beat's refresh: the probes need it

    def change(self, reason: str, **changes: Any) -> float:
        """A new revision (the deployments service, as a drill writes it), reconciled; returns
        when it was written."""
        from serving.deployments import services as deployments

        self.deployment.refresh_from_db()
        written = time.time()
        deployments.deployment_change(
            tenant=self.tenant, actor=self.actor, deployment=self.deployment, changes=changes,
            reason=f"bench: {reason}",
        )  # fmt: skip
        self.reconcile()
        return written

    def faults(self, **faults: Any) -> dict[str, Any]:
        issued = time.time()
        meta = {"drill": DRILL, "issued_at": issued, "expires_at": issued + 600}
        return {"stable": {**meta, **faults}}

    # --- the loops ------------------------------------------------------------------------

    def tick(self) -> None:
        from serving.ops import health

        at = time.time()
        health.tick(now=at, serve_url=self.target.serve_url, act=True)
        found = health.deployment_health(self.deployment.pk)
        slot = (found.get("slots") or {}).get("stable") or {}
        status = {o["name"]: o.get("ok") for o in slot.get("objectives") or []}
        with self.lock:
            self.evaluations.append((at, status))
        self.replica_kv()

    def probe(self) -> None:
        from serving.ops.consistency import consistency_probe

        consistency_probe(serve_url=self.target.serve_url, deployment_ids=[self.deployment.pk])
        with self.lock:
            self.probes.append(time.time())

    # --- reading what happened -------------------------------------------------------------

    def status_since(self, name: str, since: float) -> list[tuple[float, bool | None]]:
        with self.lock:
            return [(at, s.get(name)) for at, s in self.evaluations if at >= since]

    def settle(self, name: str) -> dict[str, Any]:
        """Until the objective is measured and passing on two ticks in a row; then the open
        incidents are resolved, so the fault's breach is a new one."""
        from incidents.models import Incident
        from incidents.services import incident_resolve
        from portal.exceptions import PortalError

        started = time.time()
        quiet = False
        while time.time() - started < SETTLE_TIMEOUT_S:
            last = [ok for _, ok in self.status_since(name, started)][-2:]
            if len(last) == 2 and all(ok is True for ok in last):
                quiet = True
                break
            time.sleep(0.5)
        for incident in Incident.objects.filter(deployment_id=self.deployment.pk).exclude(
            status="resolved"
        ):
            with contextlib.suppress(PortalError):
                incident_resolve(
                    tenant=self.tenant, actor=None, incident=incident, reason="bench: next run"
                )
        return {"quiet_before": quiet, "settle_s": round(time.time() - started, 1)}

    def detect(self, name: str, injected: float) -> tuple[float | None, float | None, Any]:
        """(breach detected_at, first failing evaluation, breach value), None when none came."""
        from incidents.models import SlaBreach

        deadline = time.time() + DETECT_TIMEOUT_S
        while time.time() < deadline:
            breach = (
                SlaBreach.objects.filter(
                    deployment_id=self.deployment.pk,
                    objective=name,
                    detected_at__gte=datetime.fromtimestamp(injected, tz=UTC),
                )  # fmt: skip
                .order_by("detected_at")
                .first()
            )
            if breach is not None:
                # The tick that recorded it appends its evaluation once it returns.
                wait_until = time.time() + 3 * self.args.tick
                failing: list[float] = []
                while not failing and time.time() < wait_until:
                    failing = [at for at, ok in self.status_since(name, injected) if ok is False]
                    time.sleep(0.1)
                value = (breach.observed or {}).get("value")
                return breach.detected_at.timestamp(), (failing[0] if failing else None), value
            time.sleep(0.25)
        return None, None, None

    def replica_kv(self) -> list[dict[str, Any]]:
        """What each replica of the stable slot published last (its `kv`); every replica id
        seen is kept: a replica Serve replaced during the bench shows as a second one."""
        import json

        import redis

        client = redis.Redis.from_url(settings.REDIS_URL)
        try:
            raw = client.hgetall(f"{settings.SLI_KEY_PREFIX}:sli:{self.app}:stable")
        finally:
            client.close()
        snapshots = [json.loads(v) for v in raw.values()]
        with self.lock:
            self.replica_ids.update(str(s.get("replica")) for s in snapshots)
        return [s.get("kv") or {} for s in snapshots]

    def reported(self, pick: Callable[[dict[str, Any]], float | None], timeout: float) -> float:
        """The first time a replica's published kv satisfies `pick` (its value)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            for kv in self.replica_kv():
                found = pick(kv)
                if found is not None:
                    return found
            time.sleep(0.2)
        raise SystemExit("the replica never reported the fault")

    # --- the faults -----------------------------------------------------------------------

    def jitter(self, clients: Clients) -> tuple[float, float]:
        delay = float(self.args.delay_ms)
        spike = {"delay_ms": delay, "share": 0.5}
        injected = self.change("latency spike", faults=self.faults(latency_spike=spike))
        deadline = time.time() + 60
        while time.time() < deadline:
            slow = [
                a
                for a in clients.since(injected)
                if a[2] == 200 and a[1] - a[0] >= 0.8 * delay / 1000
            ]
            if slow:
                return injected, slow[0][1]
            time.sleep(0.2)
        raise SystemExit("no client answer showed the latency spike")

    def divergence(self, clients: Clients) -> tuple[float, float]:
        injected = self.change(
            "move stable to a version whose weights vanished", stable_version_id=self.broken_id
        )

        def failed(kv: dict[str, Any]) -> float | None:
            last = (kv.get("standby") or {}).get("last_failed_reload") or {}
            at = last.get("at")
            return float(at) if at and float(at) >= injected - 1 else None

        return injected, self.reported(failed, 60)

    def consistency(self, clients: Clients) -> tuple[float, float]:
        replace_file(self.other_weights, self.weights)
        return self._reload("reload the good version's artifact, now other weights")

    def _reload(self, reason: str) -> tuple[float, float]:
        self.nonce += 1
        nonce = self.nonce
        faults = self.faults(weight_swap_jitter={"reload": nonce})
        injected = self.change(reason, faults=faults)

        def done(kv: dict[str, Any]) -> float | None:
            reload = kv.get("fault_reload") or {}
            if reload.get("nonce") != nonce or reload.get("drill") != DRILL:
                return None
            if reload.get("ok") is False:
                raise SystemExit(f"the forced reload failed: {reload}")
            return float(reload["at"]) + float(reload.get("s") or 0)

        return injected, self.reported(done, 90)

    def revert(self, sli: str) -> None:
        if sli == "state_divergence":
            self.change(
                "stable back on the good version", stable_version_id=self.good_id, faults={}
            )
        elif sli == "output_consistency":
            replace_file(self.work / "good-weights.bak", self.weights)
            self._reload("reload the good weights")
            self.change("no faults", faults={})
        else:
            self.change("no faults", faults={})

    def one_run(self, sli: str, index: int, clients: Clients) -> dict[str, Any]:
        name = OBJECTIVES[sli]
        before = self.settle(name)
        # Settling ends just after the measurement that found the objective passing, so the
        # fault would always land at the same phase of its period: each run waits its own
        # share of the period first (stratified over the runs: (i - 0.5) / runs).
        period = {
            "output_consistency": self.args.probe_interval,
            "latency_p99_jitter": POINT_S,
        }.get(sli, self.args.tick)
        offset = round(period * (index - 0.5) / self.args.runs, 3)
        time.sleep(offset)
        injected, onset = getattr(self, name)(clients)
        detected, evaluated, value = self.detect(name, injected)
        self.revert(sli)
        record = {
            "sli": sli,
            "run": index,
            **before,
            "phase_offset_s": offset,
            "onset_after_change_s": round(onset - injected, 3),
            "detection_s": None if detected is None else round(detected - onset, 3),
            "evaluation_s": None if evaluated is None else round(evaluated - onset, 3),
            "value": value,
        }
        shown = "not detected" if detected is None else f"{record['detection_s']:6.2f} s"
        print(f"  {sli:<20} run {index}: detection {shown} (value {value})", flush=True)
        return record

    def kv_probe_control(self, clients: Clients) -> dict[str, Any]:
        """The KV pollution probe's fault in force and its replays sent (as the drill sends
        them: the tenant's fresh prompt twice, then the synthetic tenant's replay) for a probe
        interval and two ticks: the golden answers must not change, the alert stay quiet."""
        import httpx

        from incidents.drills.faults.base import PROBE_BODY, fresh_prompt
        from incidents.drills.faults.kv_probe import drill_probe_key
        from serving.dataplane.keys import hash_key
        from serving.deployments.keys import probe_key

        before = self.settle("consistency")
        identity_key = drill_probe_key(0)
        probe = {"identity": "drill-probe:bench", "key_hash": hash_key(identity_key)}
        injected = self.change("KV pollution probe", faults=self.faults(kv_pollution_probe=probe))
        tenant_key = probe_key(self.deployment.pk)
        replays = refused = 0
        end = time.time() + self.args.probe_interval + 2 * self.args.tick
        with httpx.Client(timeout=30, trust_env=False) as http:
            while time.time() < end:
                body = {**PROBE_BODY, "prompt": fresh_prompt(64)}
                for key in (tenant_key, tenant_key, identity_key):
                    answer = http.post(
                        self.url, json=body, headers={"authorization": f"Bearer {key}"}
                    )
                replays += 1
                refused += answer.status_code != 200
                time.sleep(0.2)
        detected, _, value = self.detect_now("consistency", injected)
        from serving.ops.consistency import consistency_scores

        seen = [
            (kv.get("tenants") or {}).get("drill-probe:bench") or {} for kv in self.replica_kv()
        ]
        with self.lock:
            probes = sum(1 for at in self.probes if at > injected)
        score = (consistency_scores(self.deployment.pk).get("stable") or {}).get("score")
        self.change("no faults", faults={})
        return {
            **before,
            "replays": replays,
            "replays_refused": refused,
            "replay_queries": sum(int(t.get("prefix_queries", 0)) for t in seen),
            "cross_tenant_hits": sum(int(t.get("prefix_hits", 0)) for t in seen),
            "golden_probes": probes,
            "consistency_score": score,
            "consistency_alert": detected is not None,
            "value": value,
            "seconds": round(time.time() - injected, 1),
        }

    def detect_now(self, name: str, since: float) -> tuple[float | None, None, Any]:
        from incidents.models import SlaBreach

        breach = SlaBreach.objects.filter(
            deployment_id=self.deployment.pk, objective=name,
            detected_at__gte=datetime.fromtimestamp(since, tz=UTC),
        ).first()  # fmt: skip
        if breach is None:
            return None, None, None
        return breach.detected_at.timestamp(), None, (breach.observed or {}).get("value")


def breaches(deployment_id: int, began: float) -> list[dict[str, Any]]:
    """Every breach record of the bench's deployment, seconds after the bench began."""
    from incidents.models import SlaBreach

    return [
        {
            "objective": b.objective,
            "at_s": round(b.detected_at.timestamp() - began, 2),
            "value": (b.observed or {}).get("value"),
            "detail": b.detail[:200],
        }
        for b in SlaBreach.objects.filter(deployment_id=deployment_id).order_by("detected_at")
    ]


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for sli in OBJECTIVES:
        runs = [r for r in records if r["sli"] == sli]
        found = [float(r["detection_s"]) for r in runs if r["detection_s"] is not None]
        evaluated = [float(r["evaluation_s"]) for r in runs if r["evaluation_s"] is not None]
        out[sli] = {
            "objective": OBJECTIVES[sli],
            "runs": len(runs),
            "detected": len(found),
            "detection_s": {
                "p50": median(found, 3),
                "p95": round(percentile(found, 0.95), 3) if found else None,
            },
            "evaluation_s_p50": median(evaluated, 3),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="one run of each, probe every 5 s")
    parser.add_argument("--tick", type=float, default=None, help="health tick interval, s")
    parser.add_argument("--probe-interval", type=float, default=None)
    parser.add_argument("--delay-ms", type=float, default=250.0)
    parser.add_argument("--output", type=Path, default=results_path("detection"))
    args = parser.parse_args(argv)
    schedule: dict[str, dict[str, Any]] = settings.CELERY_BEAT_SCHEDULE
    args.tick = args.tick or float(schedule["health-tick"]["schedule"])
    if args.probe_interval is None:
        args.probe_interval = (
            5.0 if args.quick else float(schedule["consistency-probe"]["schedule"])
        )
    if args.quick:
        args.runs = 1
    if args.runs < 1 or args.tick <= 0 or args.probe_interval <= 0:
        parser.error("--runs, --tick and --probe-interval must be positive")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    began, began_at = time.monotonic(), time.time()
    records: list[dict[str, Any]] = []
    control: dict[str, Any] = {}
    errors: dict[str, list[str]] = {}
    recorded: list[dict[str, Any]] = []
    replicas: list[str] = []
    with BenchSession("detection") as session:
        session.database()
        session.redis()
        work = session.workdir()
        _, target = session.ray_head(work)
        bench = Bench(args, target, work)
        bench.build()
        print("deploying ...", flush=True)
        bench.reconcile()
        clients = Clients(bench.url, bench.key, 2)
        session.callback(clients.close)
        ticker = Loop(args.tick, bench.tick)
        ticker.start()
        session.callback(ticker.close)
        records.extend(
            bench.one_run(sli, index, clients)
            for index in range(1, args.runs + 1)
            for sli in ("state_divergence", "latency_p99_jitter")
        )
        prober = Loop(args.probe_interval, bench.probe)
        prober.start()
        session.callback(prober.close)
        control = bench.kv_probe_control(clients)
        print(f"  kv_pollution_probe control: consistency alert {control['consistency_alert']}")
        records += [
            bench.one_run("output_consistency", i, clients) for i in range(1, args.runs + 1)
        ]
        errors = {"tick": ticker.errors, "probe": prober.errors}
        recorded = breaches(bench.deployment.pk, began_at)
        replicas = sorted(bench.replica_ids)
    summary = summarize(records)
    result = {
        "benchmark": "detection",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "quick": args.quick,
        "health_tick_s": args.tick,
        "consistency_probe_s": args.probe_interval,
        "series_point_s": POINT_S,
        "latency_spike": {"delay_ms": args.delay_ms, "share": 0.5},
        "contract": CONTRACT,
        "slis": summary,
        "kv_probe_control": control,
        "runs": records,
        "breaches": recorded,
        # One replica throughout: none crashed or was replaced under the faults.
        "replicas_seen": len(replicas),
        "loop_errors": errors,
        "environment": environment("ray"),
        "runtime_s": round(time.monotonic() - began, 1),
    }
    print()
    for sli, row in summary.items():
        d, found = row["detection_s"], f"{row['detected']}/{row['runs']}"
        print(f"  {sli:<20} detected {found}  p50 {d['p50']}  p95 {d['p95']} s")
    print(f"  health tick every {args.tick:g} s, golden probe every {args.probe_interval:g} s")
    write_results("detection", result, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
