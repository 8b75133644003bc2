"""The cause-rules page: the tenant's own rules with how many recent incidents each would have
matched, and forms to add, edit, switch and remove one, through the services the API uses
(same checks, same audit rows). Errors sit next to the field they name; a viewer reads only;
another tenant's rule is a 404."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from incidents import services
from incidents.models import CauseRule
from tenants.actors import Actor
from tenants.models import AuditEvent
from tests.conftest import TenantWorld
from tests.incidents.factories import breach, cause_rule_for_world

pytestmark = pytest.mark.django_db

GOOD = {
    "symptom": "kv_usage",
    "op": "gte",
    "threshold": "0.9",
    "cause": "Tenant cache too small",
    "fix": "buy more blocks",
    "weight": "2.5",
    "is_active": "on",
}


def _url(world: TenantWorld, name: str = "cause-rules", *args: Any) -> str:
    return reverse(name, args=[world.tenant.slug, *args])


def _actions(world: TenantWorld) -> list[str]:
    rows = AuditEvent.objects.filter(tenant=world.tenant, action__startswith="cause_rule.")
    return list(rows.order_by("id").values_list("action", flat=True))


def test_the_page_lists_only_the_tenants_rules_with_their_matches(
    client: Client, world_a: TenantWorld, world_b: TenantWorld
) -> None:
    actor = Actor(user=world_a.owner)
    canary = services.cause_rule_create(
        tenant=world_a.tenant, actor=actor, symptom="canary_involved", op="true",
        cause="Canary went bad", is_active=False,
    )  # fmt: skip
    kv = cause_rule_for_world(world_a)
    services.cause_rule_create(
        tenant=world_b.tenant, actor=Actor(user=world_b.owner), symptom="kv_usage", op="gt",
        threshold=0.5, cause="Globex secret cause",
    )  # fmt: skip
    breach(world_a, group="canary")  # an incident of today with a canary involved
    breach(world_a, objective="latency", detected_at=timezone.now() - timedelta(days=40))
    client.force_login(world_a.viewer)
    page = client.get(_url(world_a)).content.decode()
    assert page.count('data-testid="rule-row"') == 2
    assert "Canary went bad" in page and "Tenant cache too small" in page
    assert "Globex secret cause" not in page
    assert 'data-testid="rule-form"' not in page  # a viewer reads only
    # The counts come in a fragment the page loads once it shows.
    fragment_url = _url(world_a, "cause-rule-matches")
    assert f'hx-get="{fragment_url}"' in page
    fragment = client.get(fragment_url)
    counts = [(rule.pk, matched) for rule, matched in fragment.context["rows"]]
    assert counts == [(canary.pk, 1), (kv.pk, 0)]
    text = fragment.content.decode()
    assert "1 incident triggered in the last 30 days" in text  # the 40-day-old one is out
    assert "hx-get" not in text and "Globex secret cause" not in text
    assert 'data-testid="rule-matched">1 of 1<' in text


def test_add_edit_switch_and_remove_are_audited(client: Client, world_a: TenantWorld) -> None:
    client.force_login(world_a.operator)
    response = client.post(_url(world_a), GOOD, follow=True)
    assert "Rule added: kv_usage → Tenant cache too small." in response.content.decode()
    rule = CauseRule.objects.get(tenant=world_a.tenant)
    assert (rule.threshold, rule.weight, rule.is_active) == (0.9, 2.5, True)
    edit = _url(world_a, "cause-rule-edit", rule.pk)
    assert client.get(edit).context["form"].initial["cause"] == "Tenant cache too small"
    response = client.post(edit, {**GOOD, "op": "true", "threshold": "", "cause": "Renamed"})
    assert response.status_code == 302
    rule.refresh_from_db()
    assert (rule.op, rule.threshold, rule.cause) == ("true", None, "Renamed")
    client.post(_url(world_a, "cause-rule-switch", rule.pk))
    rule.refresh_from_db()
    assert rule.is_active is False
    client.post(_url(world_a, "cause-rule-delete", rule.pk))
    assert not CauseRule.objects.filter(pk=rule.pk).exists()
    assert _actions(world_a) == [
        "cause_rule.created", "cause_rule.changed", "cause_rule.changed", "cause_rule.deleted"
    ]  # fmt: skip
    changed = AuditEvent.objects.filter(action="cause_rule.changed").order_by("id").first()
    assert changed is not None and changed.actor_id == world_a.operator.pk
    assert (changed.before["cause"], changed.after["cause"]) == (
        "Tenant cache too small",
        "Renamed",
    )


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"threshold": "lots"}, "threshold", "Enter a number."),
        ({"threshold": ""}, "threshold", "the 'gte' rule needs a threshold."),
        ({"threshold": "inf"}, "threshold", "Enter a number."),
        ({"symptom": "moon_phase"}, "symptom", "must be one of error_ratio_stable"),
        ({"op": "approx"}, "op", "must be one of gt, gte"),
        ({"cause": "  "}, "cause", "name the likely cause."),
        ({"weight": "11"}, "weight", "less than or equal to 10"),
        ({"fix": "x" * 2001}, "fix", "at most 2000 characters."),
    ],
)
def test_bad_input_is_refused_next_to_its_field(
    client: Client, world_a: TenantWorld, change: dict[str, str], field: str, message: str
) -> None:
    client.force_login(world_a.owner)
    response = client.post(_url(world_a), {**GOOD, **change})
    assert response.status_code == 200
    errors = response.context["form"].errors
    assert list(errors) == [field] and message in " ".join(errors[field])
    assert f'id="id_{field}_error"' in response.content.decode()  # rendered beside the field
    assert not CauseRule.objects.filter(tenant=world_a.tenant).exists()
    assert _actions(world_a) == []


def test_an_edit_with_bad_input_names_the_field_and_changes_nothing(
    client: Client, world_a: TenantWorld
) -> None:
    rule = cause_rule_for_world(world_a)
    client.force_login(world_a.owner)
    response = client.post(_url(world_a, "cause-rule-edit", rule.pk), {**GOOD, "symptom": "x"})
    assert list(response.context["form"].errors) == ["symptom"]
    rule.refresh_from_db()
    assert rule.symptom == "kv_usage"
    assert _actions(world_a) == ["cause_rule.created"]


def test_the_api_refuses_what_the_page_refuses(world_a: TenantWorld) -> None:
    api = world_a.client()
    url = "/api/v1/cause-rules/"
    body = {"symptom": "kv_usage", "op": "gte", "threshold": "nan", "cause": "x"}
    response = api.post(url, body, format="json")
    assert response.status_code == 400 and "threshold" in response.json()["error"]["fields"]
    response = api.post(url, {**body, "threshold": 1, "fix": "y" * 2001}, format="json")
    assert response.status_code == 400 and "fix" in response.json()["error"]["fields"]


def test_a_viewer_cannot_change_rules(client: Client, world_a: TenantWorld) -> None:
    rule = cause_rule_for_world(world_a)
    client.force_login(world_a.viewer)
    response = client.post(_url(world_a), GOOD, follow=True)
    assert "Your role cannot add cause rules." in response.content.decode()
    assert client.get(_url(world_a, "cause-rule-edit", rule.pk)).status_code == 403
    for name in ("cause-rule-edit", "cause-rule-switch", "cause-rule-delete"):
        assert client.post(_url(world_a, name, rule.pk), GOOD).status_code == 403
    rule.refresh_from_db()
    assert rule.is_active and CauseRule.objects.filter(tenant=world_a.tenant).count() == 1
    assert _actions(world_a) == ["cause_rule.created"]


def test_the_window_is_capped_at_the_newest_incidents(
    client: Client, world_a: TenantWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    from incidents.rca import rule_matches

    monkeypatch.setattr(rule_matches, "MAX_INCIDENTS", 1)
    actor = Actor(user=world_a.owner)
    for objective in ("availability", "latency"):
        _, incident, _ = breach(world_a, objective=objective)
        services.incident_resolve(tenant=world_a.tenant, actor=actor, incident=incident)
    cause_rule_for_world(world_a)
    client.force_login(world_a.viewer)
    text = client.get(_url(world_a, "cause-rule-matches")).content.decode()
    assert "(the newest 1 only)" in text


def test_another_tenants_rule_is_not_found(
    client: Client, world_a: TenantWorld, world_b: TenantWorld
) -> None:
    theirs = cause_rule_for_world(world_b)
    client.force_login(world_a.owner)
    assert client.get(_url(world_a, "cause-rule-edit", theirs.pk)).status_code == 404
    for name in ("cause-rule-edit", "cause-rule-switch", "cause-rule-delete"):
        assert client.post(_url(world_a, name, theirs.pk), GOOD).status_code == 404
    theirs.refresh_from_db()
    assert theirs.is_active and theirs.cause == "Tenant cache too small"


def test_the_page_reads_in_fixed_queries(
    client: Client, world_a: TenantWorld, django_assert_max_num_queries: Any
) -> None:
    for i in range(5):
        services.cause_rule_create(
            tenant=world_a.tenant, actor=Actor(user=world_a.owner), symptom="kv_usage",
            op="gt", threshold=i, cause=f"cause {i}",
        )  # fmt: skip
    for objective in ("availability", "latency"):
        _, incident, _ = breach(world_a, objective=objective)
        services.incident_resolve(
            tenant=world_a.tenant, actor=Actor(user=world_a.owner), incident=incident
        )
    for _ in range(10):  # open incidents: the page itself never reads their signals
        breach(world_a, objective="latency")
    client.force_login(world_a.owner)
    with django_assert_max_num_queries(12):
        assert client.get(_url(world_a)).status_code == 200
    first = client.get(_url(world_a, "cause-rule-matches"))
    assert [matched for _, matched in first.context["rows"]] == [0] * 5
    # Each incident's signals are read once, then come from the cache.
    with django_assert_max_num_queries(12):
        assert client.get(_url(world_a, "cause-rule-matches")).status_code == 200
