"""Hints that learn: a member's "right / wrong" changes the cause's weight for that tenant
only (bounded Beta score), reorders and mutes hints; one vote per person, changeable; a viewer
cannot vote; the page and the API."""

from __future__ import annotations

import pytest

from incidents.models import EventKind, IncidentEvent
from incidents.rca import learning
from incidents.rca.hints import Hint
from incidents.rca.models import HintFeedback, HintWeight
from incidents.rca.services_feedback import hint_feedback_set
from portal.exceptions import ValidationFailed
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


def test_the_multiplier_is_a_bounded_beta_mean() -> None:
    assert learning.multiplier(0, 0) == 1.0
    assert learning.multiplier(1, 0) == pytest.approx(4 / 3, abs=1e-4)
    assert learning.multiplier(0, 1) == pytest.approx(2 / 3, abs=1e-4)
    assert 1.99 < learning.multiplier(10_000, 0) < 2.0
    assert 0.0 < learning.multiplier(0, 10_000) < 0.01
    steps = [learning.multiplier(0, n) for n in range(6)]
    assert steps == sorted(steps, reverse=True)  # each wrong lowers it, less each time


def test_feedback_reorders_and_mutes() -> None:
    hints = [Hint("A", "", 4.0, ["x"]), Hint("B", "", 3.0, ["y"])]
    likely, muted = learning.apply_feedback(hints, {"a": (0, 1)})
    assert [h.cause for h in likely] == ["B", "A"] and muted == []
    assert likely[1].base_score == 4.0 and likely[1].score == pytest.approx(2.667, abs=1e-3)
    likely, muted = learning.apply_feedback(hints, {"a": (0, 3)})
    assert [h.cause for h in likely] == ["B"] and [h.cause for h in muted] == ["A"]
    likely, _ = learning.apply_feedback(hints, {"b": (2, 0)})
    assert likely[0].cause == "B" and likely[0].multiplier == 1.5


@pytest.mark.django_db
def test_a_wrong_vote_reorders_this_tenants_hints_only(
    world_a: TenantWorld, world_b: TenantWorld
) -> None:
    for world in (world_a, world_b):
        serve_says(world, OOM)
        rival_rule(world)
    incident = incident_of(world_a)
    other = incident_of(world_b)
    hints = world_a.client("operator").get(api("incident-hints", pk=incident.pk)).json()
    assert [h["cause"] for h in hints["hints"]] == ["Out of GPU memory", "Batch too large"]
    response = world_a.client("operator").post(
        api("incident-hint-feedback", pk=incident.pk),
        {"cause": "out of gpu memory", "verdict": "wrong"},
        format="json",
    )
    assert response.status_code == 200, response.content
    assert response.json() == {
        "cause": "Out of GPU memory",
        "right": 0,
        "wrong": 1,
        "multiplier": pytest.approx(0.6667, abs=1e-4),
    }
    hints = world_a.client("viewer").get(api("incident-hints", pk=incident.pk)).json()
    assert [h["cause"] for h in hints["hints"]] == ["Batch too large", "Out of GPU memory"]
    assert hints["hints"][1]["base_score"] == 4.0 and hints["hints"][1]["wrong"] == 1
    theirs = world_b.client("viewer").get(api("incident-hints", pk=other.pk)).json()
    assert [h["cause"] for h in theirs["hints"]] == ["Out of GPU memory", "Batch too large"]
    assert theirs["hints"][0]["multiplier"] == 1.0
    assert not HintWeight.objects.filter(tenant=world_b.tenant).exists()
    event = IncidentEvent.objects.get(incident=incident, kind=EventKind.HINT)
    assert "marked 'Out of GPU memory' wrong" in event.message


@pytest.mark.django_db
def test_one_vote_per_person_and_it_can_change(world_a: TenantWorld) -> None:
    serve_says(world_a, OOM)
    incident = incident_of(world_a)
    operator = Actor(user=world_a.operator)
    kwargs = {"tenant": world_a.tenant, "incident": incident, "cause": "Out of GPU memory"}
    hint_feedback_set(actor=operator, verdict="wrong", **kwargs)
    weight = hint_feedback_set(actor=operator, verdict="right", **kwargs)
    assert (weight.right, weight.wrong) == (1, 0)
    assert HintFeedback.objects.filter(incident=incident).count() == 1
    # The owner's token votes as the owner: a second person.
    token = Actor(token=world_a.token)
    weight = hint_feedback_set(actor=token, verdict="right", **kwargs)
    weight = hint_feedback_set(actor=Actor(user=world_a.owner), verdict="wrong", **kwargs)
    assert (weight.right, weight.wrong) == (1, 1)
    weight = hint_feedback_set(actor=operator, verdict="", **kwargs)  # taken back
    assert (weight.right, weight.wrong, weight.multiplier) == (0, 1, pytest.approx(0.6667, 1e-3))
    hints = world_a.client("operator").get(api("incident-hints", pk=incident.pk)).json()
    assert hints["my_votes"] == {}
    hint_feedback_set(actor=operator, verdict="wrong", **kwargs)
    hints = world_a.client("operator").get(api("incident-hints", pk=incident.pk)).json()
    assert hints["my_votes"] == {"out of gpu memory": "wrong"}


@pytest.mark.django_db
def test_three_wrongs_mute_a_cause(world_a: TenantWorld) -> None:
    serve_says(world_a, OOM)
    first = resolved(world_a, incident_of(world_a))
    second = incident_of(world_a)
    assert first.pk != second.pk
    for incident, user in (
        (first, world_a.owner),
        (first, world_a.operator),
        (second, world_a.owner),
    ):
        hint_feedback_set(
            tenant=world_a.tenant, actor=Actor(user=user), incident=incident,
            cause="Out of GPU memory", verdict="wrong",
        )  # fmt: skip
    hints = world_a.client("viewer").get(api("incident-hints", pk=second.pk)).json()
    assert "Out of GPU memory" not in [h["cause"] for h in hints["hints"]]
    assert [h["cause"] for h in hints["muted"]] == ["Out of GPU memory"]
    body = world_a.client("viewer").get(page(world_a, "incident-detail", pk=second.pk)).content
    assert b'data-testid="muted-hints"' in body


@pytest.mark.django_db
def test_bad_votes_name_the_field(world_a: TenantWorld) -> None:
    incident = incident_of(world_a)
    client = world_a.client("operator")
    url = api("incident-hint-feedback", pk=incident.pk)
    bad = client.post(url, {"cause": "Aliens", "verdict": "right"}, format="json")
    assert bad.status_code == 400 and "cause" in bad.json()["error"]["fields"]
    bad = client.post(url, {"cause": "KV cache exhausted", "verdict": "maybe"}, format="json")
    assert bad.status_code == 400 and "verdict" in bad.json()["error"]["fields"]
    bad = client.post(url, {"cause": "x" * 5000, "verdict": "right"}, format="json")
    assert bad.status_code == 400 and "cause" in bad.json()["error"]["fields"]
    with pytest.raises(ValidationFailed):
        hint_feedback_set(
            tenant=world_a.tenant, actor=Actor(system="celery"), incident=incident,
            cause="KV cache exhausted", verdict="right",
        )  # fmt: skip
    assert not HintFeedback.objects.exists()


@pytest.mark.django_db
def test_a_viewer_cannot_vote(world_a: TenantWorld) -> None:
    serve_says(world_a, OOM)
    incident = incident_of(world_a)
    body = {"cause": "Out of GPU memory", "verdict": "wrong"}
    viewer = world_a.client("viewer")
    assert viewer.post(api("incident-hint-feedback", pk=incident.pk), body).status_code == 403
    form = page(world_a, "incident-hint-feedback", pk=incident.pk)
    assert viewer.post(form, body).status_code == 403
    assert (
        b'data-testid="hint-vote"'
        not in viewer.get(page(world_a, "incident-detail", pk=incident.pk)).content
    )
    assert not HintFeedback.objects.exists()


@pytest.mark.django_db
def test_the_page_votes_and_shows_the_weight(world_a: TenantWorld) -> None:
    serve_says(world_a, OOM)
    rival_rule(world_a)
    incident = incident_of(world_a)
    client = world_a.client("operator")
    detail = page(world_a, "incident-detail", pk=incident.pk)
    assert b'data-testid="hint-vote"' in client.get(detail).content
    response = client.post(
        page(world_a, "incident-hint-feedback", pk=incident.pk),
        {"cause": "Out of GPU memory", "verdict": "wrong"},
    )
    assert response.status_code == 302 and response["Location"] == detail
    html = client.get(detail).content.decode()
    html = html[html.index('data-testid="hints"') :]
    assert html.index("Batch too large") < html.index("Out of GPU memory")
    assert "x0.67 from your team" in html and "Wrong (take back)" in html
