"""Where the portal's Ray cluster is: the target (the local head or an existing cluster), the
local head's settings and its auth token, all read from plain environment variables.

A target is either the local head managed by the portal (the embedded default: every listener on
127.0.0.1, token auth on, ports of its own so it never takes Redis' 6379 or the portal's 8000) or
an existing cluster named by RAY_ADDRESS + RAY_DASHBOARD_URL + RAY_AUTH_TOKEN (+ RAY_SERVE_URL).
Usable without Django: plain paths and ports.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from serving.control import host
from serving.control.serve_api import ServeApiClient

LOOPBACK = "127.0.0.1"
REPO_ROOT = Path(__file__).resolve().parents[3]

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
    # RAY_CLUSTER_AUTOSCALES=1: the cluster adds nodes for demands it cannot place, so the
    # portal admits what does not fit now (and says it waits for the autoscaler).
    autoscales: bool = False
    # Where Serve runs its HTTP proxies (read by Serve only when it starts on the cluster):
    # EveryNode (a proxy on each node with replicas: inference does not funnel through the
    # head), HeadOnly, or Disabled (handles only).
    proxy_location: str = "EveryNode"
    # Ray resources every tenant replica asks for (a small amount of a custom resource the
    # worker nodes advertise keeps them off the head: `ray start --resources`).
    replica_resources: Mapping[str, float] = field(default_factory=dict)

    @property
    def managed(self) -> bool:
        return self.local_head is not None

    def serve_client(self, *, timeout: float = 10.0) -> ServeApiClient:
        return ServeApiClient.from_target(self, timeout=timeout)


PROXY_LOCATIONS = ("EveryNode", "HeadOnly", "Disabled")


def local_target(config: LocalHeadConfig, env: Mapping[str, str] | None = None) -> RayTarget:
    """The target for a portal-managed head; creates its token on first use."""
    return RayTarget(
        address=config.gcs_address,
        dashboard_url=config.dashboard_url,
        serve_url=config.serve_url,
        token=ensure_token(config.token_path),
        local_head=config,
        serve_http_options={"host": LOOPBACK, "port": config.serve_port},
        **_placement(os.environ if env is None else env),
    )


def _placement(env: Mapping[str, str]) -> dict[str, Any]:
    """PORTAL_RAY_PROXY_LOCATION and PORTAL_RAY_REPLICA_RESOURCES (a JSON object of resource
    names to amounts), checked."""
    location = env.get("PORTAL_RAY_PROXY_LOCATION", "").strip() or "EveryNode"
    if location not in PROXY_LOCATIONS:
        raise ClusterConfigError(
            f"PORTAL_RAY_PROXY_LOCATION must be one of {', '.join(PROXY_LOCATIONS)}, "
            f"got {location!r}"
        )
    raw = env.get("PORTAL_RAY_REPLICA_RESOURCES", "").strip()
    try:
        resources = json.loads(raw) if raw else {}
    except ValueError as exc:
        raise ClusterConfigError(f"PORTAL_RAY_REPLICA_RESOURCES is not JSON: {exc}") from None
    if not isinstance(resources, dict) or not all(
        isinstance(k, str) and k and type(v) in (int, float) and 0 < v <= 1_000_000
        for k, v in resources.items()
    ):
        raise ClusterConfigError(
            "PORTAL_RAY_REPLICA_RESOURCES must be a JSON object of resource names to positive "
            'amounts, for example {"portal-worker": 0.001}'
        )
    if {"CPU", "GPU", "memory"} & set(resources):
        raise ClusterConfigError(
            "PORTAL_RAY_REPLICA_RESOURCES names custom resources only: CPUs, GPUs and memory "
            "come from each deployment's own settings"
        )
    return {"proxy_location": location, "replica_resources": resources}


def ray_target_from_env(environ: Mapping[str, str] | None = None) -> RayTarget:
    """The one place the Ray environment is read; embedded defaults give the local head.

    Existing cluster: RAY_ADDRESS, RAY_DASHBOARD_URL, RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH),
    optional RAY_SERVE_URL (default: the dashboard's host, port 8000), PORTAL_RAY_SERVE_HOST
    (the proxies' bind address if the portal is the first to start Serve there) and
    RAY_CLUSTER_AUTOSCALES (1: the cluster adds nodes on demand).
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
    return local_target(config, env)


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
    # The proxies' bind address: loopback only when the portal reaches Serve on loopback
    # (a proxy bound to 127.0.0.1 on a remote node answers no one).
    serve_host = env.get("PORTAL_RAY_SERVE_HOST", "").strip()
    loopback = serve.hostname in ("localhost", "127.0.0.1", "::1")
    http_options["host"] = serve_host or (LOOPBACK if loopback else "0.0.0.0")  # noqa: S104
    autoscales = env.get("RAY_CLUSTER_AUTOSCALES", "").strip().lower()
    if autoscales not in ("", "0", "1", "true", "false", "yes", "no"):
        raise ClusterConfigError(f"RAY_CLUSTER_AUTOSCALES must be 0 or 1, got {autoscales!r}")
    return RayTarget(
        address=address,
        dashboard_url=dashboard_url,
        serve_url=serve_url,
        token=token,
        serve_http_options=http_options,
        autoscales=autoscales in ("1", "true", "yes"),
        **_placement(env),
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
