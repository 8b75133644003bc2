"""The hostile-tenant suite, priority classes: a tenant that marks every key realtime in a
shared pool still runs at most its share of the batch, cannot take a neighbour's place below
its own count, and cannot starve the neighbour's batch work beyond the aging bound; the class
is one of two words, set only through the portal (a client's body or header cannot raise it),
and a bad one is refused naming `priority`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from serving.dataplane.app import VersionCore
from serving.deployments.models import Deployment, InferenceKey
from serving.engine.engine import Engine, SamplingParams
from serving.engine.model import LlamaModel
from serving.engine.priority import BATCH, REALTIME
from serving.engine.testing import write_tiny_checkpoint
from tests.conftest import TenantWorld
from tests.engine.conftest import load_model


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> LlamaModel:
    return load_model(write_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "m"), "tiny")


def _add(engine: Engine, tenant: str, name: str, priority: str, tokens: int) -> Any:
    prompt = [(len(name) * 17 + i * 7) % 200 + 3 for i in range(6)]
    return engine.add_request(prompt, SamplingParams(max_tokens=tokens, ignore_eos=True),
                              tenant=tenant, request_id=name, priority=priority)  # fmt: skip


def test_an_all_realtime_tenant_cannot_starve_a_neighbours_batch_in_the_engine(
    model: LlamaModel,
) -> None:
    """Even a pool that lets the hostile tenant fill every slot: the neighbour's batch request
    ages past the bound and then goes first (fewest running), never waiting on the flood."""
    engine = Engine(model, max_num_seqs=3, max_running={"hostile": 3, "victim": 3})
    engine.batch_max_wait_steps, engine.batch_max_wait_s = 12, 3600.0
    flood = [_add(engine, "hostile", f"h{i}", REALTIME, 6) for i in range(3)]
    engine.step()
    victim = _add(engine, "victim", "v", BATCH, 4)
    admitted_on = None
    for step in range(1, 200):
        while sum(1 for s in engine.waiting if s.tenant == "hostile") < 3:
            flood.append(_add(engine, "hostile", f"h{len(flood)}", REALTIME, 6))
        engine.step()
        assert sum(1 for s in engine.running if s.tenant == "hostile") <= 3
        if victim.scheduled_at is not None:
            admitted_on = step
            break
    # The bound, then one hostile slot freeing (6 tokens).
    assert victim.aged and admitted_on is not None and admitted_on <= 12 + 6, admitted_on
    engine.run_until_done([victim])
    assert victim.finish_reason == "length" and victim.preempted == 0


def test_a_realtime_flood_keeps_to_its_share_and_never_preempts_a_smaller_neighbour(
    model: LlamaModel,
) -> None:
    # The hostile tenant may run up to 3, but the victim's batch sequence already runs: its
    # realtime flood takes the free slots and may not push the victim below its own count.
    engine = Engine(model, max_num_seqs=3, max_running={"hostile": 3, "victim": 2})
    batch = _add(engine, "victim", "vb", BATCH, 30)
    engine.step()
    flood = [_add(engine, "hostile", f"h{i}", REALTIME, 30) for i in range(10)]
    for _ in range(20):
        engine.step()
        assert sum(1 for s in engine.running if s.tenant == "hostile") <= 2
    assert batch in engine.running and batch.preempted == 0  # victim 1 < hostile 2: kept
    engine.run_until_done([batch])
    assert batch.finish_reason == "length"
    assert sum(1 for s in flood if s.finished) <= 4  # the victim did not wait for the flood
    assert engine.metrics()["tenants"]["victim"]["priority_preemptions"] == 0


async def _until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError("condition never held")
        await asyncio.sleep(0.002)


def test_a_shared_pool_replica_bounds_an_all_realtime_tenant(tmp_path: Path) -> None:
    """The real version slot of a shared pool (kv_mode shared, each tenant's max_running)."""
    core = VersionCore(app="platform.tiny.pool", group="pool",
                       engine={"num_blocks": 512, "max_num_seqs": 3})  # fmt: skip
    config = {"version": "p1", "artifact": str(write_tiny_checkpoint(tmp_path / "tiny")),
              "fingerprint": "fp-p", "kv_mode": "shared", "faults": {},
              "tenants": {"h": {"salt": "aa" * 32, "quota_blocks": 128, "max_running": 2},
                          "v": {"salt": "bb" * 32, "quota_blocks": 128, "max_running": 2}}}  # fmt: skip
    finished: list[str] = []
    most_hostile = [0]

    def request(tenant: str, rid: str, priority: str, tokens: int) -> dict[str, Any]:
        sampling = {"max_tokens": tokens, "temperature": 0.0, "top_p": 1.0, "stream": False}
        return {"request_id": rid, "tenant": tenant, "prompt": f"flood {rid}",
                "sampling": sampling, "guard": {}, "priority": priority}  # fmt: skip

    async def one(tenant: str, rid: str, priority: str, tokens: int) -> None:
        await core.complete(request(tenant, rid, priority, tokens))
        finished.append(rid)

    def hostile_running() -> int:
        return int((core._kv_stats()["tenants"].get("h") or {}).get("running", 0))

    async def scenario() -> None:
        await core.reconfigure(config)
        flood = [asyncio.create_task(one("h", f"h{i}", REALTIME, 200)) for i in range(16)]
        await _until(lambda: hostile_running() == 2)
        victims = [asyncio.create_task(one("v", "v-batch", BATCH, 4)),
                   asyncio.create_task(one("v", "v-realtime", REALTIME, 4))]  # fmt: skip
        while not all(v.done() for v in victims):
            most_hostile[0] = max(most_hostile[0], hostile_running())
            await asyncio.sleep(0.002)
        await asyncio.gather(*victims)
        # The victim's realtime request waited for at most a few of the flood. Its batch request
        # ranks behind every realtime one, the flood's included (priority is across tenants in
        # a pool): it only has to finish, within the aging bound (checked below).
        # As in tests/dataplane/test_pool_fairness.py: a few of the flood's answers end early
        # (greedy on random weights), and the flood's next ones with them.
        ahead = finished[: finished.index("v-realtime")]
        assert sum(1 for r in ahead if r.startswith("h")) <= 6, finished
        for task in flood:
            task.cancel()
        await asyncio.gather(*flood, return_exceptions=True)

    try:
        asyncio.run(scenario())
    finally:
        core.chaos.close()
        if core.engine is not None:
            core.engine.stop()
    assert most_hostile[0] <= 2
    assert {"v-batch", "v-realtime"} <= set(finished)


@pytest.mark.django_db
def test_the_class_is_two_words_set_by_the_portal_only(world_a: TenantWorld) -> None:
    deployment = Deployment.objects.get(tenant=world_a.tenant, name="assistant")
    url = f"/api/v1/deployments/{deployment.pk}/keys/"
    client = world_a.client()
    for bad in ["x" * 100_000, {"class": "realtime"}, ["realtime", "batch"], "realtime\x00",
                "-1", 0, True]:  # fmt: skip
        response = client.post(url, {"name": "sneaky", "priority": bad}, format="json")
        assert response.status_code == 400, (bad, response.content)
        assert "priority" in response.json()["error"]["fields"], bad
    assert not InferenceKey.objects.filter(name="sneaky").exists()
