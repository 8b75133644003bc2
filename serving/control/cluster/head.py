"""Starting, stopping and probing the portal's local Ray head.

The head runs in a session of its own, recorded in `head.json` under its data dir, so any later
process can stop it by PID, never by process name: other Ray clusters may share the host.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from serving.control.cluster.config import (
    DEFAULT_GRACE_S,
    LOOPBACK,
    REPO_ROOT,
    ClusterStartError,
    LocalHeadConfig,
    ensure_token,
)
from serving.control.cluster.hooks import SETUP_HOOK, SETUP_HOOK_ENV
from serving.control.cluster.procs import ProcInfo, all_procs, read_proc, stop_processes
from serving.control.serve_api import ServeApiClient, ServeApiError

# Environment of the portal process that must not leak into the local head it starts.
_FOREIGN_RAY_ENV = ("RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH", "RAY_DASHBOARD_URL", "RAY_SERVE_URL")


@dataclass
class HeadState:
    """What `start_head` records in `state_path`, so any later process can stop this head."""

    session_id: int  # pid of the `ray start` we ran in a new session; every Ray daemon inherits it
    session_start_ticks: int
    started_at: float
    gcs_address: str
    dashboard_url: str
    serve_url: str
    temp_dir: str
    pids: list[tuple[int, int]] = field(default_factory=list)  # (pid, start_ticks) at start-up
    ready: bool = False

    def write(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(path)

    @classmethod
    def read(cls, path: Path) -> HeadState | None:
        try:
            raw = json.loads(path.read_text())
            raw["pids"] = [(int(p), int(t)) for p, t in raw.get("pids", [])]
            return cls(**raw)
        except (OSError, ValueError, TypeError):
            return None


def head_processes(state: HeadState) -> list[ProcInfo]:
    """Live processes of the head: its session's Ray processes plus those recorded at start."""
    recorded = set(state.pids)
    found = []
    for info in all_procs():
        if info.pid == os.getpid() or info.state in ("Z", "X"):
            continue
        in_session = (
            info.session == state.session_id
            and info.start_ticks >= state.session_start_ticks
            # A reused session id would have to belong to a Ray process to be mistaken for ours.
            and "ray" in info.cmdline.lower()
        )
        if in_session or (info.pid, info.start_ticks) in recorded:
            found.append(info)
    return found


def head_command(config: LocalHeadConfig) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "ray.scripts.scripts",
        "start",
        "--head",
        "--node-ip-address",
        LOOPBACK,
        "--port",
        str(config.gcs_port),
        "--dashboard-host",
        LOOPBACK,
        "--dashboard-port",
        str(config.dashboard_port),
        "--include-dashboard=true",
        "--dashboard-agent-listen-port",
        str(config.dashboard_agent_port),
        "--ray-client-server-port",
        str(config.client_server_port),
        "--num-cpus",
        str(config.num_cpus),
        "--object-store-memory",
        str(config.object_store_bytes),
        "--temp-dir",
        str(config.temp_dir),
        "--disable-usage-stats",
        # The log monitor only streams worker logs to attached drivers; the portal has none.
        "--include-log-monitor=false",
    ]
    if config.num_gpus is not None:
        argv += ["--num-gpus", str(config.num_gpus)]
    return argv


def head_env(
    config: LocalHeadConfig, token: str, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    for name in _FOREIGN_RAY_ENV:
        env.pop(name, None)
    paths = [str(p) for p in config.pythonpath]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env.update(
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN=token,
        # Without it Ray binds some listeners to the host's external address despite
        # --node-ip-address 127.0.0.1.
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
        RAY_USAGE_STATS_ENABLED="0",
        # Each worker in its own process group, killed with it even when it crashes: a replica's
        # own children (vLLM's engine core and workers) never outlive it.
        RAY_process_group_cleanup_enabled="1",
        # Serve's Python API default (REST configs get theirs from the client's http_options).
        RAY_SERVE_DEFAULT_HTTP_HOST=LOOPBACK,
        PYTHONPATH=os.pathsep.join(paths),
        AUTOSCALER_METRIC_PORT=str(config.autoscaler_metrics_port),
        DASHBOARD_METRIC_PORT=str(config.dashboard_metrics_port),
    )
    env[SETUP_HOOK_ENV] = SETUP_HOOK
    return env


def ports_in_use(config: LocalHeadConfig) -> dict[str, int]:
    busy = {}
    for name, port in config.fixed_ports().items():
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((LOOPBACK, port))
            except OSError:
                busy[name] = port
    return busy


@dataclass
class HeadStatus:
    running: bool
    state: HeadState | None
    processes: list[ProcInfo]
    dashboard_ok: bool
    dashboard_error: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "running": self.running,
            "dashboard_ok": self.dashboard_ok,
            "dashboard_error": self.dashboard_error,
            "state": asdict(self.state) if self.state else None,
            "processes": [
                {"pid": p.pid, "name": p.name, "cmdline": p.cmdline[:160]} for p in self.processes
            ],
        }


def head_status(config: LocalHeadConfig, *, probe: bool = True) -> HeadStatus:
    """Running means the recorded raylet and GCS are alive; `probe` also asks the dashboard."""
    state = HeadState.read(config.state_path)
    if state is None:
        return HeadStatus(running=False, state=None, processes=[], dashboard_ok=False)
    procs = head_processes(state)
    names = {p.name for p in procs}
    running = {"raylet", "gcs_server"} <= names
    ok, error = False, ""
    if running and probe:
        ok, error = dashboard_ok(config.dashboard_url, ensure_token(config.token_path))
    return HeadStatus(
        running=running, state=state, processes=procs, dashboard_ok=ok, dashboard_error=error
    )


def dashboard_ok(dashboard_url: str, token: str) -> tuple[bool, str]:
    try:
        # The Serve endpoint, not a health one: it answers only once the Serve module is up.
        ServeApiClient(dashboard_url, token, timeout=5.0).details()
    except ServeApiError as exc:
        return False, str(exc)
    return True, ""


def _log_tail(path: Path, lines: int = 30) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


@contextlib.contextmanager
def _head_lock(config: LocalHeadConfig) -> Iterator[None]:
    """One start or stop at a time per data dir (supervisor, CLI and tests may race)."""
    config.ray_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    with (config.ray_dir / "head.lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def start_head(
    config: LocalHeadConfig, *, timeout: float = 120.0, ready_timeout: float = 90.0
) -> HeadState:
    """Start the head (idempotent: a running one is returned as is) and wait for its dashboard."""
    with _head_lock(config):
        return _start_head(config, timeout=timeout, ready_timeout=ready_timeout)


def stop_head(config: LocalHeadConfig, *, grace: float = DEFAULT_GRACE_S) -> list[int]:
    """Stop every process of the recorded head by PID; returns the PIDs that were signalled."""
    with _head_lock(config):
        return _stop_head(config, grace=grace)


def _start_head(config: LocalHeadConfig, *, timeout: float, ready_timeout: float) -> HeadState:
    status = head_status(config, probe=False)
    if status.running and status.state is not None:
        return status.state
    if status.state is not None:  # leftovers of a head that died: clear them before reusing ports
        stop_processes(status.processes)
        config.state_path.unlink(missing_ok=True)
    busy = ports_in_use(config)
    if busy:
        taken = ", ".join(f"{name} {port}" for name, port in busy.items())
        raise ClusterStartError(f"ports already in use on {LOOPBACK}: {taken}")
    token = ensure_token(config.token_path)
    config.temp_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    with config.log_path.open("ab") as log:
        log.write(f"\n--- ray start at {time.ctime()}\n".encode())
        log.flush()
        process = subprocess.Popen(  # noqa: S603 (argv is sys.executable and fixed flags)
            head_command(config),
            env=head_env(config, token),
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            # A session of its own: every daemon and worker of this head inherits the id, which
            # is how stop finds them all without matching process names.
            start_new_session=True,
        )
    leader = read_proc(process.pid)
    state = HeadState(
        session_id=process.pid,
        session_start_ticks=leader.start_ticks if leader else 0,
        started_at=time.time(),
        gcs_address=config.gcs_address,
        dashboard_url=config.dashboard_url,
        serve_url=config.serve_url,
        temp_dir=str(config.temp_dir),
    )
    # Written before waiting, so a start that hangs or crashes can still be stopped by PID.
    state.write(config.state_path)
    try:
        returncode = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        returncode = None
    if returncode != 0:
        _stop_head(config, grace=DEFAULT_GRACE_S)
        outcome = f"exit {returncode}" if returncode is not None else f"no result in {timeout}s"
        raise ClusterStartError(f"ray start failed ({outcome}):\n{_log_tail(config.log_path)}")
    state.pids = [(p.pid, p.start_ticks) for p in head_processes(state)]
    state.write(config.state_path)
    deadline = time.monotonic() + ready_timeout
    while True:
        ok, error = dashboard_ok(config.dashboard_url, token)
        if ok:
            break
        if time.monotonic() >= deadline:
            _stop_head(config, grace=DEFAULT_GRACE_S)
            raise ClusterStartError(f"dashboard not ready in {ready_timeout}s: {error}")
        time.sleep(0.25)
    state.ready = True
    state.write(config.state_path)
    return state


def _stop_head(config: LocalHeadConfig, *, grace: float) -> list[int]:
    state = HeadState.read(config.state_path)
    if state is None:
        return []
    procs = head_processes(state)
    stop_processes(procs, grace=grace)
    # Workers the raylet spawned while we were stopping it (same session) go the same way.
    late = head_processes(state)
    if late:
        stop_processes(late, grace=grace)
    config.state_path.unlink(missing_ok=True)
    return sorted({p.pid for p in [*procs, *late]})
