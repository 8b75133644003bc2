"""A second Ray node joined to the session's head: a real two-node cluster on one host.

The node is a second raylet (`ray start --address`) with its own temp dir, resources and Serve
proxy port, started in a mount namespace of its own in which the given folders are empty
tmpfs mounts: its replicas cannot read the portal's artifact folders, as on another machine.
Its processes share a session (started with a new one), and are stopped by PID at the end.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serving.control.cluster import LOOPBACK, HeadState, head_processes
from serving.control.cluster.config import REPO_ROOT
from serving.control.cluster.head import head_env
from serving.control.cluster.procs import read_proc, stop_processes
from tests.ray_cluster import RayCluster, free_ports

# Mount a tmpfs over each folder named in $HIDE, then become `ray start`.
_HIDE_SCRIPT = (
    'set -e; for d in $HIDE; do mount -t tmpfs -o size=1m,mode=0700 portal-hidden "$d"; done; '
    'exec "$@"'
)

# `ray start --address` on this host: the head runs with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
# (without it Ray binds listeners to the external address), under which `ray start` refuses to
# join a cluster; with it, Ray rewrites a loopback --address to the external one. The CLI is
# run with the refusal lifted and the address left as given; every process it starts keeps
# the variable at 0 and binds loopback (the test checks each listener of the node).
_JOIN_ON_LOOPBACK = (
    "import sys; from ray._private import ray_constants, services; "
    "ray_constants.ENABLE_RAY_CLUSTER = True; "
    "services.resolve_ip_for_localhost = lambda host: host; "
    "from ray.scripts.scripts import main; sys.argv[0] = 'ray'; main()"
)


@dataclass(frozen=True)
class Node:
    node_id: str
    proxy_url: str
    resources: dict[str, float]
    state: HeadState
    cache_dir: Path

    def pids(self) -> set[int]:
        return {p.pid for p in head_processes(self.state)}


def _node_id(cluster: RayCluster, resource: str, timeout: float = 60) -> str:
    client = cluster.client()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for node in client.nodes():
            if node.get("state") == "ALIVE" and resource in (node.get("resources_total") or {}):
                return str(node["node_id"])
        time.sleep(0.5)
    raise AssertionError(f"no alive node with resource {resource!r} joined in {timeout}s")


@contextlib.contextmanager
def second_node(
    cluster: RayCluster, *, resources: dict[str, float], hide: list[Path], num_cpus: int = 2
) -> Iterator[Node]:
    for folder in hide:
        if " " in str(folder) or not folder.is_dir():
            raise ValueError(f"cannot hide {folder}")
    temp_dir = Path(tempfile.mkdtemp(prefix="ray-n2-"))  # short: Ray's socket paths are bounded
    cache_dir = temp_dir / "artifacts"
    proxy_port, agent_port, metrics_port = free_ports(3)
    argv = [
        sys.executable, "-c", _JOIN_ON_LOOPBACK, "start",
        "--address", cluster.target.address,
        "--node-ip-address", LOOPBACK,
        "--num-cpus", str(num_cpus),
        "--num-gpus", "0",
        "--resources", json.dumps(resources),
        "--object-store-memory", str(80 * 1000 * 1000),
        "--temp-dir", str(temp_dir),
        "--dashboard-agent-listen-port", str(agent_port),
        "--metrics-export-port", str(metrics_port),
        "--disable-usage-stats",
        "--include-log-monitor=false",
    ]  # fmt: skip
    env: dict[str, Any] = head_env(cluster.config, cluster.token)
    env.update(
        HIDE=" ".join(str(f) for f in hide),
        # This node's Serve proxy: its own port (the head's binds the configured one).
        RAY_SERVE_WORKER_PROXY_HTTP_PORT=str(proxy_port),
        PORTAL_ARTIFACT_CACHE_DIR=str(cache_dir),
    )
    unshare = shutil.which("unshare")
    if unshare is None:
        raise AssertionError("the two-node test needs util-linux's unshare (a mount namespace)")
    log = temp_dir / "start.log"
    with log.open("wb") as out:
        process = subprocess.Popen(  # noqa: S603 (fixed argv)
            [unshare, "--mount", "--propagation", "private", "--", "sh", "-c", _HIDE_SCRIPT,
             "sh", *argv],
            env=env, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    leader = read_proc(process.pid)
    state = HeadState(
        session_id=process.pid,
        session_start_ticks=leader.start_ticks if leader else 0,
        started_at=time.time(),
        gcs_address=cluster.target.address,
        dashboard_url="",
        serve_url="",
        temp_dir=str(temp_dir),
    )
    try:
        code = process.wait(timeout=120)
        if code != 0:
            raise AssertionError(f"the second node did not start ({code}):\n{log.read_text()}")
        resource = next(iter(resources))
        yield Node(
            node_id=_node_id(cluster, resource),
            proxy_url=f"http://{LOOPBACK}:{proxy_port}",
            resources=dict(resources),
            state=state,
            cache_dir=cache_dir,
        )
    finally:
        for _ in range(3):  # workers the raylet spawns while it stops go the same way
            procs = head_processes(state)
            if not procs:
                break
            stop_processes(procs)
        leftover = head_processes(state)
        shutil.rmtree(temp_dir, ignore_errors=True)
        assert not leftover, f"second node processes left behind: {leftover}"


def sees(pid: int, path: Path) -> bool:
    """Whether process `pid` sees `path` with anything in it (through its own mounts)."""
    inside = Path(f"/proc/{pid}/root") / path.relative_to("/")
    try:
        return any(inside.iterdir())
    except OSError:
        return False


def listeners(pids: set[int]) -> set[str]:
    """Local addresses the processes `pids` listen on (TCP, from `ss -ltnp`)."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    found = set()
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 6 and any(f"pid={pid}," in fields[-1] for pid in pids):
            found.add(fields[3])
    return found


def loopback_only(addresses: set[str]) -> bool:
    """Every `host:port` (ss's form: IPv6 in brackets, v4-mapped included) is on loopback."""
    for address in addresses:
        host = address.rsplit(":", 1)[0].strip("[]")
        ip = ipaddress.ip_address(host)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if not ip.is_loopback:
            return False
    return bool(addresses)


class OtlpReceiver:
    """An OTLP/HTTP trace receiver on loopback: what the replicas export, decoded."""

    def __init__(self) -> None:
        import http.server
        import threading

        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        self.spans: list[dict[str, Any]] = []
        received = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                export = ExportTraceServiceRequest.FromString(body)
                for resource in export.resource_spans:
                    service = next(
                        (a.value.string_value for a in resource.resource.attributes
                         if a.key == "service.name"), "",
                    )  # fmt: skip
                    for scope in resource.scope_spans:
                        for span in scope.spans:
                            received.spans.append({
                                "name": span.name, "service": service,
                                "trace_id": span.trace_id.hex(), "span_id": span.span_id.hex(),
                                "parent": span.parent_span_id.hex(),
                            })  # fmt: skip
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self.url = f"http://{LOOPBACK}:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def trace(self, trace_id: str, names: set[str], timeout: float = 30) -> dict[str, Any]:
        """The spans of `trace_id` by name, once all of `names` arrived."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = {s["name"]: s for s in self.spans if s["trace_id"] == trace_id}
            if names <= set(found):
                return found
            time.sleep(0.2)
        raise AssertionError(f"spans of {trace_id}: {sorted(found)}, wanted {sorted(names)}")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
