"""The command line of the local Ray head, for humans and for the `up` supervisor.

    python -m serving.control.cluster start|stop|status|run

(`__main__.py` runs `main` here.)
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from types import FrameType
from typing import Any

from serving.control.cluster.config import (
    DEFAULT_GRACE_S,
    ClusterConfigError,
    ClusterStartError,
    LocalHeadConfig,
    ray_target_from_env,
)
from serving.control.cluster.head import (
    dashboard_ok,
    head_processes,
    head_status,
    start_head,
    stop_head,
)
from serving.control.cluster.procs import is_alive


def _print(payload: Mapping[str, Any]) -> None:
    sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")
    sys.stdout.flush()


def _run_foreground(config: LocalHeadConfig, grace: float) -> int:
    """Start (or adopt) the head, then hold it until SIGTERM/SIGINT or until the head dies."""
    stopping = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    state = start_head(config)
    _print({"started": True, "dashboard": config.dashboard_url, "serve": config.serve_url})
    # Watching the two vital pids is cheap; a full /proc scan every second is not.
    vital = [p for p in head_processes(state) if p.name in ("raylet", "gcs_server")]
    exit_code = 0
    while not stopping:
        time.sleep(0.5)
        if not all(is_alive(p.pid, p.start_ticks) for p in vital):
            sys.stderr.write("ray head died (raylet or GCS gone); stopping what is left\n")
            exit_code = 1
            break
    stopped = stop_head(config, grace=grace)
    _print({"stopped": stopped})
    return exit_code


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m serving.control.cluster",
        description="Manage the portal's local Ray head (never touches other Ray clusters).",
    )
    parser.add_argument("command", choices=("start", "stop", "status", "run"))
    parser.add_argument(
        "--grace", type=float, default=DEFAULT_GRACE_S, help="seconds from SIGTERM to SIGKILL"
    )
    args = parser.parse_args(argv)
    try:
        target = ray_target_from_env()
    except ClusterConfigError as exc:
        sys.stderr.write(f"{exc}\n")
        return 2
    config = target.local_head
    if config is None:
        if args.command != "status":
            sys.stderr.write(
                "RAY_ADDRESS names an existing cluster; the portal does not manage it\n"
            )
            return 2
        ok, error = dashboard_ok(target.dashboard_url, target.token)
        _print({"managed": False, "address": target.address, "dashboard_ok": ok, "error": error})
        return 0 if ok else 3
    try:
        if args.command == "start":
            start_head(config)
            _print(head_status(config).as_dict())
            return 0
        if args.command == "stop":
            _print({"stopped": stop_head(config, grace=args.grace)})
            return 0
        if args.command == "run":
            return _run_foreground(config, args.grace)
    except ClusterStartError as exc:
        sys.stderr.write(f"{exc}\n")
        return 1
    status = head_status(config)
    _print(status.as_dict())
    return 0 if status.running and status.dashboard_ok else 3
