"""`manage.py up`: one supervisor for the whole portal (the embedded PostgreSQL and Valkey
when no DATABASE_URL / REDIS_URL is given, Ray head, web, Celery worker and beat, GPU agent).

It starts every part as a child process, prefixes their output, stops all of them cleanly on
Ctrl-C / SIGTERM (SIGTERM, then SIGKILL after a grace period), and stops everything if one
part dies, exiting non-zero so a service manager notices.

The embedded servers (portal/embedded.py) start first, on 127.0.0.1 with their data under
PORTAL_DATA_DIR, and stop last. `--setup` then migrates and creates the demo tenant (what
`make up` runs), so one command takes a bare machine to a running portal.

The data plane: when the portal manages its own Ray head (no RAY_ADDRESS) and PORTAL_RAY is not
`off`, the head (serving.control.cluster's `run`) starts first and the other parts only once its
dashboard answers, so the worker's first reconcile finds Serve; it stops last, by PID. With
RAY_ADDRESS (an existing cluster) or PORTAL_RAY=off there is no `ray` part.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from signal import SIGINT
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from portal import embedded
from portal.console import Part, PartLog
from portal.demo_traffic import traffic_file
from serving.control import cluster
from serving.control.serve_api import ServeApiClient, ServeApiError

RAY_PART = "ray"
# (part, queues, processes): every queue of portal.celery.QUEUES has workers of its own, so a
# model validation (minutes) never waits behind a reconcile, nor a health tick behind either.
WORKERS = (
    ("worker", "default,chaos", 2),
    ("worker-health", "health", 1),
    ("worker-validation", "validation", 1),
    ("worker-checks", "checks", 1),
)
RAY_OFF_VALUES = ("off", "0", "false", "no")
# `cluster run` gives up by itself after `ray start` (120 s) plus the dashboard (90 s); this is
# the supervisor's own limit on top, for a head that hangs without saying so.
DEFAULT_RAY_TIMEOUT_S = 240.0
# SIGTERM to `cluster run` stops the head by PID in three steps (raylets, the rest, GCS) of up
# to its own grace each; the supervisor waits at least this long before killing it.
RAY_STOP_GRACE_S = 60.0


def ray_disabled(environ: dict[str, str] | None = None) -> bool:
    """PORTAL_RAY=off: run the portal without a data plane (deployments stay pending)."""
    env = os.environ if environ is None else environ
    return env.get("PORTAL_RAY", "").strip().lower() in RAY_OFF_VALUES


class Command(BaseCommand):
    help = (
        "Run the portal: local Ray head (unless RAY_ADDRESS or PORTAL_RAY=off), ASGI web server, "
        "Celery worker and Celery beat, under one supervisor."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--host", default=os.environ.get("PORTAL_HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--no-worker", action="store_true", help="do not start a worker")
        parser.add_argument("--no-beat", action="store_true", help="do not start beat")
        parser.add_argument("--no-traffic", action="store_true", help="no demo traffic")
        parser.add_argument(
            "--no-gpu-agent", action="store_true", help="do not run this node's GPU agent"
        )
        parser.add_argument("--grace", type=float, default=15.0, help="seconds to wait on stop")
        parser.add_argument(
            "--setup", action="store_true", help="migrate and create the demo tenant first"
        )
        parser.add_argument(
            "--verbose",
            action="store_true",
            default=os.environ.get("PORTAL_UP_VERBOSE", "") not in ("", "0"),
            help="every part's every line on the terminal (always in var/log/<part>.log)",
        )
        parser.add_argument(
            "--no-ray", action="store_true", help="do not start the local Ray head (PORTAL_RAY=off)"
        )
        parser.add_argument(
            "--ray-timeout",
            type=float,
            default=float(os.environ.get("PORTAL_RAY_START_TIMEOUT", DEFAULT_RAY_TIMEOUT_S)),
            help="seconds to wait for the local Ray head's dashboard",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        self._stopping = False
        self.verbose = opts["verbose"]
        self.demo = ""  # what --setup's demo_tenant printed, for the ready block
        self.target = self.ray_target(opts)
        services = self.embedded_parts()
        parts = self.plan(opts)
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)
        names = ", ".join(p.name for p in [*services, *parts])
        self.stdout.write(f"[up] starting {names}")
        ray = next((p for p in parts if p.name == RAY_PART), None)
        others = [p for p in parts if p is not ray]
        ready = self.start_embedded(services, opts["setup"])
        if not traffic_file(settings.DATA_DIR).is_file():  # no demo (yet): no traffic
            parts = [p for p in parts if p.name != "traffic"]
            others = [p for p in others if p.name != "traffic"]
        if ready and ray is not None:
            self.start(ray)
            ready = self.wait_ray(ray, opts["ray_timeout"])
        if ready and not self._stopping:
            if self.target is not None:
                self.enqueue_reconcile()
            for part in others:
                self.start(part)
            url = f"http://{opts['host']}:{opts['port']}/"
            ready = self.wait_ready(url + "healthz", [*services, *parts])
            if ready:
                self.ready_block(url)
        exit_code = self.watch([*services, *parts]) if ready else (0 if self._stopping else 1)
        self.stdout.write("[up] stopping")
        self.stop(others, opts["grace"])
        if ray is not None:
            self.stop_ray(ray, max(opts["grace"], RAY_STOP_GRACE_S))
        self.stop(services, opts["grace"])
        self.stdout.write(f"[up] stopped (exit {exit_code})")
        sys.stdout.flush()
        if exit_code:
            raise SystemExit(exit_code)

    def ready_block(self, url: str) -> None:
        """One block: where everything is, the demo login and key; then only what matters."""
        rule = "[up] " + "-" * 72
        shown = "every line" if self.verbose else "warnings, errors and state changes"
        lines = [rule, f"[up] portal ready on {url} (Ctrl-C stops everything)"]
        lines += [f"[up] {self.ray_summary()}"]
        lines += [f"[up] logs: {settings.DATA_DIR / 'log'}/<part>.log; here: {shown}"]
        self.stdout.write("\n".join([*lines, *([self.demo.rstrip()] if self.demo else []), rule]))

    def embedded_parts(self) -> list[Part]:
        """The embedded PostgreSQL and Valkey, where no DATABASE_URL / REDIS_URL names a server."""
        config = settings.EMBEDDED
        parts = []
        if settings.EMBEDDED_POSTGRES:
            postgres = embedded.postgres_argv(config)
            parts.append(Part("postgres", postgres, user=embedded.run_as(), stop_signal=SIGINT))
        if settings.EMBEDDED_REDIS:
            parts.append(Part("valkey", embedded.valkey_argv(config)))
        return parts

    def start_embedded(self, parts: list[Part], setup: bool) -> bool:
        """Start the embedded servers, wait until they answer, create the portal's database;
        with `setup`, migrate and create the demo tenant. False if something failed."""
        config = settings.EMBEDDED
        checks = {
            "postgres": lambda: embedded.postgres_ready(config),
            "valkey": lambda: embedded.valkey_ready(config),
        }
        ports = {"postgres": config.pg_port, "valkey": config.redis_port}
        for part in parts:
            if checks[part.name]():
                self.stderr.write(
                    f"[up] something already answers on 127.0.0.1:{ports[part.name]}, where the "
                    f"embedded {part.name} would listen: stop it, or choose another port "
                    "(PORTAL_EMBEDDED_PG_PORT / PORTAL_EMBEDDED_REDIS_PORT)"
                )
                return False
            if part.name == "postgres":
                embedded.postgres_init(config)
            self.start(part)

            def answers(part: Part = part) -> bool:
                if part.process is not None and part.process.poll() is not None:
                    raise RuntimeError(f"the embedded {part.name} exited")
                return checks[part.name]() or self._stopping

            try:
                embedded.wait(answers, part.name)
            except RuntimeError as exc:
                self.stderr.write(f"[up] {exc}; see the [{part.name}] lines above")
                return False
            if self._stopping:
                return False
        if settings.EMBEDDED_POSTGRES and embedded.create_database(config):
            self.stdout.write(f"[up] created the database {embedded.DATABASE}")
        if setup:
            call_command("migrate", interactive=False, verbosity=0)
            demo = io.StringIO()
            call_command("demo_tenant", stdout=demo)
            self.demo = demo.getvalue()
            connections.close_all()  # the parts open their own
        return not self._stopping

    def ray_target(self, opts: dict[str, Any]) -> cluster.RayTarget | None:
        """Where the data plane is; None when it is off."""
        if opts["no_ray"] or ray_disabled():
            return None
        try:
            return cluster.ray_target_from_env()
        except cluster.ClusterConfigError as exc:
            raise CommandError(f"Ray: {exc} (or set PORTAL_RAY=off to run without it)") from exc

    def enqueue_reconcile(self) -> None:
        """One reconcile for the worker to run first: a fresh local head has no Serve apps, and
        an existing cluster may have drifted while the portal was down (unchanged: skipped)."""
        from serving.deployments.reconcile import has_deployments
        from serving.deployments.tasks import reconcile

        try:
            if not has_deployments() and settings.GPU_AGENT_MODE != "ray":
                return  # (in ray mode the GPU samplers are declared even without deployments)
            reconcile.delay()
        except Exception as exc:  # a broker hiccup must not stop the portal
            self.stderr.write(f"[up] could not enqueue a reconcile of the deployments: {exc}")
            return
        finally:
            connections.close_all()  # the supervisor holds no connection while the parts run
        self.stdout.write("[up] reconcile enqueued: the worker applies the deployments to Ray")

    def ray_summary(self) -> str:
        target = self.target
        if target is None:
            return "Ray: off (PORTAL_RAY=off); deployments stay pending"
        where = (
            f"local head {target.address}, dashboard {target.dashboard_url}"
            if target.managed
            else f"existing cluster {target.address}, dashboard {target.dashboard_url}"
        )
        return (
            f"Ray: {where}; Serve proxy on {target.serve_url}/<tenant>/<deployment>/v1/ "
            "(listening once a deployment is applied)"
        )

    def plan(self, opts: dict[str, Any]) -> list[Part]:
        py = sys.executable
        parts = []
        if self.target is not None and self.target.managed:
            parts.append(
                Part(
                    RAY_PART,
                    [py, "-m", "serving.control.cluster", "run"],
                    ready_marker='"started": true',
                )
            )
        web = [py, "-m", "portal.serve", "--host", opts["host"], "--port", str(opts["port"])]
        parts.append(Part("web", web))
        if not opts["no_gpu_agent"]:
            # GPU_AGENT_MODE=ray: the samplers run in Ray (declared with the deployments);
            # this part relays them. Otherwise this machine's own agent.
            relay = ["--relay"] if settings.GPU_AGENT_MODE == "ray" else []
            parts.append(Part("gpu-agent", [py, "manage.py", "gpu_agent", *relay]))
        if not opts["no_worker"]:
            for name, queues, concurrency in WORKERS:
                argv = [py, "-m", "celery", "-A", "portal", "worker", "-Q", queues, "-n"]
                argv += [f"{name}@%h", "--concurrency", str(concurrency), "--loglevel", "INFO"]
                parts.append(Part(name, [*argv, "--without-gossip", "--without-mingle"]))
        if self.target is not None and not opts["no_traffic"]:
            traffic = str(traffic_file(settings.DATA_DIR))
            parts.append(Part("traffic", [py, "-m", "portal.demo_traffic", traffic]))
        if not opts["no_beat"]:
            beat = [py, "-m", "celery", "-A", "portal", "beat", "-l", "INFO", "-s"]
            parts.append(Part("beat", [*beat, str(settings.DATA_DIR / "celerybeat-schedule")]))
        return parts

    def start(self, part: Part) -> None:
        part.process = subprocess.Popen(  # noqa: S603  (argv built from sys.executable and fixed args)
            part.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches the supervisor only; it stops parts in order
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            **embedded.identity(part.user),
        )
        part.log = PartLog(settings.DATA_DIR / "log" / f"{part.name}.log", verbose=self.verbose)
        part.reader = threading.Thread(target=self._pump, args=(part,), daemon=True)
        part.reader.start()
        self.stdout.write(f"[up] {part.name} started (pid {part.process.pid})")

    def _pump(self, part: Part) -> None:
        if part.process is None or part.process.stdout is None:
            return
        for raw in part.process.stdout:
            line = raw.decode(errors="replace").rstrip()
            if part.log is None or part.log.line(line):
                self.stdout.write(f"[{part.name}] {line}")
                self.stdout.flush()
            if part.ready_marker is not None and part.ready_marker in line:
                part.ready.set()

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._stopping = True

    def wait_ready(self, url: str, parts: list[Part], timeout: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self._stopping:
            if any(p.process is not None and p.process.poll() is not None for p in parts):
                self.stderr.write("[up] a part exited during start-up")
                return False
            try:
                with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 (loopback)
                    if response.status == 200:
                        return True
            except OSError:
                time.sleep(0.3)
        return False

    def wait_ray(self, part: Part, timeout: float) -> bool:
        """Until the head printed its started line or its dashboard answers; False on failure."""
        target = self.target
        if target is None or target.local_head is None:  # plan() adds the part only then
            return True
        head = target.local_head
        probe = ServeApiClient(target.dashboard_url, target.token, timeout=2.0)
        self.stdout.write(f"[up] waiting for the Ray head (dashboard {target.dashboard_url})")
        deadline = time.monotonic() + timeout
        next_probe = time.monotonic() + 2.0
        while not self._stopping:
            if part.ready.wait(timeout=0.3):
                break
            code = part.process.poll() if part.process is not None else None
            if code is not None:
                self.stderr.write(
                    f"[up] the Ray head did not start (exit {code}); see the [ray] lines above "
                    f"and {head.log_path}. PORTAL_RAY=off runs the portal without it."
                )
                return False
            if time.monotonic() >= next_probe:
                next_probe = time.monotonic() + 2.0
                try:
                    probe.details()
                except ServeApiError:
                    pass
                else:
                    break
            if time.monotonic() >= deadline:
                self.stderr.write(
                    f"[up] the Ray head's dashboard ({target.dashboard_url}) did not answer in "
                    f"{timeout:.0f}s; see {head.log_path}. PORTAL_RAY=off runs the portal "
                    "without it."
                )
                return False
        if self._stopping:
            return False
        self.stdout.write(f"[up] Ray head ready: Serve proxy will listen on {target.serve_url}")
        return True

    def watch(self, parts: list[Part]) -> int:
        while not self._stopping:
            for part in parts:
                code = part.process.poll() if part.process is not None else 0
                if code is not None:
                    self.stderr.write(f"[up] {part.name} exited with {code}; stopping the portal")
                    return code or 1
            time.sleep(0.3)
        return 0

    def stop(self, parts: list[Part], grace: float) -> None:
        for part in reversed(parts):
            if part.process is not None and part.process.poll() is None:
                part.process.send_signal(part.stop_signal)  # warm shutdown; it stops its children
        deadline = time.monotonic() + grace
        for part in reversed(parts):
            if part.process is None:
                continue
            try:
                part.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.stderr.write(f"[up] {part.name} did not stop in {grace}s; killing it")
                os.killpg(part.process.pid, signal.SIGKILL)
                part.process.wait()
            if part.reader is not None:
                part.reader.join(timeout=2)
            if part.log is not None:
                part.log.close()

    def stop_ray(self, part: Part, grace: float) -> None:
        """Stop the head last; if `cluster run` could not, stop what is left of it by PID."""
        self.stop([part], grace)
        target = self.target
        if target is None or target.local_head is None:
            return
        try:
            left = cluster.stop_head(target.local_head)  # a no-op once `run` stopped it
        except OSError as exc:
            self.stderr.write(f"[up] could not check the Ray head is stopped: {exc}")
            return
        if left:
            self.stderr.write(f"[up] stopped Ray processes left behind: {left}")
