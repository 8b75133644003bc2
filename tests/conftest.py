"""Shared fixtures: two tenants built through the services, API clients for tokens and sessions."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from serving import services as serving_services
from serving.models import Model, ModelVersion
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
    from serving import deployments

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


_TEST_DOMAINS = (".example", ".example.com", ".example.net", ".example.org", ".test")


@pytest.fixture(autouse=True)
def _webhook_hosts_resolve_to_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Webhook hosts of the tests (RFC 2606 names) resolve to 127.0.0.1 without asking DNS."""
    from portal import netguard

    real = netguard.resolve

    def resolve(host: str, port: int) -> list[str]:
        if f".{host.rstrip('.')}".endswith(_TEST_DOMAINS):
            return ["127.0.0.1"]
        return real(host, port)

    monkeypatch.setattr(netguard, "resolve", resolve)


@pytest.fixture(autouse=True)
def _clean_redis() -> Any:
    """Rate-limit buckets, cache entries and the ops loop's state (replicas' SLI values, the
    health tick's counters: keyed by deployment id, which a new test database hands out
    again) must not leak between tests (test Redis db only)."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    for pattern in (
        f"{settings.RATE_LIMIT_KEY_PREFIX}:*",
        f"{settings.CACHES['default']['KEY_PREFIX']}:*",
        f"{settings.SLI_KEY_PREFIX}:*",
    ):
        keys = list(client.scan_iter(pattern))
        if keys:
            client.delete(*keys)
    from serving.health import clear_caches

    clear_caches()  # what the health tick keeps in memory is keyed by ids too
    yield


@pytest.fixture
def world_a(db: Any) -> TenantWorld:
    return make_world("Acme")


@pytest.fixture
def world_b(db: Any) -> TenantWorld:
    return make_world("Globex")


# The session's one Ray head (tests marked `ray`, in any folder) and its per-test clean-up.
from tests.ray_cluster import _serve_apps_removed_after_ray_tests, ray_cluster  # noqa: E402, F401
