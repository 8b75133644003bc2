"""Which slots the golden-prompt probe replays, without a cluster: the deployments whose
contract names `output_consistency`, least recently probed first, at most the bound, each slot
with the golden answers its own version recorded (the Ray test replays them for real)."""

from __future__ import annotations

import json
import time

import pytest
import redis
from django.conf import settings

from serving.deployments.models import Deployment
from serving.ops import contracts
from serving.ops.consistency import slot_probes
from serving.ops.health.state import consistency_field, consistency_key
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.serving.factories import _served
from tests.serving.test_consistency_ray import CONSISTENCY_CONTRACT

pytestmark = pytest.mark.django_db
SERVE = "http://127.0.0.1:1"


def test_the_probe_picks_contracted_deployments_least_recently_probed_first(
    world_a: TenantWorld, world_b: TenantWorld
) -> None:
    a, b = _served(world_a), _served(world_b)
    Deployment.objects.filter(pk__in=[a.pk, b.pk]).update(status="running")
    assert slot_probes(SERVE) == []  # no contract names the SLI
    for world, deployment in ((world_a, a), (world_b, b)):
        contracts.contract_set(
            tenant=world.tenant,
            actor=Actor(user=world.owner),
            deployment=deployment,
            source=CONSISTENCY_CONTRACT,
        )
    slots = slot_probes(SERVE)
    assert [(s.deployment_id, s.group) for s in slots] == [(a.pk, "stable"), (b.pk, "stable")]
    assert slots[0].url == f"{SERVE}/acme/assistant/v1/completions"
    version = a.current_revision.stable_version
    assert slots[0].golden["prompts"] == version.golden["prompts"]
    assert slots[0].key.startswith("ik_probe_")
    # A was probed just now: B goes first, and a bound of one leaves A for the next run.
    done = {"score": 1.0, "at": time.time(), "detail": ""}
    redis.Redis.from_url(settings.REDIS_URL).hset(
        consistency_key(), consistency_field(a.pk, "stable"), json.dumps(done)
    )
    assert [s.deployment_id for s in slot_probes(SERVE, limit=1)] == [b.pk]
    # A deployment that does not serve is not probed.
    Deployment.objects.filter(pk=b.pk).update(status="failed")
    assert [s.deployment_id for s in slot_probes(SERVE)] == [a.pk]


def test_a_run_cut_off_keeps_the_scores_it_measured_and_the_next_run_moves_on(
    world_a: TenantWorld, world_b: TenantWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The task's hard time limit can stop a run mid-way (a slow deployment's replies): the
    slots measured before are stored, so the next run does not start over with them (one slow
    deployment must not keep every other one from being probed)."""
    from serving.ops import consistency

    a, b = _served(world_a), _served(world_b)
    Deployment.objects.filter(pk__in=[a.pk, b.pk]).update(status="running")
    for world, deployment in ((world_a, a), (world_b, b)):
        contracts.contract_set(
            tenant=world.tenant,
            actor=Actor(user=world.owner),
            deployment=deployment,
            source=CONSISTENCY_CONTRACT,
        )
    order = [s.deployment_id for s in slot_probes(SERVE)]
    assert order == [a.pk, b.pk]

    async def replay(session: object, slot: consistency.SlotProbe) -> dict[str, object]:
        if slot.deployment_id == b.pk:
            raise TimeoutError("the run's time limit")  # stands in for the worker's kill
        return {"score": 1.0, "at": time.time(), "detail": "8/8", "version": slot.version}

    monkeypatch.setattr(consistency, "_replay", replay)
    with pytest.raises(TimeoutError):
        consistency.consistency_probe(serve_url=SERVE)
    stored = consistency.consistency_scores(a.pk)
    assert stored["stable"]["score"] == 1.0
    assert [s.deployment_id for s in slot_probes(SERVE)] == [b.pk, a.pk]


def test_tenants_take_turns_whatever_their_number_of_deployments() -> None:
    """Round-robin per tenant: a tenant with many deployments gets one per round."""
    from types import SimpleNamespace
    from typing import Any

    from serving.ops.consistency import fair_order

    def target(pk: int, tenant: int) -> Any:
        return SimpleNamespace(deployment=SimpleNamespace(pk=pk, tenant_id=tenant))

    many = [target(pk, tenant=1) for pk in range(1, 9)]  # never probed: the most overdue
    others = [target(20, tenant=2), target(30, tenant=3)]
    last = {20: 100.0, 30: 50.0}
    order = [t.deployment.pk for t in fair_order([*others, *many], last)]
    assert order[:3] == [1, 30, 20] and order[3:] == list(range(2, 9))


def test_a_slow_slot_gets_its_budget_and_the_run_moves_on(
    world_a: TenantWorld, world_b: TenantWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    from serving.ops import consistency

    a, b = _served(world_a), _served(world_b)
    Deployment.objects.filter(pk__in=[a.pk, b.pk]).update(status="running")
    for world, deployment in ((world_a, a), (world_b, b)):
        contracts.contract_set(
            tenant=world.tenant, actor=Actor(user=world.owner), deployment=deployment,
            source=CONSISTENCY_CONTRACT,
        )  # fmt: skip

    async def replay(session: object, slot: consistency.SlotProbe) -> dict[str, object]:
        if slot.deployment_id == a.pk:
            await asyncio.sleep(30)  # a slow tenant's deployment
        return {"score": 1.0, "at": time.time(), "detail": "8/8", "version": slot.version}

    monkeypatch.setattr(consistency, "_replay", replay)
    monkeypatch.setattr(consistency, "SLOT_BUDGET_S", 0.2)
    started = time.monotonic()
    scores = consistency.consistency_probe(serve_url=SERVE)
    assert time.monotonic() - started < 5
    assert scores[(a.pk, "stable")]["score"] == 0.0
    assert "budget" in str(scores[(a.pk, "stable")]["detail"])
    assert scores[(b.pk, "stable")]["score"] == 1.0
