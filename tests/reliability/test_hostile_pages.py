"""Hostile tenant against the issue-19 pages: the contract editor's check as you type (a YAML
alias bomb costs the node budget, never memory), the deploy form's cost preview (another
tenant's version is refused, naming the field; a posted pool is ignored), and the audit
export (a drill named like a spreadsheet formula is exported as text)."""

from __future__ import annotations

import csv
import io
from typing import Any

import pytest
from django.urls import reverse

from serving.deployments.models import Deployment, SharedPool
from tests.conftest import TenantWorld
from tests.serving.test_deployment_pages import _create_data

pytestmark = pytest.mark.django_db

# Nine levels of nine aliases: 9**9 (387 million) nodes once expanded.
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
)


def test_an_alias_bomb_in_the_editor_is_refused_by_the_node_budget(
    client: Any, world_a: TenantWorld
) -> None:
    client.force_login(world_a.operator)
    deployment = Deployment.objects.get(tenant=world_a.tenant, name="assistant")
    url = reverse("serving-deployment-contract-check", args=[world_a.tenant.slug, deployment.pk])
    result = client.post(url, {"source": BOMB}).json()
    assert result["ok"] is False
    assert "too large or too deeply nested" in result["errors"][0]["message"]


def test_the_cost_preview_refuses_a_neighbours_version_and_ignores_a_pool(
    client: Any, world_a: TenantWorld, world_b: TenantWorld
) -> None:
    closed = SharedPool.objects.create(name="theirs", model_version=world_b.version)
    closed.allowed_tenants.add(world_b.tenant)
    client.force_login(world_a.owner)
    url = reverse("serving-deployment-cost", args=[world_a.tenant.slug])
    foreign = Deployment.objects.get(tenant=world_b.tenant).current_revision.stable_version_id
    page = client.post(url, _create_data(world_a, version=foreign)).content.decode()
    assert 'data-testid="cost-problems"' in page and "cost-table" not in page
    # The page's form has no pool field: a posted pool is ignored (a dedicated deployment's
    # cost), and nothing of the neighbour's pool shows.
    page = client.post(url, _create_data(world_a, kv_mode="shared", pool="theirs")).content.decode()
    assert 'data-testid="cost-table"' in page and "theirs" not in page


def test_a_formula_named_drill_is_text_in_the_audit_export(
    client: Any, world_a: TenantWorld
) -> None:
    from incidents import drills
    from tenants.actors import Actor

    deployment = Deployment.objects.get(tenant=world_a.tenant, name="assistant")
    drills.drill_create(tenant=world_a.tenant, actor=Actor(user=world_a.owner),
                        deployment=deployment, name='=HYPERLINK("http://evil.example")',
                        fault="latency_spike", group="stable", parameters={})  # fmt: skip
    client.force_login(world_a.owner)
    response = client.get(reverse("tenant-audit", args=[world_a.tenant.slug]), {"format": "csv"})
    body = b"".join(response.streaming_content).decode()
    rows = [r for r in csv.DictReader(io.StringIO(body)) if r["action"] == "drill.created"]
    assert rows and rows[0]["object"].startswith("'=HYPERLINK")
    assert all(not cell.startswith(("=", "+", "-", "@")) for r in rows for cell in r.values())


def _hostile_webhook(world: TenantWorld, name: str, url: str) -> Any:
    from incidents import services
    from tenants.actors import Actor

    channel, _ = services.notification_channel_create(
        tenant=world.tenant, actor=Actor(user=world.owner), kind="webhook", name=name, url=url
    )
    return channel


def test_a_neighbours_channel_cannot_be_test_sent(
    client: Any, world_a: TenantWorld, world_b: TenantWorld, settings: Any
) -> None:
    from tenants.models import AuditEvent

    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    theirs = _hostile_webhook(world_b, "theirs", "http://127.0.0.1:9/hook")
    client.force_login(world_a.owner)
    for slug in (world_a.tenant.slug, world_b.tenant.slug):  # through ours, or naming theirs
        url = reverse("notification-channel-test", args=[slug, theirs.pk])
        assert client.post(url).status_code == 404
    assert not AuditEvent.objects.filter(action="notification_channel.tested").exists()


def test_hammering_test_send_costs_one_message_per_channel_and_a_few_per_tenant(
    client: Any, world_a: TenantWorld, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            hits.append(self.path)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        channels = [_hostile_webhook(world_a, f"victim-{i}", f"{base}/{i}") for i in range(8)]
        client.force_login(world_a.operator)
        refused = 0
        # The presses queue tests; the worker (eager here) sends them once they commit.
        with django_capture_on_commit_callbacks(execute=True) as queued:
            for _ in range(3):
                for channel in channels:
                    url = reverse(
                        "notification-channel-test", args=[world_a.tenant.slug, channel.pk]
                    )
                    page = client.post(url, follow=True).content.decode()
                    refused += "too many test messages" in page
    finally:
        server.shutdown()
        server.server_close()
    # 24 presses: five messages go out (the tenant's minute), each to a different channel.
    assert len(queued) == 5 and len(hits) == 5 and len(set(hits)) == 5
    assert refused == 19


def test_a_neighbours_cause_rule_cannot_be_read_or_changed_and_rule_text_is_escaped(
    client: Any, world_a: TenantWorld, world_b: TenantWorld
) -> None:
    from incidents import services
    from incidents.models import CauseRule
    from tenants.actors import Actor

    theirs = services.cause_rule_create(
        tenant=world_b.tenant, actor=Actor(user=world_b.owner), symptom="kv_usage", op="true",
        cause='<script>alert("globex")</script>', fix="<img src=x onerror=alert(1)>",
    )  # fmt: skip
    client.force_login(world_a.owner)
    for slug in (world_a.tenant.slug, world_b.tenant.slug):  # through ours, or naming theirs
        for name in ("cause-rule-edit", "cause-rule-switch", "cause-rule-delete"):
            url = reverse(name, args=[slug, theirs.pk])
            assert client.post(url, {"cause": "pwned", "op": "true"}).status_code == 404
    theirs.refresh_from_db()
    assert theirs.is_active and theirs.cause.startswith("<script>")
    assert (
        "globex"
        not in client.get(reverse("cause-rules", args=[world_a.tenant.slug])).content.decode()
    )
    client.force_login(world_b.owner)
    page = client.get(reverse("cause-rules", args=[world_b.tenant.slug])).content.decode()
    assert "<script>alert" not in page and "&lt;script&gt;alert(&quot;globex&quot;)" in page
    assert "<img src=x" not in page
    assert CauseRule.objects.filter(tenant=world_a.tenant).count() == 0


@pytest.mark.parametrize(
    "name",
    [
        "serving-deployment-requests",
        "serving-deployment-compare",
        "serving-deployment-playground",
        "serving-deployment-breaker",
        "serving-deployment-breaker-live",
    ],
)
def test_a_neighbours_deployment_pages_are_not_found_to_read_or_change(
    client: Any, world_a: TenantWorld, world_b: TenantWorld, name: str
) -> None:
    """A tenant naming another tenant's deployment in any of its pages (inspector, compare,
    playground, guard & breaker) gets a 404 for reading and for posting: nothing is read from
    the neighbour's routers, nothing is sent to its proxy, none of its settings change."""
    theirs = Deployment.objects.get(tenant=world_a.tenant, name="assistant")
    revision = theirs.current_revision_id
    client.force_login(world_b.owner)
    url = reverse(name, kwargs={"slug": world_b.tenant.slug, "pk": theirs.pk})
    assert client.get(url).status_code == 404
    posted = client.post(url, {"prompt": "hi", "arm": "stable", "breaker_min_requests": 1})
    assert posted.status_code in (404, 405)
    cost = reverse("serving-deployment-change-cost", args=[world_b.tenant.slug, theirs.pk, "scale"])
    assert client.post(cost, {"num_replicas": 1}).status_code == 404
    theirs.refresh_from_db()
    assert theirs.current_revision_id == revision
