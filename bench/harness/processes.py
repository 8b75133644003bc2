"""The processes a benchmark starts: free loopback ports, children that die with the bench,
a local Ray head (serving.control.cluster: 127.0.0.1 only, its own ports, stopped by PID),
Celery worker and beat."""

from __future__ import annotations

import contextlib
import ctypes
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.harness.env import REPO_ROOT

PR_SET_PDEATHSIG = 1
# Redis and the portal own these; Ray hands 10002-19999 to its workers and refuses overlaps.
RESERVED_PORTS = {6379, 8000}
RAY_WORKER_PORTS = range(10002, 20000)


def free_ports(count: int) -> list[int]:
    """Distinct free ports on 127.0.0.1 (all held open together, so none repeats), none of
    Redis', the portal's or Ray's worker range."""
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < count:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            held.append(sock)
            port = sock.getsockname()[1]
            if port not in RESERVED_PORTS and port not in RAY_WORKER_PORTS:
                ports.append(port)
    finally:
        for sock in held:
            sock.close()
    return ports


def free_port() -> int:
    return free_ports(1)[0]


def die_with_parent() -> None:
    """preexec_fn of every child: SIGTERM when the bench goes, even on SIGKILL (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def start_process(
    args: list[str],
    env: dict[str, str],
    log: Path,
    ready: str,
    *,
    timeout: float = 120.0,
) -> subprocess.Popen[Any]:
    """Start `args` (output to `log`) and wait until `ready` appears in the log."""
    handle = log.open("w")
    process = subprocess.Popen(  # noqa: S603 (this interpreter and fixed flags)
        args,
        cwd=REPO_ROOT,
        env=env,
        stdout=handle,
        stderr=subprocess.STDOUT,
        preexec_fn=die_with_parent,  # noqa: PLW1509 (prctl only)
    )
    handle.close()
    deadline = time.monotonic() + timeout
    while ready not in log.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            stop_process(process, timeout=5)
            what = " ".join(args[1:5])
            raise SystemExit(f"{what} did not start:\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.2)
    return process


def stop_process(process: Any, timeout: float = 20.0) -> None:
    """SIGTERM, then SIGKILL after `timeout` (this process's own child, by its handle)."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


def ray_head_config(data_dir: Path, *, num_cpus: int = 2) -> Any:
    """A LocalHeadConfig on 7 fresh loopback ports (never 6379)."""
    from serving.control.cluster import LocalHeadConfig

    ports = free_ports(7)
    return LocalHeadConfig(
        data_dir=data_dir,
        gcs_port=ports[0],
        dashboard_port=ports[1],
        serve_port=ports[2],
        client_server_port=ports[3],
        dashboard_agent_port=ports[4],
        autoscaler_metrics_port=ports[5],
        dashboard_metrics_port=ports[6],
        num_cpus=num_cpus,
        num_gpus=0,
    )


def celery_worker(
    env: dict[str, str], log: Path, *, queues: str = "default,health", concurrency: int = 2
) -> subprocess.Popen[Any]:
    return start_process(
        [sys.executable, "-m", "celery", "-A", "portal", "worker", "-Q", queues,
         "--concurrency", str(concurrency), "--without-gossip", "--without-mingle",
         "-l", "INFO"],
        env, log, "ready",
    )  # fmt: skip


def celery_beat(env: dict[str, str], work: Path) -> subprocess.Popen[Any]:
    return start_process(
        [sys.executable, "-m", "celery", "-A", "portal", "beat", "-S",
         "celery.beat:PersistentScheduler", "-s", str(work / "beat-schedule"), "-l", "INFO"],
        env, work / "beat.log", "beat: Starting",
    )  # fmt: skip
