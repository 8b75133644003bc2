"""The audit log page: filters (action, who, object type, days), errors that name the filter,
the CSV export of the same rows (streamed, capped, only the tenant's own), and a tenant's
names that look like spreadsheet formulas exported as text."""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from serving.registry import services as registry
from tenants.actors import Actor
from tenants.audit_views import EXPORT_MAX_ROWS, safe_cell
from tenants.models import AuditEvent
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db


def _csv(response: Any) -> list[dict[str, str]]:
    assert response.status_code == 200 and response["Content-Type"] == "text/csv"
    assert response["Content-Disposition"].startswith('attachment; filename="audit-')
    body = b"".join(response.streaming_content).decode()
    return list(csv.DictReader(io.StringIO(body)))


def test_filters_narrow_the_log_and_the_export_has_the_same_rows(
    client: Any, world_a: TenantWorld, world_b: TenantWorld
) -> None:
    url = reverse("tenant-audit", args=[world_a.tenant.slug])
    client.force_login(world_a.owner)
    everything = AuditEvent.objects.filter(tenant=world_a.tenant).count()
    rows = _csv(client.get(url, {"format": "csv"}))
    assert len(rows) == everything > 3
    assert {r["action"] for r in rows} >= {"model.created", "deployment.created"}
    foreign = set(
        AuditEvent.objects.filter(tenant=world_b.tenant).values_list("object_id", flat=True)
    )
    assert not any(
        r["object"].startswith("globex") or r["who"].endswith("@globex.example") for r in rows
    )
    assert foreign  # world_b has its own log, none of it here
    models = _csv(client.get(url, {"format": "csv", "action": "model."}))
    assert models and all(r["action"].startswith("model.") for r in models)
    page = client.get(url, {"action": "model."}).content.decode()
    assert "model.created" in page and "deployment.created" not in page
    assert "format=csv" in page and "action=model." in page  # the export link keeps the filters
    who = _csv(client.get(url, {"format": "csv", "actor": "OWNER@acme"}))
    assert who and all("owner@acme.example" in r["who"] for r in who)
    kind = _csv(client.get(url, {"format": "csv", "object_type": "serving.deployment"}))
    assert kind and all(r["object_type"] == "serving.deployment" for r in kind)
    today = timezone.now().date()
    assert _csv(client.get(url, {"format": "csv", "since": str(today + timedelta(days=1))})) == []
    assert len(_csv(client.get(url, {"format": "csv", "since": str(today)}))) == everything


def test_a_filter_that_makes_no_sense_names_itself(client: Any, world_a: TenantWorld) -> None:
    url = reverse("tenant-audit", args=[world_a.tenant.slug])
    client.force_login(world_a.owner)
    page = client.get(url, {"since": "2026-13-45"}).content.decode()
    assert 'data-testid="filter-errors"' in page and "since:" in page
    assert "model.created" not in page
    backwards = client.get(url, {"since": "2026-05-02", "until": "2026-05-01"}).content.decode()
    assert "until: must be on or after From." in backwards
    assert _csv(client.get(url, {"format": "csv", "since": "yesterday"})) == []


def test_a_name_that_looks_like_a_formula_is_exported_as_text(
    client: Any, world_a: TenantWorld
) -> None:
    """Hostile tenant: a model named like a spreadsheet formula lands in the audit log; its
    export must not run it in whoever opens the file."""
    registry.model_create(tenant=world_a.tenant, actor=Actor(user=world_a.owner),
                          name="sum", description='=HYPERLINK("http://evil.example","x")')  # fmt: skip
    client.force_login(world_a.owner)
    rows = _csv(client.get(reverse("tenant-audit", args=[world_a.tenant.slug]), {"format": "csv"}))
    after = next(
        r["after"] for r in rows if r["action"] == "model.created" and "sum" in r["object"]
    )
    assert not after.startswith(("=", "+", "-", "@"))
    assert safe_cell("=1+1") == "'=1+1" and safe_cell("-2") == "'-2" and safe_cell("@x") == "'@x"
    assert safe_cell("\tcmd") == "'\tcmd" and safe_cell("ok") == "ok"
    assert safe_cell({"name": "=x"}) == '{"name": "=x"}'  # JSON starts with "{"
    assert EXPORT_MAX_ROWS == 50_000


def test_the_viewer_may_read_and_export_but_a_stranger_gets_404(
    client: Any, world_a: TenantWorld, world_b: TenantWorld
) -> None:
    url = reverse("tenant-audit", args=[world_a.tenant.slug])
    client.force_login(world_a.viewer)
    assert client.get(url).status_code == 200
    assert client.get(url, {"format": "csv"}).status_code == 200
    client.force_login(world_b.owner)
    assert client.get(url, {"format": "csv"}).status_code == 404
