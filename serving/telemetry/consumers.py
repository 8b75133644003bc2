"""The live GPU stream for the dashboard: `/ws/gpu/?tenant=<slug>[&since=<seq>]`, or
`/ws/gpu/?node=<name>` for platform operators (staff).

The session's user must be a member of the tenant (or staff, for a node); anyone else,
anonymous included, is accepted and closed at once with code 4403 (a browser sees the code and
stops reconnecting). A member's socket follows `tenant-<id>.gpu`, and joins
`tenant-<id>.user-<uid>` through which removing them from the tenant closes the socket (4403).
Every message is one sample as JSON text: {"seq": "<ms>-<n>", "at", "node", "simulated",
"devices", "processes", "kv"}.

Fan-out: a server process subscribes to a GPU group once (`GroupFeed`), however many sockets
follow it; each sample arrives once per process, its message text is built once and handed to
every socket of the group there (bench/ws_fanout.py: the per-socket channel receive, dispatch
and session wrapper were half the server's time at 500 browsers).

Backpressure: samples are not queued per client. The newest sample of each node waits in one
slot while the previous one is being written; a slow client skips to the newest, and its
queue never grows. Resume: `since=<seq>` (the last sample the browser got) replays what it
missed from the group's log (up to 5 minutes), then goes live without duplicates.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import weakref
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from portal.wsframes import RAW_SEND, RAW_SEND_NOW
from serving.telemetry.agent import EVENT, node_group, sample_log, seq_key, tenant_group
from tenants.channels import FORBIDDEN, join_member_group, member_tenant_id

logger = logging.getLogger(__name__)
REPLAY_LIMIT = 1500  # 5 minutes at 5 Hz
RETRY_S = 1.0


def _is_staff(user: Any) -> bool:
    return bool(user is not None and user.is_authenticated and user.is_active and user.is_staff)


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample as every browser gets it: the message text is built once per process."""

    seq: str
    key: tuple[int, int]
    node: str
    text: str

    @classmethod
    def of(cls, seq: str, node: str, payload: str) -> Sample:
        # The agent serialized the view once per group; the seq goes in front of its fields.
        return cls(seq, seq_key(seq), node, f'{{"seq":"{seq}",{payload[1:]}')

    @classmethod
    def from_event(cls, event: dict[str, Any]) -> Sample:
        return cls.of(str(event["seq"]), str(event.get("node", "")), str(event["data"]))


class GroupFeed:
    """This process's one subscription to a GPU group (a channel of its own in the group),
    shared by every socket here that follows the group; it ends with the last of them."""

    def __init__(self, layer: Any, group: str) -> None:
        self.layer, self.group = layer, group
        self.members: set[GpuConsumer] = set()
        self.channel: str | None = None
        self.started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.reader: asyncio.Future[None] | None = None

    async def start(self) -> None:
        """Run by the first follower, in its own task: the group is subscribed by the time its
        connect() goes on (as with a group_add of its own); the others wait for `started`."""
        try:
            self.channel = await self.layer.new_channel()
            await self.layer.group_add(self.group, self.channel)
        except BaseException as exc:
            self.started.set_exception(exc)
            self.started.exception()  # retrieved: the followers that wait re-raise it
            raise
        self.reader = asyncio.ensure_future(self._read(self.channel))
        self.started.set_result(None)

    async def _read(self, channel: str) -> None:
        while True:
            try:
                message = await self.layer.receive(channel)
            except asyncio.CancelledError:
                raise
            except Exception:  # Redis away (the list layer): join again, once it is back
                logger.warning("GPU stream: reading %s failed", self.group, exc_info=True)
                await asyncio.sleep(RETRY_S)
                with contextlib.suppress(Exception):
                    await self.layer.group_add(self.group, channel)
                continue
            if message.get("type") != EVENT:
                continue
            sample = Sample.from_event(message)
            for member in tuple(self.members):
                member.offer(sample)
            # The writers go before the next sample: a burst reaches every socket that keeps
            # up; only a socket still writing skips to the newest.
            await asyncio.sleep(0)

    async def close(self) -> None:
        if self.channel is not None:
            try:
                await self.layer.group_discard(self.group, self.channel)
            except Exception:  # the layer expires the membership by itself  # noqa: BLE001
                logger.warning("GPU stream: leaving %s failed", self.group, exc_info=True)
        if self.reader is not None:
            self.reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.reader


# Per event loop (a server process has one; tests run several): group -> its feed.
_FEEDS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, GroupFeed]] = (
    weakref.WeakKeyDictionary()
)


async def follow(consumer: GpuConsumer, group: str) -> GroupFeed:
    """`consumer` gets the group's samples (through offer()) from now on."""
    feeds = _FEEDS.setdefault(asyncio.get_running_loop(), {})
    feed = feeds.get(group)
    first = feed is None
    if feed is None:
        feed = feeds[group] = GroupFeed(consumer.channel_layer, group)
    feed.members.add(consumer)
    try:
        await (feed.start() if first else asyncio.shield(feed.started))
    except BaseException:
        await unfollow(consumer, feed)
        raise
    return feed


async def unfollow(consumer: GpuConsumer, feed: GroupFeed) -> None:
    feed.members.discard(consumer)
    feeds = _FEEDS.get(asyncio.get_running_loop(), {})
    if feed.members or feeds.get(feed.group) is not feed:
        return
    del feeds[feed.group]  # a socket that follows the group from now on starts a new feed
    if feed.started.done() and not feed.started.cancelled() and not feed.started.exception():
        await feed.close()


class GpuConsumer(AsyncWebsocketConsumer):  # type: ignore[misc]
    feed: GroupFeed | None = None
    member_group: str | None = None
    sender: asyncio.Future[None] | None = None
    writing = False  # the writer task is sending a batch (it may be waiting on backpressure)

    async def connect(self) -> None:
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        slug = (query.get("tenant") or [""])[0]
        node = (query.get("node") or [""])[0]
        since = (query.get("since") or [""])[0]
        user = self.scope.get("user")
        group = None
        tenant_id = None
        if slug and not node:
            tenant_id = await database_sync_to_async(member_tenant_id)(user, slug)
            group = tenant_group(tenant_id) if tenant_id is not None else None
        elif node and not slug and _is_staff(user):
            group = node_group(node)
        if group is not None and tenant_id is not None:
            self.member_group = await join_member_group(self, tenant_id)
            if self.member_group is None:
                group = None
        if group is None:
            await self.accept()
            await self.close(code=FORBIDDEN)
            return
        # What the browser has: everything up to `since`, then per node the newest sample sent
        # (two nodes' samples can arrive in either order; one cursor would drop the older).
        resume = re.fullmatch(r"\d{1,15}-\d{1,10}", since) is not None  # anything else: no replay
        self.floor = seq_key(since) if resume else (0, 0)
        self.last: dict[str, tuple[int, int]] = {}
        self.pending: dict[str, Sample] = {}  # node -> its newest sample not yet written
        self.wake = asyncio.Event()
        # Before accept(): an open socket gets every sample published from then on.
        self.feed = await follow(self, group)
        try:
            await self.accept()
            if resume:
                await self._replay(group, since)
        except BaseException:  # no disconnect() follows a failed connect(): leave here
            feed, self.feed = self.feed, None
            await unfollow(self, feed)
            raise
        self.sender = asyncio.ensure_future(self._drain())

    async def _replay(self, group: str, since: str) -> None:
        log = sample_log()
        try:
            missed = await log.since(group, since, REPLAY_LIMIT)
        finally:
            await log.aclose()
        for seq, payload in missed:
            await self._send(Sample.of(seq, str(json.loads(payload).get("node", "")), payload))

    async def disconnect(self, code: int) -> None:
        # The writer goes first: leaving a group may fail (Redis away) and must not leave it.
        if self.sender is not None:
            self.sender.cancel()
        if self.feed is not None:
            feed, self.feed = self.feed, None
            await unfollow(self, feed)
        if self.member_group is not None:
            try:
                await self.channel_layer.group_discard(self.member_group, self.channel_name)
            except Exception:  # the layer expires the membership by itself  # noqa: BLE001
                logger.warning("GPU stream: leaving %s failed", self.member_group, exc_info=True)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """The stream is one-way."""

    async def membership_removed(self, event: dict[str, Any]) -> None:
        """The member was removed from the tenant: the stream ends for them (4403)."""
        await self.close(code=FORBIDDEN)

    async def gpu_sample(self, event: dict[str, Any]) -> None:
        """A sample sent to this socket's own channel (the group's come through its feed)."""
        self.offer(Sample.from_event(event))

    def _fresh(self, node: str, key: tuple[int, int]) -> bool:
        return key > self.floor and key > self.last.get(node, (0, 0))

    def offer(self, sample: Sample) -> None:
        """A sample of the group: written at once when the socket's writer is idle and the
        server can (RAW_SEND_NOW: open, not paused by backpressure), else it replaces any of
        its node's not yet written and wakes the writer."""
        if not self._fresh(sample.node, sample.key):
            return  # replayed already
        if self.sender is not None and not self.writing and not self.pending:
            send_now = self.scope.get(RAW_SEND_NOW)
            try:
                if send_now is not None and send_now(sample.text):
                    self.last[sample.node] = sample.key
                    return
            except OSError:  # the client is gone: disconnect() follows
                return
        self.pending[sample.node] = sample
        self.wake.set()

    async def _drain(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            batch, self.pending = self.pending, {}
            self.writing = True  # offer() leaves the order to this task meanwhile
            try:
                for sample in sorted(batch.values(), key=lambda s: s.key):
                    await self._send(sample)
            except OSError:  # the client is gone: disconnect() follows
                return
            finally:
                self.writing = False

    async def _send(self, sample: Sample) -> None:
        if not self._fresh(sample.node, sample.key):
            return
        self.last[sample.node] = sample.key
        await self.write(sample.text)

    async def write(self, text: str) -> None:
        """One message to the browser, straight to the server (RAW_SEND): the same `text` object
        goes to every socket of the group, which lets the server frame it once."""
        await self.scope.get(RAW_SEND, self.base_send)({"type": "websocket.send", "text": text})
