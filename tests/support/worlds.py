"""Tenant worlds built through the services, the way users build them: shared by the test
fixtures (tests/conftest.py) and the benchmarks (bench/)."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from django.contrib.auth.models import User
from rest_framework.test import APIClient

from serving.registry import services as serving_services
from serving.registry.models import Model, ModelVersion
from tenants import services
from tenants.actors import Actor
from tenants.models import ApiToken, Role, Scope, Tenant

PASSWORD = "correct-horse-battery-staple-42"
ALL_SCOPES = [Scope.READ, Scope.WRITE, Scope.DEPLOY, Scope.ADMIN]


@dataclass
class TenantWorld:
    """A tenant with an owner, an operator, a viewer, an all-scopes token of the owner, and a
    model with one registered version (a tiny checkpoint on local disk)."""

    tenant: Tenant
    owner: User
    operator: User
    viewer: User
    token: ApiToken
    raw_token: str
    model: Model
    version: ModelVersion

    def client(self, who: str = "token") -> APIClient:
        client = APIClient()
        if who == "token":
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {self.raw_token}")
        else:
            client.force_login(getattr(self, who))
        return client


def make_user(email: str) -> User:
    return User.objects.create_user(username=email, email=email, password=PASSWORD)


def add_member(tenant: Tenant, owner: User, email: str, role: str) -> User:
    """Invite and accept, the way a real member joins."""
    user = make_user(email)
    _, raw = services.invitation_create(
        tenant=tenant, actor=Actor(user=owner), email=email, role=role
    )
    services.invitation_accept(user=user, raw_token=raw)
    return user


_world_checkpoint: Path | None = None


def world_checkpoint() -> Path:
    """A tiny valid Llama checkpoint shared by every world, written once per test process."""
    global _world_checkpoint
    if _world_checkpoint is None:
        from serving.engine.testing import write_tiny_checkpoint

        root = Path(tempfile.mkdtemp(prefix="portal-test-world-"))
        atexit.register(shutil.rmtree, root, True)
        _world_checkpoint = write_tiny_checkpoint(root / "tiny")
    return _world_checkpoint


def _deploy_something(tenant: Tenant, owner: User) -> None:
    """A ready version of its own model, deployed: the matrices then see deployment routes.
    (The world's `model`/`version` stay registered-only for the registry tests.)"""
    from serving.deployments import services as deployments

    served = serving_services.model_create(tenant=tenant, actor=Actor(user=owner), name="served")
    version = serving_services.version_register_path(
        tenant=tenant, actor=Actor(user=owner), model=served, label="s1",
        path=str(world_checkpoint()),
    )  # fmt: skip
    # Validation runs on commit; most tests run inside one transaction, so run it here.
    serving_services.version_validate(tenant=tenant, version_id=version.pk)
    deployments.deployment_create(
        tenant=tenant, actor=Actor(user=owner), name="assistant", version_id=version.pk,
        settings={"num_cpus": 0.25},
    )  # fmt: skip


def make_world(name: str) -> TenantWorld:
    slug = name.lower()
    owner, tenant = services.signup(
        email=f"owner@{slug}.example", password=PASSWORD, organisation=name
    )
    operator = add_member(tenant, owner, f"operator@{slug}.example", Role.OPERATOR)
    viewer = add_member(tenant, owner, f"viewer@{slug}.example", Role.VIEWER)
    token, raw = services.api_token_create(
        tenant=tenant, actor=Actor(user=owner), name="automation", scopes=ALL_SCOPES
    )
    model = serving_services.model_create(
        tenant=tenant, actor=Actor(user=owner), name="assistant", description=f"{name} assistant"
    )
    version = serving_services.version_register_path(
        tenant=tenant,
        actor=Actor(user=owner),
        model=model,
        label="v1",
        path=str(world_checkpoint()),
    )
    _deploy_something(tenant, owner)
    return TenantWorld(tenant, owner, operator, viewer, token, raw, model, version)
