"""Where the portal's Ray cluster is, and the local Ray head the portal starts and stops itself.

A target is either the local head managed by the portal (the embedded default: every listener on
127.0.0.1, token auth on, ports of its own so it never takes Redis' 6379 or the portal's 8000) or
an existing cluster named by RAY_ADDRESS + RAY_DASHBOARD_URL + RAY_AUTH_TOKEN (+ RAY_SERVE_URL).
The local head is stopped by the processes of the session it was started in, never by process
name: other Ray clusters may share the host. Usable without Django: plain paths and ports.

    python -m serving.control.cluster start|stop|status|run
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import importlib
import ipaddress
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

from serving.control import host
from serving.control.serve_api import ServeApiClient, ServeApiError

LOOPBACK = "127.0.0.1"
REPO_ROOT = Path(__file__).resolve().parents[2]

DEFAULT_GCS_PORT = 6390  # Ray's default 6379 is Redis' port
DEFAULT_DASHBOARD_PORT = 8265
DEFAULT_SERVE_PORT = 8001  # Serve's default 8000 is the portal's port
# Ray's fixed defaults for these two (10001, 52365) would collide with any other head on the host.
DEFAULT_CLIENT_SERVER_PORT = 6391
DEFAULT_DASHBOARD_AGENT_PORT = 6392
# Prometheus exporters of the autoscaler monitor and the dashboard: Ray fixes them at 44217 and
# 44227 for every head (only env variables move them).
DEFAULT_AUTOSCALER_METRICS_PORT = 6393
DEFAULT_DASHBOARD_METRICS_PORT = 6394
DEFAULT_NUM_CPUS = 2
DEFAULT_OBJECT_STORE_MB = 200
# Ray puts Unix sockets at <temp>/session_<date>_<time>_<usec>_<pid>/sockets/plasma_store; the
# kernel limit for such a path is 107 bytes, so a longer temp dir moves to a short hashed one.
MAX_TEMP_DIR_LEN = 40
# Seconds between SIGTERM and SIGKILL per stop step (raylets, the rest, GCS): well inside the
# `up` supervisor's own grace.
DEFAULT_GRACE_S = 3.0

# Environment of the portal process that must not leak into the local head it starts.
_FOREIGN_RAY_ENV = ("RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH", "RAY_DASHBOARD_URL", "RAY_SERVE_URL")
# What runtime_env's `worker_process_setup_hook` sets; on the head it reaches every worker.
_SETUP_HOOK_ENV = "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"
# Spelled out, not f"{__name__}...": under `python -m` this module is __main__, a name Ray's
# workers cannot import.
_SETUP_HOOK = "serving.control.cluster.bind_wildcard_grpc_to_loopback"


class ClusterError(Exception):
    """Base of this module's errors."""


class ClusterConfigError(ClusterError):
    """The environment describes no usable cluster (missing or malformed variable)."""


class ClusterStartError(ClusterError):
    """The local head did not come up; the message carries the tail of `ray start`'s log."""


@dataclass(frozen=True)
class LocalHeadConfig:
    """A Ray head on this host, owned by the portal; its files live under `data_dir / "ray"`."""

    data_dir: Path
    gcs_port: int = DEFAULT_GCS_PORT
    dashboard_port: int = DEFAULT_DASHBOARD_PORT
    serve_port: int = DEFAULT_SERVE_PORT
    client_server_port: int = DEFAULT_CLIENT_SERVER_PORT
    dashboard_agent_port: int = DEFAULT_DASHBOARD_AGENT_PORT
    autoscaler_metrics_port: int = DEFAULT_AUTOSCALER_METRICS_PORT
    dashboard_metrics_port: int = DEFAULT_DASHBOARD_METRICS_PORT
    num_cpus: int = DEFAULT_NUM_CPUS
    num_gpus: int | None = None  # None: let Ray detect the GPUs of the host
    object_store_bytes: int = DEFAULT_OBJECT_STORE_MB * 1000 * 1000
    temp_dir_override: Path | None = None
    # Ray workers import the deployments' `import_path` modules (serving.dataplane.*, test apps)
    # from here: the head's PYTHONPATH is inherited by the raylet and every worker it spawns.
    pythonpath: tuple[Path, ...] = (REPO_ROOT,)

    @property
    def ray_dir(self) -> Path:
        return self.data_dir / "ray"

    @property
    def token_path(self) -> Path:
        return self.ray_dir / "auth_token"

    @property
    def state_path(self) -> Path:
        return self.ray_dir / "head.json"

    @property
    def log_path(self) -> Path:
        return self.ray_dir / "start.log"

    @property
    def temp_dir(self) -> Path:
        if self.temp_dir_override is not None:
            return self.temp_dir_override
        candidate = self.ray_dir / "tmp"
        if len(str(candidate)) <= MAX_TEMP_DIR_LEN:
            return candidate
        digest = hashlib.sha256(str(self.data_dir).encode()).hexdigest()[:12]
        return Path(tempfile.gettempdir()) / f"ray-portal-{digest}"

    @property
    def gcs_address(self) -> str:
        return f"{LOOPBACK}:{self.gcs_port}"

    @property
    def dashboard_url(self) -> str:
        return f"http://{LOOPBACK}:{self.dashboard_port}"

    @property
    def serve_url(self) -> str:
        return f"http://{LOOPBACK}:{self.serve_port}"

    def fixed_ports(self) -> dict[str, int]:
        """The ports this head binds by number (Ray picks the others at random)."""
        return {
            "gcs": self.gcs_port,
            "dashboard": self.dashboard_port,
            "serve": self.serve_port,
            "client_server": self.client_server_port,
            "dashboard_agent": self.dashboard_agent_port,
            "autoscaler_metrics": self.autoscaler_metrics_port,
            "dashboard_metrics": self.dashboard_metrics_port,
        }


@dataclass(frozen=True)
class RayTarget:
    """How the portal reaches its cluster. `local_head` is set when the portal manages the head."""

    address: str
    dashboard_url: str
    serve_url: str
    token: str = field(repr=False)
    local_head: LocalHeadConfig | None = None
    # Serve's http_options for the PUT config: read by Serve only when it starts on the cluster.
    serve_http_options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def managed(self) -> bool:
        return self.local_head is not None

    def serve_client(self, *, timeout: float = 10.0) -> ServeApiClient:
        return ServeApiClient.from_target(self, timeout=timeout)


def local_target(config: LocalHeadConfig) -> RayTarget:
    """The target for a portal-managed head; creates its token on first use."""
    return RayTarget(
        address=config.gcs_address,
        dashboard_url=config.dashboard_url,
        serve_url=config.serve_url,
        token=ensure_token(config.token_path),
        local_head=config,
        serve_http_options={"host": LOOPBACK, "port": config.serve_port},
    )


def ray_target_from_env(environ: Mapping[str, str] | None = None) -> RayTarget:
    """The one place the Ray environment is read; embedded defaults give the local head.

    Existing cluster: RAY_ADDRESS, RAY_DASHBOARD_URL, RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH),
    optional RAY_SERVE_URL (default: the dashboard's host, port 8000) and PORTAL_RAY_SERVE_HOST
    (the proxies' bind address if the portal is the first to start Serve there).
    Local head: PORTAL_DATA_DIR, PORTAL_RAY_{GCS,DASHBOARD,SERVE,CLIENT,AGENT}_PORT,
    PORTAL_RAY_{AUTOSCALER,DASHBOARD}_METRICS_PORT,
    PORTAL_RAY_NUM_CPUS, PORTAL_RAY_NUM_GPUS, PORTAL_RAY_OBJECT_STORE_MB, PORTAL_RAY_TEMP_DIR.
    """
    env = os.environ if environ is None else environ
    address = env.get("RAY_ADDRESS", "").strip()
    if address:
        return _existing_target(address, env)
    temp_override = env.get("PORTAL_RAY_TEMP_DIR", "").strip()
    gpus = env.get("PORTAL_RAY_NUM_GPUS", "").strip()
    config = LocalHeadConfig(
        data_dir=_data_dir(env),
        gcs_port=_env_port(env, "PORTAL_RAY_GCS_PORT", DEFAULT_GCS_PORT),
        dashboard_port=_env_port(env, "PORTAL_RAY_DASHBOARD_PORT", DEFAULT_DASHBOARD_PORT),
        serve_port=_env_port(env, "PORTAL_RAY_SERVE_PORT", DEFAULT_SERVE_PORT),
        client_server_port=_env_port(env, "PORTAL_RAY_CLIENT_PORT", DEFAULT_CLIENT_SERVER_PORT),
        dashboard_agent_port=_env_port(env, "PORTAL_RAY_AGENT_PORT", DEFAULT_DASHBOARD_AGENT_PORT),
        autoscaler_metrics_port=_env_port(
            env, "PORTAL_RAY_AUTOSCALER_METRICS_PORT", DEFAULT_AUTOSCALER_METRICS_PORT
        ),
        dashboard_metrics_port=_env_port(
            env, "PORTAL_RAY_DASHBOARD_METRICS_PORT", DEFAULT_DASHBOARD_METRICS_PORT
        ),
        num_cpus=_env_int(env, "PORTAL_RAY_NUM_CPUS", DEFAULT_NUM_CPUS),
        num_gpus=_env_int(env, "PORTAL_RAY_NUM_GPUS", 0) if gpus else None,
        object_store_bytes=_env_int(env, "PORTAL_RAY_OBJECT_STORE_MB", DEFAULT_OBJECT_STORE_MB)
        * 1000
        * 1000,
        temp_dir_override=Path(temp_override).resolve() if temp_override else None,
    )
    return local_target(config)


def _existing_target(address: str, env: Mapping[str, str]) -> RayTarget:
    dashboard_url = env.get("RAY_DASHBOARD_URL", "").strip().rstrip("/")
    token = env.get("RAY_AUTH_TOKEN", "").strip()
    token_path = env.get("RAY_AUTH_TOKEN_PATH", "").strip()
    if not token and token_path:
        try:
            token = Path(token_path).read_text().strip()
        except OSError as exc:
            raise ClusterConfigError(f"RAY_AUTH_TOKEN_PATH={token_path} unreadable: {exc}") from exc
    missing = [
        n for n, v in (("RAY_DASHBOARD_URL", dashboard_url), ("RAY_AUTH_TOKEN", token)) if not v
    ]
    if missing:
        raise ClusterConfigError(f"RAY_ADDRESS is set, so {' and '.join(missing)} must be too")
    dashboard = urlsplit(dashboard_url)
    if dashboard.scheme not in ("http", "https") or not dashboard.hostname:
        raise ClusterConfigError(f"RAY_DASHBOARD_URL must be an http(s) URL, got {dashboard_url!r}")
    serve_url = env.get("RAY_SERVE_URL", "").strip().rstrip("/")
    if not serve_url:
        serve_url = f"http://{dashboard.hostname}:8000"
    serve = urlsplit(serve_url)
    if serve.scheme not in ("http", "https") or not serve.hostname:
        raise ClusterConfigError(f"RAY_SERVE_URL must be an http(s) URL, got {serve_url!r}")
    http_options: dict[str, Any] = {"port": serve.port or (443 if serve.scheme == "https" else 80)}
    serve_host = env.get("PORTAL_RAY_SERVE_HOST", "").strip()
    if serve_host:
        http_options["host"] = serve_host
    return RayTarget(
        address=address,
        dashboard_url=dashboard_url,
        serve_url=serve_url,
        token=token,
        serve_http_options=http_options,
    )


def _data_dir(env: Mapping[str, str]) -> Path:
    """The portal's DATA_DIR when it runs (serving.control.host), else PORTAL_DATA_DIR, else
    <repo>/var."""
    configured = host.data_dir()
    if configured is not None:
        return Path(configured).resolve()
    raw = env.get("PORTAL_DATA_DIR", "").strip()
    return Path(raw).resolve() if raw else REPO_ROOT / "var"


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ClusterConfigError(f"{name} must be an integer, got {raw!r}") from exc


def _env_port(env: Mapping[str, str], name: str, default: int) -> int:
    port = _env_int(env, name, default)
    if not 1024 <= port <= 65535:
        raise ClusterConfigError(f"{name} must be a port in 1024-65535, got {port}")
    return port


def ensure_token(path: Path) -> str:
    """Read the head's auth token, generating it (mode 0600) the first time; restarts reuse it."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not path.exists():
        token = secrets.token_hex(32)  # what `ray get-auth-token --generate` makes: 256 bits
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".auth_token.")  # mode 0600
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(token + "\n")
            # link() publishes the complete file or fails if a concurrent caller won the race.
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
        finally:
            os.unlink(tmp)
    os.chmod(path, 0o600)  # a copied-in or restored file may have come with a looser mode
    token = path.read_text().strip()
    if not token:
        raise ClusterConfigError(f"{path} is empty; delete it to generate a new token")
    return token


# Processes, read from /proc: the head is found by its session, not by name.


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    session: int
    state: str
    start_ticks: int  # since boot; with the pid it names one process even after pid reuse
    name: str
    cmdline: str


def read_proc(pid: int) -> ProcInfo | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        raw_cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    # comm is in parentheses and may itself contain spaces and parentheses.
    name = stat[stat.index("(") + 1 : stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2 :].split()
    return ProcInfo(
        pid=pid,
        ppid=int(fields[1]),
        session=int(fields[3]),
        state=fields[0],
        start_ticks=int(fields[19]),
        name=name,
        cmdline=raw_cmd.replace(b"\0", b" ").decode(errors="replace").strip(),
    )


def _all_procs() -> Iterator[ProcInfo]:
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            info = read_proc(int(entry.name))
            if info is not None:
                yield info


def _is_alive(pid: int, start_ticks: int) -> bool:
    info = read_proc(pid)
    return info is not None and info.start_ticks == start_ticks and info.state not in ("Z", "X")


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
    for info in _all_procs():
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


def _signal(info: ProcInfo, sig: signal.Signals) -> None:
    if _is_alive(info.pid, info.start_ticks):  # never signal a pid that now names someone else
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(info.pid, sig)


def _terminate(procs: Sequence[ProcInfo], grace: float) -> None:
    """SIGTERM, wait up to `grace` seconds, then SIGKILL what is left and wait for it to go."""
    for info in procs:
        _signal(info, signal.SIGTERM)
    for sig, wait in ((signal.SIGKILL, grace), (None, 5.0)):
        deadline = time.monotonic() + wait
        alive = [p for p in procs if _is_alive(p.pid, p.start_ticks)]
        while alive and time.monotonic() < deadline:
            time.sleep(0.05)
            alive = [p for p in alive if _is_alive(p.pid, p.start_ticks)]
        if sig is None or not alive:
            return
        for info in alive:
            _signal(info, sig)


def stop_processes(procs: Iterable[ProcInfo], *, grace: float = DEFAULT_GRACE_S) -> None:
    """Stop in Ray's own order: raylets first (their workers go with them), GCS last."""
    procs = list(procs)
    raylets = [p for p in procs if p.name == "raylet"]
    gcs = [p for p in procs if p.name == "gcs_server"]
    others = [p for p in procs if p not in raylets and p not in gcs]
    for bucket in (raylets, others, gcs):
        if bucket:
            _terminate(bucket, grace)


# Listening sockets, read from /proc/net: what the head exposes, for status and for the tests.


@dataclass(frozen=True)
class Listener:
    pid: int
    address: str
    port: int

    @property
    def loopback(self) -> bool:
        ip = ipaddress.ip_address(self.address)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return ip.is_loopback


def _decode_address(hex_addr: str) -> str:
    raw = bytes.fromhex(hex_addr)
    # /proc/net/tcp{,6} prints each 32-bit word in host (little-endian) byte order.
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
    return socket.inet_ntop(family, words)


def _listening_inodes() -> dict[int, tuple[str, int]]:
    inodes: dict[int, tuple[str, int]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                cols = line.split()
                if len(cols) > 9 and cols[3] == "0A":  # TCP_LISTEN
                    hex_addr, hex_port = cols[1].split(":")
                    inodes[int(cols[9])] = (_decode_address(hex_addr), int(hex_port, 16))
    return inodes


def listening_sockets(pids: Iterable[int]) -> list[Listener]:
    """TCP sockets in LISTEN state held by these processes."""
    inodes = _listening_inodes()
    found: set[Listener] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.scandir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(fd.path)
                    if target.startswith("socket:["):
                        inode = int(target[len("socket:[") : -1])
                        if inode in inodes:
                            address, port = inodes[inode]
                            found.add(Listener(pid, address, port))
    return sorted(found, key=lambda item: (item.port, item.pid))


# Starting, stopping and probing the local head.


def head_command(config: LocalHeadConfig) -> list[str]:
    argv = [
        sys.executable, "-m", "ray.scripts.scripts", "start", "--head",
        "--node-ip-address", LOOPBACK,
        "--port", str(config.gcs_port),
        "--dashboard-host", LOOPBACK,
        "--dashboard-port", str(config.dashboard_port),
        "--include-dashboard=true",
        "--dashboard-agent-listen-port", str(config.dashboard_agent_port),
        "--ray-client-server-port", str(config.client_server_port),
        "--num-cpus", str(config.num_cpus),
        "--object-store-memory", str(config.object_store_bytes),
        "--temp-dir", str(config.temp_dir),
        "--disable-usage-stats",
        # The log monitor only streams worker logs to attached drivers; the portal has none.
        "--include-log-monitor=false",
    ]  # fmt: skip
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
        # Serve's Python API default (REST configs get theirs from the client's http_options).
        RAY_SERVE_DEFAULT_HTTP_HOST=LOOPBACK,
        PYTHONPATH=os.pathsep.join(paths),
        AUTOSCALER_METRIC_PORT=str(config.autoscaler_metrics_port),
        DASHBOARD_METRIC_PORT=str(config.dashboard_metrics_port),
    )
    env[_SETUP_HOOK_ENV] = _SETUP_HOOK
    return env


def bind_wildcard_grpc_to_loopback() -> None:
    """Ray worker setup hook of the local head: wildcard gRPC binds become 127.0.0.1 binds.

    Ray 2.60's Serve replicas bind their inter-deployment gRPC server to "[::]:0" (hard-coded in
    ray/serve/_private/replica.py, no setting), which would open every replica to the network.
    On a head whose node address is 127.0.0.1 nothing needs more than loopback, so the helper
    they bind through rewrites wildcard addresses. Runs in each worker before user code imports
    Serve; a runtime_env with its own worker_process_setup_hook replaces this one for its workers.
    """
    # Untyped Ray internals; imported here so the portal process never loads Ray for this.
    tls_utils: Any = importlib.import_module("ray._common.tls_utils")
    original = tls_utils.add_port_to_grpc_server
    if getattr(original, "portal_loopback", False):
        return

    def add_port(server: Any, address: str) -> Any:
        for wildcard in ("[::]:", "0.0.0.0:"):
            if address.startswith(wildcard):
                address = f"{LOOPBACK}:{address.removeprefix(wildcard)}"
        return original(server, address)

    add_port.portal_loopback = True  # type: ignore[attr-defined]
    tls_utils.add_port_to_grpc_server = add_port
    # `from tls_utils import add_port_to_grpc_server` binds the name at import: patch modules
    # that already hold it.
    for module in ("ray.serve._private.replica", "ray.dashboard.agent"):
        loaded: Any = sys.modules.get(module)
        if loaded is not None and hasattr(loaded, "add_port_to_grpc_server"):
            loaded.add_port_to_grpc_server = add_port


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
        ok, error = _dashboard_ok(config.dashboard_url, ensure_token(config.token_path))
    return HeadStatus(
        running=running, state=state, processes=procs, dashboard_ok=ok, dashboard_error=error
    )


def _dashboard_ok(dashboard_url: str, token: str) -> tuple[bool, str]:
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
        ok, error = _dashboard_ok(config.dashboard_url, token)
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


# The command line, for humans and for the `up` supervisor.


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
        if not all(_is_alive(p.pid, p.start_ticks) for p in vital):
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
        ok, error = _dashboard_ok(target.dashboard_url, target.token)
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


if __name__ == "__main__":
    sys.exit(main())
