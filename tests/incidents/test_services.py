"""Incident services: dedup (also under concurrency), ordered status transitions, the
append-only timeline, rollback links, and the live event sent on commit."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer
from channels_redis.core import RedisChannelLayer
from django.core.exceptions import ValidationError
from django.db import connection
from django.utils import timezone

from incidents import services
from incidents.models import Incident, IncidentEvent, SlaBreach
from incidents.notifications import delivery as notify
from portal.exceptions import ConflictError, ValidationFailed
from serving.deployments.models import DeploymentRevision
from serving.ops.models import Rollback
from tenants.actors import Actor
from tenants.models import AuditEvent
from tests.conftest import TenantWorld
from tests.incidents.factories import breach, deployment_of

pytestmark = pytest.mark.django_db


def test_one_breach_opens_one_incident(world_a: TenantWorld) -> None:
    first, incident, opened = breach(world_a)
    again, same, opened_again = breach(world_a, detected_at=timezone.now())
    assert opened and not opened_again
    assert same.pk == incident.pk and again.pk == first.pk
    again.refresh_from_db()
    assert again.occurrences == 2 and again.last_seen_at > again.detected_at
    assert Incident.objects.filter(tenant=world_a.tenant).count() == 1
    assert SlaBreach.objects.filter(tenant=world_a.tenant).count() == 1
    assert [e.kind for e in incident.events.all()] == ["breach"]
    assert incident.first_breach_id == first.pk and incident.severity == "page"
    assert incident.dedup_key == f"{deployment_of(world_a).pk}:stable"
    assert AuditEvent.objects.filter(tenant=world_a.tenant, action="incident.opened").count() == 1


def test_another_objective_joins_the_slots_incident(world_a: TenantWorld) -> None:
    first, base, _ = breach(world_a)
    second, joined, opened = breach(world_a, objective="latency-p95")
    assert not opened and joined.pk == base.pk
    assert second.pk != first.pk and second.occurrences == 1 and second.incident_id == base.pk
    kinds = list(base.events.order_by("pk").values_list("kind", "data__objective"))
    assert kinds == [("breach", "availability"), ("breach", "latency-p95")]
    repeat, _, _ = breach(world_a, objective="latency-p95")
    assert repeat.pk == second.pk and repeat.occurrences == 2


def test_a_page_breach_joining_a_ticket_incident_raises_it_to_a_page(
    world_a: TenantWorld,
) -> None:
    from incidents.notifications.models import NotificationDelivery

    actor = Actor(user=world_a.owner)
    services.notification_channel_create(
        tenant=world_a.tenant, actor=actor, kind="email", name="pager", email="p@acme.example",
        min_severity="page",
    )  # fmt: skip
    _, incident, _ = breach(world_a, objective="slow-burn", severity="ticket")
    assert not NotificationDelivery.objects.filter(incident=incident).exists()
    _, joined, opened = breach(world_a, objective="fast-burn", severity="page")
    assert not opened and joined.pk == incident.pk
    incident.refresh_from_db()
    assert incident.severity == "page"
    kinds = list(incident.events.order_by("pk").values_list("kind", flat=True))
    assert kinds == ["breach", "escalated", "breach"]
    escalated = incident.events.get(kind="escalated")
    assert escalated.data["severity"] == {"from": "ticket", "to": "page"}
    assert "fast-burn" in escalated.message
    # The pager hears of it now; a later ticket breach never lowers the severity.
    assert NotificationDelivery.objects.filter(incident=incident, event=escalated).count() == 1
    breach(world_a, objective="another-slow-burn", severity="ticket")
    incident.refresh_from_db()
    assert incident.severity == "page" and incident.events.filter(kind="escalated").count() == 1


def test_other_groups_and_drills_open_their_own(world_a: TenantWorld) -> None:
    _, base, _ = breach(world_a)
    _, other_group, opened_b = breach(world_a, group="canary")
    _, drill, opened_c = breach(world_a, is_drill=True)
    assert opened_b and opened_c
    assert len({base.pk, other_group.pk, drill.pk}) == 3
    assert drill.is_drill and drill.dedup_key.startswith("drill:")


def test_a_resolved_incident_is_followed_by_a_new_one(world_a: TenantWorld) -> None:
    actor = Actor(user=world_a.operator)
    _, first, _ = breach(world_a)
    services.incident_resolve(tenant=world_a.tenant, actor=actor, incident=first)
    _, second, opened = breach(world_a)
    assert opened and second.pk != first.pk
    first.refresh_from_db()
    assert first.status == "resolved" and second.status == "triggered"


def test_transitions_move_forward_with_ordered_timestamps(world_a: TenantWorld) -> None:
    actor = Actor(user=world_a.operator)
    _, incident, _ = breach(world_a)
    services.incident_acknowledge(tenant=world_a.tenant, actor=actor, incident=incident)
    services.incident_mitigate(tenant=world_a.tenant, actor=actor, incident=incident)
    services.incident_resolve(tenant=world_a.tenant, actor=actor, incident=incident)
    incident.refresh_from_db()
    assert incident.status == "resolved"
    assert (
        incident.triggered_at
        <= incident.acknowledged_at
        <= incident.mitigated_at
        <= incident.resolved_at
    )
    changes = [e.data for e in incident.events.filter(kind="status_changed")]
    assert changes == [
        {"from": "triggered", "to": "acknowledged"},
        {"from": "acknowledged", "to": "mitigated"},
        {"from": "mitigated", "to": "resolved"},
    ]
    assert {e.actor_id for e in incident.events.filter(kind="status_changed")} == {
        world_a.operator.pk
    }
    actions = AuditEvent.objects.filter(tenant=world_a.tenant, object_id=str(incident.pk))
    assert set(actions.values_list("action", flat=True)) >= {
        "incident.acknowledged",
        "incident.mitigated",
        "incident.resolved",
    }


def test_a_detector_clock_ahead_never_reorders_the_stages(world_a: TenantWorld) -> None:
    future = timezone.now() + timedelta(seconds=30)
    _, incident, _ = breach(world_a, detected_at=future)
    services.incident_acknowledge(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner), incident=incident
    )
    incident.refresh_from_db()
    assert incident.acknowledged_at >= incident.triggered_at == future


@pytest.mark.parametrize(
    ("path", "then"),
    [
        (["resolve"], "acknowledge"),
        (["resolve"], "mitigate"),
        (["mitigate"], "acknowledge"),
        (["acknowledge", "resolve"], "mitigate"),
    ],
)
def test_invalid_transitions_name_the_status(
    world_a: TenantWorld, path: list[str], then: str
) -> None:
    actor = Actor(user=world_a.owner)
    _, incident, _ = breach(world_a)
    for step in path:
        getattr(services, f"incident_{step}")(tenant=world_a.tenant, actor=actor, incident=incident)
    events = incident.events.count()
    with pytest.raises(ConflictError) as caught:
        getattr(services, f"incident_{then}")(tenant=world_a.tenant, actor=actor, incident=incident)
    assert caught.value.field == "status"
    assert incident.events.count() == events


def test_repeating_the_current_status_is_a_no_op(world_a: TenantWorld) -> None:
    actor = Actor(user=world_a.owner)
    _, incident, _ = breach(world_a)
    services.incident_acknowledge(tenant=world_a.tenant, actor=actor, incident=incident)
    services.incident_acknowledge(tenant=world_a.tenant, actor=actor, incident=incident)
    assert incident.events.filter(kind="status_changed").count() == 1


def test_clean_refuses_unordered_timestamps_and_inconsistent_status(world_a: TenantWorld) -> None:
    _, incident, _ = breach(world_a)
    incident.acknowledged_at = incident.triggered_at - timedelta(seconds=1)
    incident.status = "acknowledged"
    with pytest.raises(ValidationError) as caught:
        incident.clean()
    assert "acknowledged_at" in caught.value.message_dict
    incident.acknowledged_at = incident.triggered_at + timedelta(seconds=1)
    incident.status = "resolved"
    with pytest.raises(ValidationError) as caught:
        incident.clean()
    assert "status" in caught.value.message_dict
    incident.status = "acknowledged"
    incident.clean()


def test_the_timeline_is_append_only(world_a: TenantWorld) -> None:
    _, incident, _ = breach(world_a)
    event = services.incident_note(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner), incident=incident, text="looking"
    )
    assert event.kind == "note" and event.actor_id == world_a.owner.pk
    event.message = "rewritten"
    with pytest.raises(TypeError):
        event.save()
    with pytest.raises(TypeError):
        event.delete()
    with pytest.raises(TypeError):
        IncidentEvent.objects.filter(pk=event.pk).update(message="rewritten")
    with pytest.raises(TypeError):
        IncidentEvent.objects.filter(pk=event.pk).delete()
    event.refresh_from_db()
    assert event.message == "looking"


def test_notes_and_events_are_checked(world_a: TenantWorld) -> None:
    _, incident, _ = breach(world_a)
    actor = Actor(user=world_a.owner)
    with pytest.raises(ValidationFailed) as caught:
        services.incident_note(tenant=world_a.tenant, actor=actor, incident=incident, text="  ")
    assert caught.value.field == "text"
    with pytest.raises(ValidationFailed) as caught:
        services.incident_event_append(
            tenant=world_a.tenant, incident=incident, kind="gossip", message="x"
        )
    assert caught.value.field == "kind"


def test_breach_input_is_checked(world_a: TenantWorld, world_b: TenantWorld) -> None:
    with pytest.raises(ValidationFailed) as caught:
        breach(world_a, group="blue")
    assert caught.value.field == "group"
    with pytest.raises(ValidationFailed) as caught:
        breach(world_a, kind="vibes")
    assert caught.value.field == "kind"
    with pytest.raises(ValidationFailed) as caught:
        services.breach_record(
            tenant=world_b.tenant, deployment=deployment_of(world_a), group="stable",
            objective="availability", kind="burn", severity="page", action="notify",
            detail="", observed={}, detected_at=timezone.now(),
        )  # fmt: skip
    assert caught.value.field == "deployment"
    assert not Incident.objects.exists()


def _rollback(world: TenantWorld, **fields: Any) -> Rollback:
    revision = DeploymentRevision.objects.filter(deployment=deployment_of(world)).first()
    assert revision is not None
    return Rollback.objects.create(
        tenant=world.tenant, deployment=deployment_of(world), key=f"rb-{revision.pk}",
        trigger="breach", reason="burn", from_revision=revision, to_revision=revision,
        detected_at=timezone.now() - timedelta(seconds=3), **fields,
    )  # fmt: skip


def test_a_finished_rollback_mitigates_the_incident(world_a: TenantWorld) -> None:
    _, incident, _ = breach(world_a)
    rollback = _rollback(world_a, status="switching", started_at=timezone.now())
    services.incident_rollback_started(tenant=world_a.tenant, incident=incident, rollback=rollback)
    rollback.status, rollback.finished_at = "done", timezone.now()
    rollback.traffic_switched_at = rollback.finished_at
    rollback.save()
    services.incident_rollback_finished(tenant=world_a.tenant, incident=incident, rollback=rollback)
    incident.refresh_from_db()
    assert incident.rollback_id == rollback.pk and incident.status == "mitigated"
    kinds = list(incident.events.values_list("kind", flat=True))
    assert kinds == ["breach", "rollback_started", "rollback_finished", "status_changed"]
    finished = incident.events.get(kind="rollback_finished")
    assert finished.data["detect_to_finish_s"] > 0
    assert incident.events.get(kind="status_changed").actor_label == "system:incidents"


def test_a_rollback_of_another_tenant_is_refused(
    world_a: TenantWorld, world_b: TenantWorld
) -> None:
    _, incident, _ = breach(world_a)
    with pytest.raises(ValidationFailed) as caught:
        services.incident_link_rollback(
            tenant=world_a.tenant, incident=incident, rollback=_rollback(world_b)
        )
    assert caught.value.field == "rollback"


def test_the_live_pages_hear_of_it_after_commit(
    world_a: TenantWorld, django_capture_on_commit_callbacks: Any
) -> None:
    layer = get_channel_layer()
    group = notify.group_name(world_a.tenant.pk)

    def open_breach() -> Incident:
        with django_capture_on_commit_callbacks(execute=True):
            return breach(world_a)[1]

    async def scenario() -> tuple[Incident, dict[str, Any]]:
        # One event loop for the listener (the pub/sub layer's channels belong to the loop that
        # made them); the breach runs back on this thread, in the test's transaction.
        channel = await layer.new_channel()
        await layer.group_add(group, channel)
        try:
            incident = await sync_to_async(open_breach)()
            return incident, await asyncio.wait_for(layer.receive(channel), 5)
        finally:
            await layer.group_discard(group, channel)

    incident, message = async_to_sync(scenario)()
    assert message == {
        "type": "incident.updated",
        "incident": incident.pk,
        "status": "triggered",
        "event": "breach",
    }


def test_a_channel_layer_that_is_down_never_fails_the_write(
    world_a: TenantWorld,
    django_capture_on_commit_callbacks: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A real Redis channel layer pointed at a port where nothing listens.
    down = RedisChannelLayer(hosts=["redis://127.0.0.1:1/0"])
    monkeypatch.setattr(notify, "get_channel_layer", lambda: down)
    with django_capture_on_commit_callbacks(execute=True):
        _, incident, opened = breach(world_a)
    assert opened and Incident.objects.filter(pk=incident.pk).exists()
    assert "not broadcast" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_concurrent_breaches_open_one_incident(world_a: TenantWorld) -> None:
    threads_n = 4
    barrier = threading.Barrier(threads_n)
    results: list[Any] = []
    errors: list[BaseException] = []
    detected = timezone.now()

    def record() -> None:
        try:
            barrier.wait(timeout=10)
            results.append(breach(world_a, detected_at=detected))
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=record) for _ in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors, errors
    assert sum(1 for _, _, opened in results if opened) == 1
    assert len({incident.pk for _, incident, _ in results}) == 1
    assert Incident.objects.filter(tenant=world_a.tenant).count() == 1
    only = SlaBreach.objects.get(tenant=world_a.tenant)
    assert only.occurrences == threads_n
    assert IncidentEvent.objects.filter(tenant=world_a.tenant, kind="breach").count() == 1


def test_a_recurrence_after_mitigation_opens_a_new_incident(world_a: TenantWorld) -> None:
    """A mitigated incident (say, rolled back) takes no new breaches: the same objective
    breaching again later is a new incident, so the ops loop acts on it again."""
    _, first, _ = breach(world_a)
    services.incident_mitigate(tenant=world_a.tenant, actor=None, incident=first)
    again, second, opened = breach(world_a)
    assert opened and second.pk != first.pk and again.occurrences == 1
