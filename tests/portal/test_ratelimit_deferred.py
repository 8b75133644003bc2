"""The strict limiter split in two (`ratelimit.charge_start` / `Charge.result`), and the scoped
list that reads its verdict at the first SQL query: nothing reaches the table before it."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from django.conf import settings
from django.core.cache import cache
from django.db import connection
from django.urls import reverse

from portal import ratelimit
from tenants.models import AuditEvent, Quota
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db

AUDIT_TABLE = AuditEvent._meta.db_table


def _bucket(name: str, rate: float = 5.0) -> ratelimit.Bucket:
    return ratelimit.Bucket(f"{name}-{time.time_ns()}", rate)


class _Executed:
    """SQL that PostgreSQL ran (recorded after it answered; Django's query log also keeps a
    statement the gate stopped before sending)."""

    def __init__(self) -> None:
        self.sql: list[str] = []

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        result = execute(sql, params, many, context)
        self.sql.append(sql)
        return result

    def on_audit_table(self) -> list[str]:
        return [sql for sql in self.sql if AUDIT_TABLE in sql]


def _set_tenant_rps(world: TenantWorld, rps: int) -> None:
    Quota.objects.filter(tenant=world.tenant).update(requests_per_second=rps)
    cache.delete(f"quota-rps:{world.tenant.pk}")


def test_a_split_charge_admits_the_burst_then_answers_a_wait() -> None:
    # Burst 5 refilled once a minute: strict (no lease), and a slow machine's round trips
    # cannot refill a token between the fifth charge and the sixth.
    bucket = ratelimit.Bucket(f"split-{time.time_ns()}", 1 / 60, burst=5)
    assert ratelimit.lease_size([bucket]) == 1
    assert [ratelimit.charge_start([bucket]).result() for _ in range(5)] == [0.0] * 5
    assert ratelimit.charge_start([bucket]).result() > 0


def test_a_split_charge_sees_a_marker_set_elsewhere() -> None:
    bucket, marker = _bucket("split-marked"), f"token-revoked:split-{time.time_ns()}"
    assert ratelimit.charge_start([bucket], deny_marker=marker).result() == 0
    redis.Redis.from_url(settings.REDIS_URL).set(ratelimit._key(marker), "1", ex=30)
    charge = ratelimit.charge_start([bucket], deny_marker=marker)
    with pytest.raises(ratelimit.Denied):
        charge.result()


def test_a_dropped_charge_still_counts_and_leaves_the_pool_usable() -> None:
    bucket = ratelimit.Bucket(f"dropped-{time.time_ns()}", 1 / 60, burst=2)
    ratelimit.charge_start([bucket]).result()  # the script is known to this process
    ratelimit.charge_start([bucket]).drop()
    assert ratelimit.charge_start([bucket]).result() > 0
    assert redis.Redis.from_url(settings.REDIS_URL).ping()


class _UnknownDigest:
    """The script under a digest Redis has never seen, as after a Redis restart."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.sha = "0" * 40

    def __call__(self, **kwargs: Any) -> Any:
        return self.inner(**kwargs)


def test_noscript_after_a_redis_restart_charges_again(monkeypatch: pytest.MonkeyPatch) -> None:
    unknown = _UnknownDigest(ratelimit._redis_script(settings.REDIS_URL))
    monkeypatch.setattr(ratelimit, "_redis_script", lambda url: unknown)
    monkeypatch.setitem(ratelimit._script_loaded, unknown.sha, True)
    bucket = ratelimit.Bucket(f"noscript-{time.time_ns()}", 1 / 60, burst=1)
    assert ratelimit.charge_start([bucket]).result() == 0
    assert unknown.sha not in ratelimit._script_loaded
    assert ratelimit.charge_start([bucket]).result() > 0


def _throttled(client: Any, executed: _Executed | None = None, **query: str) -> Any:
    """The first of a few back-to-back lists the tenant's 1 request a second refuses (one
    would do; more only if the machine paused for a second between two of them)."""
    for _ in range(5):
        if executed is not None:
            executed.sql.clear()
            with connection.execute_wrapper(executed):
                response = client.get(reverse("audit-event-list"), query)
        else:
            response = client.get(reverse("audit-event-list"), query)
        if response.status_code == 429:
            return response
    raise AssertionError("five lists in a row at 1 request a second: none was refused")


def test_a_throttled_list_never_reads_the_table(world_a: TenantWorld) -> None:
    _set_tenant_rps(world_a, 1)
    client = world_a.client("token")
    assert client.get(reverse("audit-event-list")).status_code == 200
    executed = _Executed()
    response = _throttled(client, executed)
    assert int(response["Retry-After"]) >= 1
    assert executed.on_audit_table() == []


def test_a_throttled_list_that_fails_before_sql_still_answers_429(world_a: TenantWorld) -> None:
    _set_tenant_rps(world_a, 1)
    client = world_a.client("token")
    assert client.get(reverse("audit-event-list")).status_code == 200
    response = _throttled(client, created_after="not-a-date")
    assert response.json()["error"]["code"] == "rate_limited"


def test_a_token_revoked_elsewhere_is_refused_before_the_list_query(
    world_a: TenantWorld,
) -> None:
    client = world_a.client("token")
    assert client.get(reverse("audit-event-list")).status_code == 200
    token = world_a.token
    redis.Redis.from_url(settings.REDIS_URL).set(
        ratelimit._key(f"token-revoked:{token.pk}"), "1", ex=30
    )
    executed = _Executed()
    with connection.execute_wrapper(executed):
        response = client.get(reverse("audit-event-list"))
    assert response.status_code == 401
    assert executed.on_audit_table() == []


def test_an_admitted_list_runs_its_query(world_a: TenantWorld) -> None:
    executed = _Executed()
    with connection.execute_wrapper(executed):
        response = world_a.client("token").get(reverse("audit-event-list"))
    assert response.status_code == 200
    assert len(executed.on_audit_table()) == 1


def test_a_rate_limited_business_error_answers_429_with_retry_after() -> None:
    """A service's RateLimited (a tenant bucket or cap) through the API: 429, its code, and
    Retry-After from its wait (rounded up)."""
    from portal.api.errors import exception_handler
    from portal.exceptions import RateLimited

    response = exception_handler(RateLimited("at most 2 at once per tenant", wait=2.2), {})
    assert response is not None and response.status_code == 429
    assert response["Retry-After"] == "3"
    assert response.data["error"]["code"] == "rate_limited"
