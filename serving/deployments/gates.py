"""Promotion gates: what may refuse a canary's promotion, registered by the rooms above.

deployments sits below ops, so it cannot ask ops' contracts itself; ops registers its SLA gate
here when the app starts (ServingConfig.ready), and `deployment_promote` stays the one entry
point for pages, the API and rollouts."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from serving.deployments.models import Deployment, DeploymentRevision

# (deployment, current revision) -> ("pass" | "warn" | "block", why)
Gate = Callable[["Deployment", "DeploymentRevision"], tuple[str, str]]
_gates: dict[str, Gate] = {}


def register(name: str, gate: Gate) -> None:
    _gates[name] = gate


def blocking(deployment: Deployment, revision: DeploymentRevision) -> str | None:
    """Why the first gate that blocks refuses the promotion, or None."""
    for gate in _gates.values():
        verdict, why = gate(deployment, revision)
        if verdict == "block":
            return why
    return None
