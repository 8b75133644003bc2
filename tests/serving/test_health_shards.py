"""The sharded health tick: shard k of n ticks the deployments with `pk % n == k` under its
own lease; a live holder's shard is skipped, a dead one's (its lease no longer renewed) is
taken by the next tick of that shard; the beat's task fans out one task per shard."""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import pytest
import redis
from django.conf import settings

from serving.deployments.models import Deployment
from serving.ops import health, tasks
from serving.ops.health import lease
from serving.ops.health.lease import Lease, shard_lock_key
from serving.ops.health.series import series_key
from serving.ops.models import Resolution, SliSample
from tests.conftest import TenantWorld
from tests.serving.test_ops_loop import Replica, _ready

pytestmark = pytest.mark.django_db


def _client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL)


def _apart(a: Deployment, b: Deployment) -> int:
    """A shard count that puts the two deployments in different shards."""
    return 2 if a.pk % 2 != b.pk % 2 else max(a.pk, b.pk) + 1


def _fleet(world_a: TenantWorld, world_b: TenantWorld) -> tuple[Deployment, Deployment, int]:
    a, b = _ready(world_a), _ready(world_b)
    for deployment in (a, b):
        Replica(deployment, "stable", "r1").serve(ok=6, failed=1)
    return a, b, _apart(a, b)


def _measured(deployment: Deployment) -> list[int]:
    return list(
        SliSample.objects.filter(deployment=deployment, resolution=Resolution.RAW).values_list(
            "requests", flat=True
        )
    )


def test_each_shard_ticks_only_its_own_deployments(
    world_a: TenantWorld, world_b: TenantWorld
) -> None:
    a, b, n = _fleet(world_a, world_b)
    now = time.time()
    first = health.tick(now=now, act=False, shard=a.pk % n, shards=n)
    assert (first["deployments"], first["slots"], first["shard"]) == (1, 1, f"{a.pk % n}/{n}")
    assert _measured(a) == [7] and _measured(b) == []
    assert health.deployment_health(a.pk)["checked_at"] == now
    assert health.deployment_health(b.pk) == {}

    second = health.tick(now=now, act=False, shard=b.pk % n, shards=n)
    assert second["deployments"] == 1 and _measured(b) == [7]
    assert _measured(a) == [7]  # not ticked twice
    stats = health.tick_stats()
    assert stats["count"] == 2
    assert {label: s["deployments"] for label, s in stats["shards"].items()} == {
        f"{a.pk % n}/{n}": 1,
        f"{b.pk % n}/{n}": 1,
    }
    assert all(s["last"] is not None and s["skipped"] == 0 for s in stats["shards"].values())


def test_a_shards_pruning_leaves_the_other_shards_signals(
    world_a: TenantWorld, world_b: TenantWorld
) -> None:
    a, b, n = _fleet(world_a, world_b)
    keys, r = health.health_keys(), _client()
    now = time.time()
    health.tick(now=now, act=False, shard=b.pk % n, shards=n)
    health.tick(now=now, act=False, shard=a.pk % n, shards=n)
    assert r.hexists(keys["signals"], f"{b.pk}:stable")
    # A slot of a's shard that is no longer a target, and the minute's claim given back.
    r.hset(keys["signals"], f"{a.pk}:canary", "0:0 {}")
    r.lpush(series_key(keys["signals"], f"{a.pk}:canary"), "{}")
    r.delete(f"{shard_lock_key(keys['lock'], a.pk % n, n)}:signals-pruned")

    health.tick(now=now + 2, act=False, shard=a.pk % n, shards=n)
    assert not r.hexists(keys["signals"], f"{a.pk}:canary")  # a's shard pruned its own
    assert not r.exists(series_key(keys["signals"], f"{a.pk}:canary"))
    assert r.hexists(keys["signals"], f"{b.pk}:stable")  # ...and only its own
    assert r.hexists(keys["signals"], f"{a.pk}:stable")


def test_a_shard_held_by_a_live_tick_is_skipped_and_the_others_run(
    world_a: TenantWorld, world_b: TenantWorld
) -> None:
    a, b, n = _fleet(world_a, world_b)
    keys, r = health.health_keys(), _client()
    held = Lease.acquire(r, shard_lock_key(keys["lock"], a.pk % n, n), "another-worker")
    assert held is not None
    try:
        assert health.tick(act=False, shard=a.pk % n, shards=n)["skipped"]
        assert health.tick(act=False, shard=b.pk % n, shards=n)["deployments"] == 1
    finally:
        r.delete(held.key)
    assert _measured(a) == [] and _measured(b) == [7]
    shards = health.tick_stats()["shards"]
    assert shards[f"{a.pk % n}/{n}"]["skipped"] == 1 and shards[f"{b.pk % n}/{n}"]["count"] == 1
    # The unsharded tick keeps its one lock: the same key as a single shard's.
    assert shard_lock_key(keys["lock"], 0, 1) == keys["lock"]
    with pytest.raises(ValueError, match="not one of"):
        shard_lock_key(keys["lock"], n, n)


def test_a_tick_that_lost_its_lease_leaves_the_new_holders_lock(world_a: TenantWorld) -> None:
    keys, r = health.health_keys(), _client()
    key = shard_lock_key(keys["lock"], 0, 2)
    mine = Lease.acquire(r, key, "stalled")
    assert mine is not None and Lease.acquire(r, key, "someone") is None
    r.set(key, "took-over", px=10_000)  # the lease ran out while this tick stalled; re-taken
    assert mine.renew() is False and mine.lost
    released = health.state.tick_finish(
        r, keys, "stalled", seconds=0.1, at=time.time(), lock_key=key, shard="0/2"
    )
    assert released is False
    assert r.get(key) == b"took-over"
    r.delete(key)


def test_a_tick_that_stalled_past_its_lease_writes_nothing(
    world_a: TenantWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another worker took the shard over while this tick stalled (its keeper thread could
    not renew in time): the stalled tick's rows, state and actions would race the new
    holder's, so it drops them."""
    from serving.ops.health import slots

    deployment = _ready(world_a)
    Replica(deployment, "stable", "r1").serve(ok=6, failed=1)
    keys, r = health.health_keys(), _client()
    key = shard_lock_key(keys["lock"], 0, 1)
    evaluate = slots.evaluate_slots

    def stall_then_evaluate(*args: Any, **kwargs: Any) -> Any:
        r.set(key, "took-over", px=10_000)  # the lease ran out meanwhile and was re-taken
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(slots, "evaluate_slots", stall_then_evaluate)
    report = health.tick(now=time.time(), act=True)
    assert report["lost"] is True and report["rows"] == 0
    assert _measured(deployment) == []
    assert not r.hexists(keys["state"], f"{deployment.pk}:stable")
    assert r.get(key) == b"took-over"  # and the new holder's lock stays
    r.delete(key)
    monkeypatch.setattr(slots, "evaluate_slots", evaluate)
    assert health.tick(now=time.time() + 2, act=False)["rows"] == 1
    assert _measured(deployment) == [7]


def test_a_dead_workers_shard_is_taken_by_the_next_tick(
    world_a: TenantWorld, world_b: TenantWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that holds a shard and dies (SIGKILL: no clean-up runs) keeps it only until its
    lease runs out; while it lived, its renewals kept the shard well past one lease."""
    a, b, n = _fleet(world_a, world_b)
    shard = a.pk % n
    # A 2 s lease (renewed every third of it): a loaded CI machine's scheduling pauses stay
    # well inside it; the test still spans three leases.
    monkeypatch.setattr(lease, "LEASE_S", 2.0)
    ready_r, ready_w = os.pipe()

    def hang(*args: Any, **kwargs: Any) -> dict[str, Any]:
        os.write(ready_w, b"x")  # holding the lease, mid-tick
        while True:
            time.sleep(60)

    real = health.tick_slots
    monkeypatch.setattr(health, "tick_slots", hang)
    pid = os.fork()
    if pid == 0:  # the worker: ticks the shard and hangs in it (no database use)
        try:
            health.tick(act=False, shard=shard, shards=n)
        finally:
            os._exit(1)
    monkeypatch.setattr(health, "tick_slots", real)
    os.close(ready_w)  # a child that ends early: the read below sees the end of the pipe
    try:
        assert os.read(ready_r, 1) == b"x"
        time.sleep(3 * 2.0)  # three leases: only renewals keep it
        assert health.tick(act=False, shard=shard, shards=n)["skipped"]
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(ready_r)

    # The replica keeps publishing meanwhile (its value above is older than STALE_S by now).
    Replica(a, "stable", "r1").serve(ok=6, failed=1)
    deadline = time.monotonic() + 30  # a bound on the wait, not a timing under test
    while (report := health.tick(act=False, shard=shard, shards=n)).get("skipped"):
        assert time.monotonic() < deadline, "the dead worker's shard was never handed over"
        time.sleep(0.1)
    assert report["deployments"] == 1 and _measured(a) == [7]
    assert health.tick_stats()["shards"][f"{shard}/{n}"]["skipped"] >= 1


def test_the_beat_task_fans_out_one_tick_per_shard(
    world_a: TenantWorld, world_b: TenantWorld, settings: Any
) -> None:
    a, b, n = _fleet(world_a, world_b)
    settings.HEALTH_PROBES = False
    settings.HEALTH_SHARDS = n
    fanned = tasks.health_tick()  # eager in the tests: the shard tasks run here, in turn
    assert fanned["shards"] == n
    assert _measured(a) == [7] and _measured(b) == [7]
    assert set(health.tick_stats()["shards"]) == {f"{k}/{n}" for k in range(n)}
    assert health.deployment_health(a.pk)["checked_at"] == fanned["at"]

    settings.HEALTH_SHARDS = 1  # one shard: the beat's task ticks it itself
    for deployment in (a, b):
        Replica(deployment, "stable", "r1").serve(ok=3)
    time.sleep(max(0.0, fanned["at"] + 2 - time.time()))  # both due again
    report = tasks.health_tick()
    assert report["deployments"] == 2 and report["shard"] == "0/1"
    assert sorted(_measured(a)) == [3, 7]


def test_a_shard_message_that_waited_over_a_tick_ticks_at_its_own_time(
    world_a: TenantWorld, settings: Any
) -> None:
    """A backlog (workers busy) leaves shard messages queued for up to five ticks: one run
    late stamps its rows and its visit with the latest beat time, not the one it carries."""
    a = _ready(world_a)
    settings.HEALTH_PROBES = False
    Replica(a, "stable", "r1").serve(ok=4)
    interval = float(settings.CELERY_BEAT_SCHEDULE["health-tick"]["schedule"])
    sent = time.time() - 3.5 * interval  # the beat sent it three and a half ticks ago
    tasks.health_tick_shard(0, 1, sent)
    # It ticks at the latest beat time since (on the beat's grid, not seconds late).
    assert health.deployment_health(a.pk)["checked_at"] == pytest.approx(sent + 3 * interval)
    row = SliSample.objects.get(deployment=a, resolution=Resolution.RAW)
    assert row.end.timestamp() == pytest.approx(sent + 3 * interval, abs=0.01)
    # On time, the shards share the beat's time.
    Replica(a, "stable", "r1").serve(ok=2)
    on_time = time.time() + 2.5
    tasks.health_tick_shard(0, 1, on_time)
    assert health.deployment_health(a.pk)["checked_at"] == on_time


def test_the_tick_reads_its_last_visit_from_the_small_hash_or_the_findings(
    world_a: TenantWorld,
) -> None:
    """Whether a deployment is due comes from `<prefix>:health:checked` (a few bytes each),
    not from the pages' findings; a deployment missing there falls back to its findings."""
    a = _ready(world_a)
    keys, r = health.health_keys(), _client()
    Replica(a, "stable", "r1").serve(ok=4)
    now = time.time()
    assert health.tick(now=now, act=False)["due"] == 1
    assert r.hget(keys["checked"], str(a.pk)) == f"{now!r} 0".encode()

    r.hdel(keys["deployments"], str(a.pk))  # the findings gone: the small hash decides
    assert health.tick(now=now + 1, act=False)["due"] == 0
    r.hdel(keys["checked"], str(a.pk))
    r.hset(keys["deployments"], str(a.pk), json.dumps({"checked_at": now, "probe_failures": 2}))
    assert health.tick(now=now + 1, act=False)["due"] == 0  # ...or, missing, the findings
    assert health.tick(now=now + 2, act=False)["due"] == 1
    # No probe this tick: the streak read from the findings carries on.
    assert r.hget(keys["checked"], str(a.pk)) == f"{now + 2!r} 2".encode()
