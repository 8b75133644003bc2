"""A hostile tenant against incidents that learn: B's votes never move A's weights, B cannot
vote on A's incidents, B never sees A's incidents as "similar", nor A's Serve messages, nor A's
incidents in its analytics; B's own input is bounded."""

from __future__ import annotations

import pytest

from incidents.analytics import incident_analytics
from incidents.rca.models import HintFeedback, HintWeight
from incidents.rca.services_feedback import hint_feedback_set
from incidents.rca.similar import similar_incidents
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.incidents.learning_support import (
    OOM,
    api,
    incident_of,
    page,
    resolved,
    rival_rule,
    serve_says,
)

pytestmark = pytest.mark.django_db


def test_bs_votes_never_change_as_weights(world_a: TenantWorld, world_b: TenantWorld) -> None:
    for world in (world_a, world_b):
        serve_says(world, OOM)
        rival_rule(world)
    mine, theirs = incident_of(world_a), incident_of(world_b)
    hint_feedback_set(
        tenant=world_a.tenant, actor=Actor(user=world_a.operator), incident=mine,
        cause="Out of GPU memory", verdict="right",
    )  # fmt: skip
    before = list(HintWeight.objects.filter(tenant=world_a.tenant).values())
    client = world_b.client("owner")
    for user in ("owner", "operator"):
        response = world_b.client(user).post(
            api("incident-hint-feedback", pk=theirs.pk),
            {"cause": "Out of GPU memory", "verdict": "wrong"},
            format="json",
        )
        assert response.status_code == 200
    # B aims at A's incident: the same 404 as a missing one, nothing written.
    for pk in (mine.pk, 999_999_999):
        response = client.post(
            api("incident-hint-feedback", pk=pk),
            {"cause": "Out of GPU memory", "verdict": "wrong"},
            format="json",
        )
        assert response.status_code == 404
        form = page(world_b, "incident-hint-feedback", pk=pk)
        assert (
            client.post(form, {"cause": "Out of GPU memory", "verdict": "wrong"}).status_code == 404
        )
    assert list(HintWeight.objects.filter(tenant=world_a.tenant).values()) == before
    assert HintFeedback.objects.filter(incident=mine).count() == 1
    hints = world_a.client("viewer").get(api("incident-hints", pk=mine.pk)).json()
    assert hints["hints"][0]["cause"] == "Out of GPU memory"
    assert (hints["hints"][0]["right"], hints["hints"][0]["wrong"]) == (1, 0)


def test_b_cannot_vote_on_causes_only_a_knows(world_a: TenantWorld, world_b: TenantWorld) -> None:
    rival_rule(world_a)  # A's own cause "Batch too large"
    theirs = incident_of(world_b)
    response = world_b.client("owner").post(
        api("incident-hint-feedback", pk=theirs.pk),
        {"cause": "Batch too large", "verdict": "wrong"},
        format="json",
    )
    assert response.status_code == 400 and "cause" in response.json()["error"]["fields"]
    assert not HintWeight.objects.exists()


def test_b_never_sees_as_incidents_as_similar(world_a: TenantWorld, world_b: TenantWorld) -> None:
    for _ in range(3):
        resolved(world_a, incident_of(world_a))  # the very same symptoms, in A
    theirs = incident_of(world_b)
    assert similar_incidents(tenant=world_b.tenant, incident=theirs) == []
    assert world_b.client("owner").get(api("incident-similar", pk=theirs.pk)).json() == []
    html = world_b.client("owner").get(page(world_b, "incident-detail", pk=theirs.pk)).content
    assert b'data-testid="similar-incident"' not in html
    mine = incident_of(world_a)
    assert world_b.client("owner").get(api("incident-similar", pk=mine.pk)).status_code == 404


def test_b_never_sees_as_serve_messages(world_a: TenantWorld, world_b: TenantWorld) -> None:
    serve_says(world_a, OOM + "\nsecret-path /models/acme-private")
    incident_of(world_a)
    theirs = incident_of(world_b)
    hints = world_b.client("owner").get(api("incident-hints", pk=theirs.pk)).json()
    assert hints["symptoms"] == []
    assert "serve_out_of_memory" not in hints["signals"]
    html = world_b.client("owner").get(page(world_b, "incident-detail", pk=theirs.pk)).content
    assert b"acme-private" not in html and b"CUDA out of memory" not in html


def test_b_analytics_hold_only_bs_incidents(world_a: TenantWorld, world_b: TenantWorld) -> None:
    for _ in range(3):
        resolved(world_a, incident_of(world_a))
    data = incident_analytics(tenant=world_b.tenant)
    assert data["timings"]["real"]["incidents"] == 0
    assert sum(w["page"] + w["ticket"] + w["drill"] for w in data["per_week"]) == 0
    assert [row["name"] for row in data["availability"]] == ["assistant"]
    [row] = data["availability"]
    assert row["incidents"] == 0 and row["incident_free"] == 1.0


def test_bs_input_is_bounded(world_b: TenantWorld) -> None:
    theirs = incident_of(world_b)
    client = world_b.client("owner")
    url = api("incident-hint-feedback", pk=theirs.pk)
    huge = client.post(url, {"cause": "x" * 100_000, "verdict": "right"}, format="json")
    assert huge.status_code == 400
    odd = client.post(url, {"cause": ["a"], "verdict": {"x": 1}}, format="json")
    assert odd.status_code == 400
    weeks = client.get(api("incident-analytics"), {"weeks": 10**9, "days": -5})
    assert weeks.status_code == 400
    html = client.get(page(world_b, "incident-analytics-page"), {"weeks": "1e9", "days": "x"})
    assert html.status_code == 200
    page_big = client.get(page(world_b, "incident-analytics-page"), {"weeks": 10**9})
    assert b'value="52"' in page_big.content
    assert not HintFeedback.objects.exists()
