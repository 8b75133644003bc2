"""What the Serve REST API reports, as values: applications (status, message, the config Serve
runs), their deployments and replicas; parsed from the GET answer (ServeInstanceDetails).
Django-free; serving.control.serve_api re-exports every name."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class AppStatus(StrEnum):
    """An application's status as Serve reports it, plus ABSENT for "Serve does not list it"."""

    NOT_STARTED = "NOT_STARTED"
    DEPLOYING = "DEPLOYING"
    DEPLOY_FAILED = "DEPLOY_FAILED"
    RUNNING = "RUNNING"
    UNHEALTHY = "UNHEALTHY"
    DELETING = "DELETING"
    ABSENT = "ABSENT"


@dataclass(frozen=True)
class ReplicaInfo:
    """One replica actor of a deployment, as Serve lists it."""

    app: str
    deployment: str
    replica_id: str
    state: str
    pid: int | None
    actor_id: str | None
    actor_name: str | None
    node_id: str | None
    node_ip: str | None
    start_time_s: float | None


@dataclass(frozen=True)
class DeploymentInfo:
    name: str
    status: str
    message: str
    target_num_replicas: int | None
    replicas: tuple[ReplicaInfo, ...]


@dataclass(frozen=True)
class AppInfo:
    name: str
    status: AppStatus
    message: str
    last_deployed_time_s: float
    deployments: Mapping[str, DeploymentInfo]
    # The portal revision in the router's deployed user_config (None for other apps): what
    # Serve actually runs, to compare with what the portal applied last.
    router_revision: int | None = None
    # The application's config as Serve reports it runs it (None: imperative, or not known
    # yet): what serving.control.drift compares with the config the portal applied.
    deployed_config: Mapping[str, Any] | None = None

    @property
    def replicas(self) -> list[ReplicaInfo]:
        return [r for d in self.deployments.values() for r in d.replicas]


def parse_applications(details: Mapping[str, Any]) -> dict[str, AppInfo]:
    """Turn the GET answer (Serve's ServeInstanceDetails) into AppInfo values by name."""
    apps: dict[str, AppInfo] = {}
    for name, raw in (details.get("applications") or {}).items():
        deployments = {
            dep_name: _parse_deployment(name, dep_name, dep)
            for dep_name, dep in (raw.get("deployments") or {}).items()
        }
        status = str(raw.get("status", ""))
        apps[name] = AppInfo(
            name=name,
            status=AppStatus(status) if status in AppStatus.__members__ else AppStatus.NOT_STARTED,
            message=str(raw.get("message") or ""),
            last_deployed_time_s=float(raw.get("last_deployed_time_s") or 0.0),
            deployments=deployments,
            router_revision=_router_revision(raw.get("deployed_app_config")),
            deployed_config=raw.get("deployed_app_config"),
        )
    return apps


def _router_revision(config: Any) -> int | None:
    if not isinstance(config, Mapping):
        return None
    for deployment in config.get("deployments") or ():
        if isinstance(deployment, Mapping) and deployment.get("name") == "router":
            revision = (deployment.get("user_config") or {}).get("revision")
            return int(revision) if isinstance(revision, int) else None
    return None


def _parse_deployment(app: str, name: str, raw: Mapping[str, Any]) -> DeploymentInfo:
    replicas = tuple(
        ReplicaInfo(
            app=app,
            deployment=name,
            replica_id=str(r.get("replica_id", "")),
            state=str(r.get("state", "")),
            pid=r.get("pid"),
            actor_id=r.get("actor_id"),
            actor_name=r.get("actor_name"),
            node_id=r.get("node_id"),
            node_ip=r.get("node_ip"),
            start_time_s=r.get("start_time_s"),
        )
        for r in raw.get("replicas") or ()
    )
    target = raw.get("target_num_replicas")
    return DeploymentInfo(
        name=name,
        status=str(raw.get("status", "")),
        message=str(raw.get("message") or ""),
        target_num_replicas=int(target) if target is not None else None,
        replicas=replicas,
    )


def absent_app(name: str) -> AppInfo:
    return AppInfo(
        name=name, status=AppStatus.ABSENT, message="", last_deployed_time_s=0.0, deployments={}
    )
