"""Rate limits per tenant and per token, charged atomically in Redis; 429 with Retry-After."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.conf import settings
from django.core.cache import cache
from django.test import override_settings
from django.urls import reverse

from portal import ratelimit
from tenants import services
from tenants.actors import Actor
from tenants.models import Quota
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db


def _set_tenant_rps(world: TenantWorld, rps: int) -> None:
    Quota.objects.filter(tenant=world.tenant).update(requests_per_second=rps)
    cache.delete(f"quota-rps:{world.tenant.pk}")


def test_tenant_limit_answers_429_with_retry_after(world_a: TenantWorld) -> None:
    _set_tenant_rps(world_a, 2)
    client = world_a.client("token")
    statuses = [client.get(reverse("quota-list")).status_code for _ in range(4)]
    assert statuses[:2] == [200, 200]
    assert 429 in statuses[2:]
    response = client.get(reverse("quota-list"))
    assert response.status_code == 429
    assert int(response["Retry-After"]) >= 1
    assert response.json()["error"]["code"] == "rate_limited"


def test_tenant_limit_is_shared_by_sessions_and_tokens(world_a: TenantWorld) -> None:
    _set_tenant_rps(world_a, 2)
    assert world_a.client("token").get(reverse("quota-list")).status_code == 200
    assert world_a.client("viewer").get(reverse("quota-list")).status_code == 200
    assert world_a.client("owner").get(reverse("quota-list")).status_code == 429


def test_one_tenant_at_its_limit_does_not_slow_another(
    world_a: TenantWorld, world_b: TenantWorld
) -> None:
    _set_tenant_rps(world_a, 1)
    client_a = world_a.client("token")
    client_a.get(reverse("quota-list"))
    assert client_a.get(reverse("quota-list")).status_code == 429
    assert world_b.client("token").get(reverse("quota-list")).status_code == 200


def test_per_token_limit(world_a: TenantWorld) -> None:
    _set_tenant_rps(world_a, 1000)
    _, raw = services.api_token_create(
        tenant=world_a.tenant,
        actor=Actor(user=world_a.owner),
        name="slow",
        scopes=["read"],
        rate_limit_per_second=1,
    )
    from rest_framework.test import APIClient

    slow = APIClient()
    slow.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert slow.get(reverse("quota-list")).status_code == 200
    assert slow.get(reverse("quota-list")).status_code == 429
    assert world_a.client("token").get(reverse("quota-list")).status_code == 200


def test_buckets_refill() -> None:
    bucket = ratelimit.Bucket(f"refill-{time.time_ns()}", 20.0)
    allowed = sum(ratelimit.consume([bucket]) == 0 for _ in range(40))
    assert 20 <= allowed <= 22
    time.sleep(0.2)
    assert ratelimit.consume([bucket]) == 0


def test_all_or_nothing_across_buckets() -> None:
    tight = ratelimit.Bucket(f"tight-{time.time_ns()}", 1.0)
    loose = ratelimit.Bucket(f"loose-{time.time_ns()}", 1.0)
    assert ratelimit.consume([tight]) == 0
    # tight is empty: the pair is refused and loose is not charged
    assert ratelimit.consume([tight, loose]) > 0
    assert ratelimit.consume([loose]) == 0


def test_concurrent_requests_never_exceed_the_bucket() -> None:
    key = f"race-{time.time_ns()}"
    allowed: list[int] = []
    lock = threading.Lock()
    bucket = ratelimit.Bucket(key, 5.0)
    start = time.monotonic()

    def hammer() -> None:
        for _ in range(25):
            if ratelimit.consume([bucket]) == 0:
                with lock:
                    allowed.append(1)

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - start
    assert len(allowed) <= 5 + 5 * elapsed + 1
    assert len(allowed) >= 5


def test_lease_size_follows_the_slowest_bucket() -> None:
    assert ratelimit.lease_size([ratelimit.Bucket("a", 20.0)]) == 1  # default quota: strict
    assert ratelimit.lease_size([ratelimit.Bucket("a", 1000.0)]) == 10
    assert ratelimit.lease_size([ratelimit.Bucket("a", 1e6)]) == settings.RATE_LIMIT_LEASE_MAX
    pair = [ratelimit.Bucket("a", 1e6), ratelimit.Bucket("b", 50.0)]
    assert ratelimit.lease_size(pair) == 1


class _CountingScript:
    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls = 0

    def __call__(self, **kwargs: Any) -> Any:
        self.calls += 1
        return self.inner(**kwargs)


def _count_round_trips(monkeypatch: pytest.MonkeyPatch) -> _CountingScript:
    counter = _CountingScript(ratelimit._redis_script(settings.REDIS_URL))
    monkeypatch.setattr(ratelimit, "_redis_script", lambda url: counter)
    return counter


def test_fast_buckets_lease_tokens_slow_ones_stay_strict(monkeypatch: pytest.MonkeyPatch) -> None:
    counter = _count_round_trips(monkeypatch)
    fast = ratelimit.Bucket(f"fast-{time.time_ns()}", 10_000.0)  # lease of 64
    assert all(ratelimit.consume([fast]) == 0 for _ in range(100))
    assert counter.calls == 2
    counter.calls = 0
    slow = ratelimit.Bucket(f"slow-{time.time_ns()}", 20.0)
    assert all(ratelimit.consume([slow]) == 0 for _ in range(20))
    assert counter.calls == 20


def test_leases_never_exceed_the_shared_bucket() -> None:
    # Rate 1,000/s, burst 1 s: leases of 10. Threads share this process's leases.
    bucket = ratelimit.Bucket(f"leased-race-{time.time_ns()}", 1000.0)
    assert ratelimit.lease_size([bucket]) == 10
    allowed: list[int] = []
    lock = threading.Lock()
    start = time.monotonic()

    def hammer() -> None:
        for _ in range(400):
            if ratelimit.consume([bucket]) == 0:
                with lock:
                    allowed.append(1)

    threads = [threading.Thread(target=hammer) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - start
    assert len(allowed) <= 1000 + 1000 * elapsed + 1
    assert len(allowed) >= 1000 * 0.9  # the burst, less at most one unspent lease


@override_settings(RATE_LIMIT_LEASE_MS=100)
def test_marker_from_another_process_is_seen_when_the_lease_ends() -> None:
    import redis

    fast = ratelimit.Bucket(f"marked-{time.time_ns()}", 10_000.0)
    marker = f"token-revoked:elsewhere-{time.time_ns()}"
    assert ratelimit.consume([fast], deny_marker=marker) == 0  # takes a lease
    # Another web process revokes: only Redis knows.
    redis.Redis.from_url(settings.REDIS_URL).set(ratelimit._key(marker), "1", ex=30)
    deadline = time.monotonic() + 0.1 + 0.05
    with pytest.raises(ratelimit.Denied):
        while True:
            ratelimit.consume([fast], deny_marker=marker)
            assert time.monotonic() < deadline, "lease outlived RATE_LIMIT_LEASE_MS"
            time.sleep(0.005)


def test_marker_set_in_this_process_denies_at_once_despite_a_lease() -> None:
    fast = ratelimit.Bucket(f"marked-here-{time.time_ns()}", 10_000.0)
    marker = f"token-revoked:here-{time.time_ns()}"
    assert ratelimit.consume([fast], deny_marker=marker) == 0
    ratelimit.set_marker(marker, 30)
    with pytest.raises(ratelimit.Denied):
        ratelimit.consume([fast], deny_marker=marker)
