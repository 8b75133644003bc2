"""The health tick's own parts: the one-statement insert (COPY), the long-window boundaries it
keeps between ticks, and the synthetic probes through an HTTP server (no Ray here)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from serving.deployments.keys import probe_key
from serving.deployments.models import Deployment
from serving.ops import health
from serving.ops.models import Resolution, SliSample
from serving.ops.sli_store import BoundaryCache, insert_samples, lookup_before, sample_row
from serving.slo.evaluate import Counts
from tests.conftest import TenantWorld
from tests.serving.test_ops_loop import Replica, _ready

pytestmark = pytest.mark.django_db

DAY = 86400


def _counts(requests: int, errors: int = 0) -> Counts:
    return Counts(requests=requests, errors=errors, seconds=float(requests))


def test_insert_samples_stores_every_column_in_one_statement(world_a: TenantWorld) -> None:
    deployment = _ready(world_a)
    now = time.time()
    kv = {"note": 'quote " backslash \\ tab \t newline \n ünïcode', "blocks_used": 3}
    rows = [
        sample_row(
            tenant_id=deployment.tenant_id,
            slot=(deployment.pk, group),
            version="m:v1",
            resolution=Resolution.RAW,
            start=now - 2,
            end=now,
            delta=Counts(requests=7, errors=2, tokens_out=9, latency=[1, 5, 1] + [0] * 9),
            cumulative=_counts(70, 5),
            probe=probe,
            kv=kv,
        )  # fmt: skip
        for group, probe in (("stable", (True, 12.5)), ("canary", (None, None)))
    ]
    with CaptureQueriesContext(connection) as ctx:
        insert_samples(rows)
    assert len(ctx.captured_queries) == 1 and ctx.captured_queries[0]["sql"].startswith("COPY")
    stored = {s.group: s for s in SliSample.objects.filter(deployment=deployment)}
    assert set(stored) == {"stable", "canary"}
    for row in rows:
        got = stored[row.group]
        for field in SliSample._meta.concrete_fields:
            if not field.primary_key:
                assert getattr(got, field.attname) == getattr(row, field.attname), field.name
    assert stored["canary"].probe_ok is None and stored["stable"].kv["note"] == kv["note"]


def _minute_rows(deployment: Deployment, version: str, since: float, until: float) -> None:
    """One minute row a minute from `since` to `until`, cumulative requests = minutes since."""
    first = int(since // 60) + 1
    rows = [
        sample_row(
            tenant_id=deployment.tenant_id,
            slot=(deployment.pk, "stable"),
            version=version,
            resolution=Resolution.MINUTE,
            start=(m - 1) * 60,
            end=m * 60,
            delta=_counts(1),
            cumulative=_counts(m - first + 1),
        )  # fmt: skip
        for m in range(first, int(until // 60) + 1)
    ]
    insert_samples(rows)


def test_long_window_boundaries_are_looked_up_once_a_minute(world_a: TenantWorld) -> None:
    deployment = _ready(world_a)
    slot = (deployment.pk, "stable")
    start = time.time()
    since = start - 2 * DAY
    _minute_rows(deployment, "m:v1", since, start)
    cache = BoundaryCache()
    windows = (7200, 6 * 3600, DAY, 3 * DAY)  # 3 d reaches past the episode: no boundary
    episodes = {slot: ("m:v1", since)}
    looked_up = 0
    for step in range(0, 180, 2):  # three minutes of 2 s ticks
        now = start + step
        cutoffs = {w: now - w for w in windows}
        with CaptureQueriesContext(connection) as ctx:
            found = cache.lookup(episodes, cutoffs)
        looked_up += len(ctx.captured_queries)
        # The same answer as asking the database every tick.
        assert found == lookup_before(episodes, cutoffs)
        assert set(found[slot]) == {7200, 6 * 3600, DAY}
    assert looked_up in (3, 4)  # the first tick, then once per minute crossed
    # Another episode (a new version, or the same one back) is looked up afresh.
    episodes = {slot: ("m:v2", since)}
    with CaptureQueriesContext(connection) as ctx:
        found = cache.lookup(episodes, {w: start + 180 - w for w in windows})
    assert len(ctx.captured_queries) == 1 and found[slot] == {}


def test_a_slot_not_looked_up_every_tick_keeps_its_boundaries(world_a: TenantWorld) -> None:
    """A canary's deployment is checked every second, its neighbours every other: the tick
    that looks up only the canary's slot leaves the neighbour's cached boundaries alone."""
    deployment = _ready(world_a)
    start = time.time()
    since = start - 2 * DAY
    _minute_rows(deployment, "m:v1", since, start)
    stable, canary = (deployment.pk, "stable"), (deployment.pk, "canary")
    cache = BoundaryCache()
    windows = (7200, 6 * 3600)
    looked_up = 0
    for step in range(0, 40):  # 40 one-second ticks: the stable slot due every other one
        now = start + step
        episodes = {canary: ("m:v2", since)} | ({stable: ("m:v1", since)} if step % 2 else {})
        with CaptureQueriesContext(connection) as ctx:
            found = cache.lookup(episodes, {w: now - w for w in windows})
        looked_up += len(ctx.captured_queries)
        assert found == lookup_before(episodes, {w: now - w for w in windows})
    assert looked_up <= 4  # the first lookups and the minute crossed, not one per other tick


def test_short_windows_are_looked_up_every_tick(world_a: TenantWorld) -> None:
    deployment = _ready(world_a)
    replica = Replica(deployment, "stable", "r1")
    cache = BoundaryCache()
    now = time.time()
    replica.serve(ok=5)
    health.tick(now=now, act=False)
    episodes = {(deployment.pk, "stable"): (replica.recorder.version, now)}
    for step in (2, 4):
        replica.serve(ok=5)
        health.tick(now=now + step, act=False)
        with CaptureQueriesContext(connection) as ctx:
            found = cache.lookup(episodes, {2: now + step - 2})
        assert len(ctx.captured_queries) == 1
        assert found[(deployment.pk, "stable")][2].requests == 5 * step // 2


class _Serve(BaseHTTPRequestHandler):
    """A stand-in for the Serve proxy: answers each path with the status it is told."""

    statuses: dict[str, int] = {}
    seen: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        self.seen.append({"path": self.path, "headers": dict(self.headers), "body": body})
        status = self.statuses.get(self.path, 404)
        payload = json.dumps({"ok": status < 400}).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def serve_proxy() -> Iterator[str]:
    _Serve.statuses, _Serve.seen = {}, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Serve)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_probes_go_through_the_proxy_with_the_probe_key(
    world_a: TenantWorld, serve_proxy: str
) -> None:
    deployment = _ready(world_a)
    Replica(deployment, "stable", "r1").serve(ok=4)
    path = "/acme/assistant/v1/completions"
    _Serve.statuses[path] = 200
    now = time.time()
    health.tick(now=now, act=False, serve_url=serve_proxy)
    probe = health.deployment_health(deployment.pk)["probe"]
    assert probe["ok"] is True and probe["status"] == 200 and probe["ms"] > 0
    request = _Serve.seen[-1]
    headers = {k.lower(): v for k, v in request["headers"].items()}
    assert headers["authorization"] == f"Bearer {probe_key(deployment.pk)}"
    assert headers["x-portal-probe"] == "1" and json.loads(request["body"])["max_tokens"] == 1
    assert headers["x-ab-group"] == "stable"  # the stable slot's probe, never the canary's
    # A failing probe counts as a failed request of the stable slot, and failures add up.
    _Serve.statuses[path] = 503
    for step in (2, 4):
        health.tick(now=now + step, act=False, serve_url=serve_proxy)
    info = health.deployment_health(deployment.pk)
    assert (info["probe"]["ok"], info["probe"]["status"], info["probe_failures"]) == (
        False, 503, 2
    )  # fmt: skip
    last = SliSample.objects.filter(deployment=deployment, resolution=Resolution.RAW).latest("end")
    assert (last.requests, last.errors, last.probe_ok) == (1, 1, False)


def test_a_proxy_that_does_not_answer_is_a_failed_probe(world_a: TenantWorld) -> None:
    deployment = _ready(world_a)
    import socket

    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    health.tick(now=time.time(), act=False, serve_url=f"http://127.0.0.1:{port}")
    probe = health.deployment_health(deployment.pk)["probe"]
    assert probe["ok"] is False and probe["status"] is None


def test_failed_probes_on_stable_open_an_incident_and_escalate_to_a_page(
    world_a: TenantWorld, serve_proxy: str, settings: Any
) -> None:
    """The replicas' counters miss requests the proxy holds while a replica is replaced; the
    probe sees them. One failure is a ticket, three in a row a page; a good probe ends it."""
    from incidents.models import Incident, SlaBreach
    from serving.ops.contracts import contract_set
    from tenants.actors import Actor
    from tests.serving.test_ops_loop import FAST_CONTRACT

    deployment = _ready(world_a)
    contract_set(tenant=world_a.tenant, actor=Actor(user=world_a.owner), deployment=deployment,
                 source=FAST_CONTRACT)  # fmt: skip
    replica = Replica(deployment, "stable", "r1")
    path = "/acme/assistant/v1/completions"
    _Serve.statuses[path] = 200
    now = time.time()
    replica.serve(ok=50)
    health.tick(now=now, serve_url=serve_proxy)
    assert not Incident.objects.filter(deployment=deployment).exists()

    _Serve.statuses[path] = 503
    replica.serve(ok=50)  # the replicas' own counters stay clean: only the probe sees it
    health.tick(now=now + 2, serve_url=serve_proxy)
    incident = Incident.objects.get(deployment=deployment)
    breach = SlaBreach.objects.get(incident=incident)
    assert (breach.kind, breach.objective, breach.severity, breach.action) == (
        "probe", "health-probe", "ticket", "notify"
    )  # fmt: skip
    assert "failed 1 time in a row (HTTP 503)" in breach.detail
    assert "health-probe" in _firing_names(deployment)

    for step in (4, 6):
        replica.serve(ok=50)
        health.tick(now=now + step, serve_url=serve_proxy)
    incident.refresh_from_db()
    assert incident.severity == "page"  # three in a row
    assert Incident.objects.filter(deployment=deployment).count() == 1

    _Serve.statuses[path] = 200
    replica.serve(ok=50)
    health.tick(now=now + 8, serve_url=serve_proxy)
    assert "health-probe" not in _firing_names(deployment)

    settings.HEALTH_PROBE_ALERT_AFTER = 0  # off: failures are counted, nothing fires
    _Serve.statuses[path] = 503
    replica.serve(ok=50)
    health.tick(now=now + 10, serve_url=serve_proxy)
    info = health.deployment_health(deployment.pk)
    assert info["probe_failures"] == 1 and "health-probe" not in _firing_names(deployment)


def _firing_names(deployment: Deployment) -> list[str]:
    """(The probes' failures count as errors too: the availability budget may fire.)"""
    slot = health.deployment_health(deployment.pk)["slots"]["stable"]
    return [f["name"] for f in slot["firing"]]
