"""Similar past incidents: the same symptoms (breach kinds, breached SLIs, Serve symptoms,
confirmed causes) on the same deployment or version rank first; nothing in common is never
listed; the list is bounded and the tenant's own; the page and the API."""

from __future__ import annotations

import pytest

from incidents.rca.services_feedback import hint_feedback_set
from incidents.rca.similar import MAX_SIMILAR, jaccard, similar_incidents
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.incidents.learning_support import OOM, api, incident_of, page, resolved, serve_says

pytestmark = pytest.mark.django_db


def test_jaccard() -> None:
    assert jaccard(set(), set()) == 0.0
    assert jaccard({"a"}, {"a", "b"}) == 0.5


def test_same_symptoms_rank_first_and_nothing_in_common_is_left_out(
    world_a: TenantWorld,
) -> None:
    same = resolved(world_a, incident_of(world_a, "availability"))
    gate = resolved(
        world_a, incident_of(world_a, "promotion", kind="gate", severity="ticket", action="notify")
    )
    latency = resolved(world_a, incident_of(world_a, "latency_p95"))
    now = incident_of(world_a, "availability")
    found = similar_incidents(tenant=world_a.tenant, incident=now)
    ids = [s.id for s in found]
    assert ids[0] == same.pk
    assert latency.pk in ids  # the same kind (burn) on the same deployment
    assert gate.pk not in ids  # nothing in common but the deployment
    top = found[0]
    assert "same breached SLIs: availability" in top.reasons
    assert "same deployment" in top.reasons and "same model version" in top.reasons
    assert top.score > found[1].score


def test_a_confirmed_cause_and_serve_symptoms_count(world_a: TenantWorld) -> None:
    serve_says(world_a, OOM)
    past = incident_of(world_a, "availability")
    hint_feedback_set(
        tenant=world_a.tenant, actor=Actor(user=world_a.operator), incident=past,
        cause="Out of GPU memory", verdict="right",
    )  # fmt: skip
    resolved(world_a, past)
    plain = resolved(world_a, incident_of(world_a, "availability"))
    now = incident_of(world_a, "availability")
    found = similar_incidents(tenant=world_a.tenant, incident=now, causes=["Out of GPU memory"])
    assert [s.id for s in found[:2]] == [past.pk, plain.pk]
    assert "confirmed cause: out of gpu memory" in found[0].reasons


def test_the_list_is_bounded_and_only_looks_back(world_a: TenantWorld) -> None:
    past = [resolved(world_a, incident_of(world_a)) for _ in range(MAX_SIMILAR + 3)]
    middle = past[2]
    found = similar_incidents(tenant=world_a.tenant, incident=middle)
    assert [s.id for s in found] == [past[1].pk, past[0].pk]  # newest first at equal score
    now = incident_of(world_a)
    assert len(similar_incidents(tenant=world_a.tenant, incident=now)) == MAX_SIMILAR


def test_page_and_api(world_a: TenantWorld) -> None:
    past = resolved(world_a, incident_of(world_a))
    now = incident_of(world_a)
    rows = world_a.client("viewer").get(api("incident-similar", pk=now.pk)).json()
    assert [r["id"] for r in rows] == [past.pk]
    assert rows[0]["deployment_name"] == "assistant" and rows[0]["score"] > 0
    html = world_a.client("viewer").get(page(world_a, "incident-detail", pk=now.pk)).content
    assert b'data-testid="similar-incident"' in html
    assert f"/incidents/{past.pk}/".encode() in html
