"""The live GPU stream (`/ws/gpu/`) through the real ASGI app (origin check, session auth) and
the real Redis channel layer, fed by the real agent (simulated provider): members get their
tenant's samples only; every other group the code builds is refused with 4403; a slow client
gets the newest sample; a reconnect resumes from its last sample without gaps or duplicates."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.contrib.auth.models import User

from portal.asgi import application
from portal.wsframes import RAW_SEND_NOW
from serving.telemetry.agent import AgentConfig, GpuAgent, seq_key
from serving.telemetry.consumers import GpuConsumer, Sample
from serving.telemetry.providers.simulated import SimulatedProvider
from tests.conftest import TenantWorld
from tests.incidents.test_consumers import ORIGIN, WebsocketCommunicator, close_code, session_cookie
from tests.serving.test_ops_loop import _ready

pytestmark = pytest.mark.django_db(transaction=True)


def gpu_socket(query: str, user: User | None = None) -> WebsocketCommunicator:
    headers = [ORIGIN]
    if user is not None:
        headers.append((b"cookie", session_cookie(user)))
    return WebsocketCommunicator(application, f"/ws/gpu/?{query}", headers=headers)


def _agent() -> GpuAgent:
    """The node's agent on the simulated provider; no replica published a pid here, so it
    hosts one stand-in process per serving deployment (its demo mode)."""
    agent = GpuAgent(
        AgentConfig(node="node-a", persist=False),
        provider=SimulatedProvider(devices=2, seed=3),
        layer=get_channel_layer(),
    )
    assert agent.open()
    return agent


async def _samples(comm: WebsocketCommunicator, n: int, timeout: float = 3) -> list[Any]:
    return [await comm.receive_json_from(timeout=timeout) for _ in range(n)]


def test_a_member_gets_its_tenants_samples_and_nothing_else(
    world_a: TenantWorld, world_b: TenantWorld
) -> None:
    _ready(world_a)
    _ready(world_b)
    mine = gpu_socket(f"tenant={world_a.tenant.slug}", world_a.viewer)  # viewers watch too
    theirs = gpu_socket(f"tenant={world_b.tenant.slug}", world_b.owner)

    async def scenario() -> tuple[list[Any], list[Any]]:
        assert (await mine.connect(timeout=5))[0] and (await theirs.connect(timeout=5))[0]
        agent = _agent()
        try:
            for _ in range(3):
                await agent.step()
            got_a, got_b = await _samples(mine, 3), await _samples(theirs, 3)
        finally:
            await agent.log.aclose()
        await mine.disconnect()
        await theirs.disconnect()
        return got_a, got_b

    got_a, got_b = async_to_sync(scenario)()
    assert [s["simulated"] for s in got_a] == [True] * 3
    assert {p["deployment"] for s in got_a for p in s["processes"]} == {"assistant"}
    assert len({s["seq"] for s in got_a}) == 3
    # B's stream carries B's stand-in process only: never A's replica or device choice.
    assert all(world_a.tenant.slug not in json.dumps(s) for s in got_b)


def test_every_group_the_code_builds_is_refused_to_strangers(
    world_a: TenantWorld, world_b: TenantWorld
) -> None:
    a, b = world_a.tenant, world_b.tenant
    refused: list[tuple[str, User | None]] = [
        (f"tenant={a.slug}", None),  # anonymous
        (f"tenant={a.slug}", world_b.owner),  # another tenant's owner
        (f"tenant={a.pk}", world_a.owner),  # ids are not slugs
        ("node=node-a", world_a.owner),  # node streams are for platform operators
        ("node=node-a", None),
        (f"tenant={b.slug}&node=node-a", world_b.owner),  # one stream a socket
        (f"group=tenant-{a.pk}.gpu", world_b.owner),  # group names are never taken from users
        (f"tenant=tenant-{a.pk}.gpu", world_b.owner),
        ("", world_a.owner),
    ]
    for query, user in refused:
        code = async_to_sync(close_code)(gpu_socket(query, user))
        assert code == 4403, (query, user)
    # A malformed resume point is ignored, not an error.
    odd = gpu_socket(f"tenant={a.slug}&since=(0-0%20OR%201", world_a.owner)
    assert async_to_sync(close_code)(odd) is None
    staff = User.objects.create_user("ops", password="x" * 12, is_staff=True)
    assert async_to_sync(close_code)(gpu_socket("node=node-a", staff)) is None  # stays open
    assert async_to_sync(close_code)(gpu_socket(f"tenant={a.slug}", world_a.owner)) is None


def test_a_slow_client_gets_the_newest_sample_not_a_queue(
    world_a: TenantWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    _ready(world_a)
    original = GpuConsumer.write

    async def slow_send(self: GpuConsumer, *args: Any, **kwargs: Any) -> None:
        await asyncio.sleep(0.4)  # a client on a bad link: each frame takes 0.4 s to go out
        await original(self, *args, **kwargs)

    monkeypatch.setattr(GpuConsumer, "write", slow_send)
    comm = gpu_socket(f"tenant={world_a.tenant.slug}", world_a.owner)

    async def scenario() -> tuple[list[str], list[str]]:
        assert (await comm.connect(timeout=5))[0]
        agent = _agent()
        sent: list[str] = []
        try:
            for _ in range(20):  # 20 samples in about a second
                snapshot = await agent.step()
                sent.append(str(snapshot["at"]))
                await asyncio.sleep(0.05)
            got = []
            while not await comm.receive_nothing(timeout=1.0):
                got.append(await comm.receive_json_from())
        finally:
            await agent.log.aclose()
        await comm.disconnect()
        return sent, [str(s["at"]) for s in got]

    sent, got = async_to_sync(scenario)()
    assert 2 <= len(got) <= 6  # not 20: skipped to the newest each time
    assert got[-1] == sent[-1]  # the newest one always arrives
    assert got == sorted(got, key=float)


def test_a_reconnect_resumes_from_the_last_sample(world_a: TenantWorld) -> None:
    _ready(world_a)
    first = gpu_socket(f"tenant={world_a.tenant.slug}", world_a.owner)
    cookie = (b"cookie", session_cookie(world_a.owner))  # the session is written here, in sync

    async def scenario() -> tuple[list[Any], list[Any], list[Any]]:
        agent = _agent()
        try:
            assert (await first.connect(timeout=5))[0]
            for _ in range(3):
                await agent.step()
            before = await _samples(first, 3)
            await first.disconnect()
            missed = [await agent.step() for _ in range(4)]  # while the socket was down
            again = WebsocketCommunicator(
                application,
                f"/ws/gpu/?tenant={world_a.tenant.slug}&since={before[-1]['seq']}",
                headers=[ORIGIN, cookie],
            )
            assert (await again.connect(timeout=5))[0]
            replayed = await _samples(again, 4)
            await agent.step()
            live = await _samples(again, 1)
            assert await again.receive_nothing(timeout=0.5)
            await again.disconnect()
        finally:
            await agent.log.aclose()
        return before, [m["at"] for m in missed], replayed + live

    before, missed_at, after = async_to_sync(scenario)()
    assert [s["at"] for s in after[:4]] == missed_at  # the gap, in order
    seqs = [seq_key(s["seq"]) for s in before + after]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)  # no duplicates


def test_two_nodes_samples_arriving_out_of_order_both_reach_the_browser(
    world_a: TenantWorld,
) -> None:
    """Two nodes' agents append to one tenant log, then group_send: their deliveries can swap.
    The older seq of the other node still goes out; a repeat of a node's own seq does not."""
    comm = gpu_socket(f"tenant={world_a.tenant.slug}", world_a.owner)
    group = f"tenant-{world_a.tenant.pk}.gpu"

    def event(node: str, seq: str) -> dict[str, Any]:
        data = json.dumps({"at": 1.0, "node": node, "devices": [], "processes": []})
        return {"type": "gpu.sample", "seq": seq, "node": node, "data": data}

    async def scenario() -> list[tuple[str, str]]:
        assert (await comm.connect(timeout=5))[0]
        layer = get_channel_layer()
        got = []
        for node, seq in [("node-b", "1000-1"), ("node-a", "1000-0"), ("node-a", "1000-0"),
                          ("node-b", "999-0"), ("node-a", "1001-0")]:  # fmt: skip
            await layer.group_send(group, event(node, seq))
            if not await comm.receive_nothing(timeout=0.3):
                message = await comm.receive_json_from()
                got.append((message["node"], message["seq"]))
        await comm.disconnect()
        return got

    assert async_to_sync(scenario)() == [
        ("node-b", "1000-1"), ("node-a", "1000-0"), ("node-a", "1001-0"),
    ]  # fmt: skip


def test_a_failed_group_discard_still_stops_the_writer(
    world_a: TenantWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis away while sockets close (or too many connections): leaving the group fails, and
    the writer task must not be left behind."""
    layer = get_channel_layer()
    seen: list[GpuConsumer] = []
    original_connect = GpuConsumer.connect

    async def connect(self: GpuConsumer) -> None:
        seen.append(self)
        await original_connect(self)

    async def refuse(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("Redis is away")

    monkeypatch.setattr(GpuConsumer, "connect", connect)
    comm = gpu_socket(f"tenant={world_a.tenant.slug}", world_a.owner)

    async def scenario() -> bool:
        assert (await comm.connect(timeout=5))[0]
        monkeypatch.setattr(layer, "group_discard", refuse)
        await comm.disconnect()
        await asyncio.sleep(0.1)
        sender = seen[0].sender
        assert sender is not None
        return sender.cancelled() or sender.done()

    assert async_to_sync(scenario)()


def test_a_sample_goes_out_at_once_only_when_nothing_is_ahead_of_it() -> None:
    """offer() writes through the server's send_now when the socket's writer is idle; while it
    writes a batch, holds one back, or the server says no (backpressure), the sample waits in
    the socket's slot, so the order and the newest-wins slot stay the writer's."""
    written: list[str] = []
    answer = [True]

    def send_now(text: str) -> bool:
        if answer[0]:
            written.append(text)
        return answer[0]

    consumer = GpuConsumer()
    consumer.scope = {RAW_SEND_NOW: send_now}
    consumer.floor, consumer.last, consumer.pending = (0, 0), {}, {}

    def sample(seq: str, node: str = "node-a") -> Sample:
        return Sample.of(seq, node, json.dumps({"at": 1.0, "node": node}))

    async def scenario() -> None:
        consumer.wake = asyncio.Event()
        consumer.offer(sample("1-0"))  # no writer yet (connect still replaying): the slot
        assert written == [] and list(consumer.pending) == ["node-a"]
        consumer.pending.clear()
        consumer.sender = asyncio.get_running_loop().create_future()
        consumer.offer(sample("2-0"))
        assert written == [sample("2-0").text] and consumer.last == {"node-a": (2, 0)}
        consumer.offer(sample("2-0"))  # a repeat: dropped
        consumer.offer(sample("1-5", "node-b"))  # another node's older seq still goes
        assert len(written) == 2 and consumer.last["node-b"] == (1, 5)
        consumer.writing = True
        consumer.offer(sample("3-0"))  # behind the writer's batch
        assert len(written) == 2 and consumer.pending["node-a"].seq == "3-0"
        consumer.writing = False
        consumer.offer(sample("4-0", "node-b"))  # behind the sample still in a slot
        assert len(written) == 2 and set(consumer.pending) == {"node-a", "node-b"}
        consumer.pending.clear()
        answer[0] = False
        consumer.offer(sample("5-0"))  # backpressure: the server wrote nothing
        assert consumer.pending["node-a"].seq == "5-0" and consumer.last["node-a"] == (2, 0)
        assert consumer.wake.is_set()
        consumer.sender.cancel()

    asyncio.run(scenario())
