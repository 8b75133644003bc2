"""The postmortem: every section, with the incident's own numbers."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from incidents import services
from incidents.rca.postmortem import postmortem_markdown
from serving.deployments.models import DeploymentRevision
from serving.ops.models import Rollback
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.incidents.factories import breach, deployment_of
from tests.incidents.slis import sample

pytestmark = pytest.mark.django_db


def test_the_postmortem_tells_the_whole_story(world_a: TenantWorld) -> None:
    deployment = deployment_of(world_a)
    now = timezone.now()
    detected = now - timedelta(minutes=6)
    _, incident, _ = breach(world_a, detected_at=detected, detail="error | ratio 20%")
    breach(world_a, detected_at=now - timedelta(minutes=5))  # a repeat: occurrences 2
    for minutes in (9, 4):
        end = (now - timedelta(minutes=minutes)).replace(second=30)
        sample(deployment, end, requests=200, errors=40 if minutes == 4 else 0, latency_ms=900,
               kv={"blocks_total": 100, "blocks_used": 99})  # fmt: skip
        sample(deployment, end, group="canary", requests=50, errors=25, latency_ms=2000)
    revision = DeploymentRevision.objects.filter(deployment=deployment).first()
    assert revision is not None
    rollback = Rollback.objects.create(
        tenant=world_a.tenant, deployment=deployment, key="rb-1", trigger="breach",
        from_revision=revision, to_revision=revision, status="done", detected_at=detected,
        started_at=detected + timedelta(seconds=1),
        traffic_switched_at=detected + timedelta(seconds=1.5),
        finished_at=detected + timedelta(seconds=2),
    )  # fmt: skip
    services.incident_rollback_started(tenant=world_a.tenant, incident=incident, rollback=rollback)
    services.incident_rollback_finished(tenant=world_a.tenant, incident=incident, rollback=rollback)
    actor = Actor(user=world_a.operator)
    services.incident_note(
        tenant=world_a.tenant, actor=actor, incident=incident, text="canary v2 | looked bad"
    )
    services.incident_resolve(tenant=world_a.tenant, actor=actor, incident=incident)

    text = postmortem_markdown(tenant=world_a.tenant, incident=incident)
    assert text.startswith(f"# Postmortem: {incident.title}")
    for heading in (
        "## Summary",
        "## Timeline",
        "## Breaches",
        "## Rollbacks",
        "## SLIs around the incident",
        "## Likely causes",
        "## Follow-ups",
    ):
        assert heading in text, heading
    assert "| Severity | page |" in text and "| Status | resolved |" in text
    assert "| Time to mitigate |" in text and "| Time to mitigate | – |" not in text
    # The timeline, in order, pipes escaped so the table holds.
    timeline = text.split("## Timeline")[1].split("## Breaches")[0]
    kinds = ["breach", "rollback_started", "rollback_finished", "status_changed", "note"]
    positions = [timeline.index(f"| {kind} |") for kind in kinds]
    assert positions == sorted(positions)
    assert "canary v2 \\| looked bad" in timeline and "operator@acme.example" in timeline
    breaches = text.split("## Breaches")[1].split("## Rollbacks")[0]
    assert "| availability | stable | burn | page | rollback |" in breaches
    assert "| 2 | error \\| ratio 20% |" in breaches
    rollbacks = text.split("## Rollbacks")[1].split("## SLIs")[0]
    assert f"r{revision.number} -> r{revision.number}" in rollbacks
    assert "| 1.0 s | 0.5 s | 0.5 s | 2.0 s |" in rollbacks
    slis = text.split("## SLIs around the incident")[1].split("## Likely causes")[0]
    rows = [line for line in slis.splitlines() if line.startswith("| ") and "Minute" not in line]
    assert len(rows) == 4  # two minutes x two groups
    assert any("| stable | 200 | 0.2 | 1000 |" in row for row in rows)
    assert any("| canary | 50 | 0.5 | 2500 |" in row for row in rows)
    causes = text.split("## Likely causes")[1]
    assert "**KV cache exhausted**" in causes and "kv_usage = 0.99 >= 0.95" in causes
    assert "**Canary regression**" in causes
    assert "- [ ]" in text.split("## Follow-ups")[1]


def test_a_fresh_incident_has_empty_sections_said_plainly(world_a: TenantWorld) -> None:
    _, incident, _ = breach(world_a, is_drill=True)
    text = postmortem_markdown(tenant=world_a.tenant, incident=incident)
    assert "This incident was a chaos drill." in text
    assert "No SLI samples in the window." in text
    assert "## Rollbacks\n\nNone." in text
    assert "No rule matched" in text
    assert "| Resolved | – |" in text
