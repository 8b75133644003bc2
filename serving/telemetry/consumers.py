"""The live GPU stream for the dashboard: `/ws/gpu/?tenant=<slug>[&since=<seq>]`, or
`/ws/gpu/?node=<name>` for platform operators (staff).

The session's user must be a member of the tenant (or staff, for a node); anyone else,
anonymous included, is accepted and closed at once with code 4403 (a browser sees the code and
stops reconnecting). A member joins only `tenant-<id>.gpu`, and `tenant-<id>.user-<uid>`
through which removing them from the tenant closes the socket (4403). Every message is one
sample as JSON text: {"seq": "<ms>-<n>", "at", "node", "simulated", "devices", "processes", "kv"}.

Backpressure: samples are not queued per client. The newest sample of each node waits in one
slot while the previous one is being written; a slow client skips to the newest, and its
queue never grows. Resume: `since=<seq>` (the last sample the browser got) replays what it
missed from the group's log (up to 5 minutes), then goes live without duplicates.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from serving.telemetry.agent import EVENT, node_group, sample_log, seq_key, tenant_group
from tenants.channels import FORBIDDEN, join_member_group, member_tenant_id

logger = logging.getLogger(__name__)
REPLAY_LIMIT = 1500  # 5 minutes at 5 Hz


def _is_staff(user: Any) -> bool:
    return bool(user is not None and user.is_authenticated and user.is_active and user.is_staff)


class GpuConsumer(AsyncWebsocketConsumer):  # type: ignore[misc]
    group: str | None = None
    member_group: str | None = None
    sender: asyncio.Future[None] | None = None

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
            # Before accept(): the tenant group is joined right after it, as the stream expects.
            self.member_group = await join_member_group(self, tenant_id)
            if self.member_group is None:
                group = None
        await self.accept()
        if group is None:
            await self.close(code=FORBIDDEN)
            return
        self.group = group
        # What the browser has: everything up to `since`, then per node the newest sample sent
        # (two nodes' samples can arrive in either order; one cursor would drop the older).
        resume = re.fullmatch(r"\d{1,15}-\d{1,10}", since) is not None  # anything else: no replay
        self.floor = seq_key(since) if resume else (0, 0)
        self.last: dict[str, tuple[int, int]] = {}
        self.pending: dict[str, tuple[str, str]] = {}  # node -> newest (seq, payload)
        self.wake = asyncio.Event()
        await self.channel_layer.group_add(group, self.channel_name)
        if resume:
            log = sample_log()
            try:
                missed = await log.since(group, since, REPLAY_LIMIT)
            finally:
                await log.aclose()
            for seq, payload in missed:
                await self._send(str(json.loads(payload).get("node", "")), seq, payload)
        self.sender = asyncio.ensure_future(self._drain())

    async def disconnect(self, code: int) -> None:
        # The writer goes first: a group_discard that fails (Redis away) must not leave it.
        if self.sender is not None:
            self.sender.cancel()
        for group in (self.group, self.member_group):
            if group is None:
                continue
            try:
                await self.channel_layer.group_discard(group, self.channel_name)
            except Exception:  # the layer expires the membership by itself  # noqa: BLE001
                logger.warning("GPU stream: leaving %s failed", group, exc_info=True)

    async def dispatch(self, message: dict[str, Any]) -> None:
        """Samples skip channels' per-message close_old_connections() (a thread round trip
        each: half the server's CPU at 500 browsers, bench/ws_fanout.py); they touch no ORM."""
        if message["type"] == EVENT:
            await self.gpu_sample(message)
            return
        await super().dispatch(message)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """The stream is one-way."""

    async def membership_removed(self, event: dict[str, Any]) -> None:
        """The member was removed from the tenant: the stream ends for them (4403). Rare, so
        it takes the ordinary dispatch path; samples keep their fast path above."""
        await self.close(code=FORBIDDEN)

    def _fresh(self, node: str, key: tuple[int, int]) -> bool:
        return key > self.floor and key > self.last.get(node, (0, 0))

    async def gpu_sample(self, event: dict[str, Any]) -> None:
        """A sample from the group: it replaces any of its node's not yet written."""
        seq, payload, node = str(event["seq"]), str(event["data"]), str(event.get("node", ""))
        if not self._fresh(node, seq_key(seq)):
            return  # replayed already
        self.pending[node] = (seq, payload)
        self.wake.set()

    async def _drain(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            batch, self.pending = self.pending, {}
            for node, (seq, payload) in sorted(batch.items(), key=lambda i: seq_key(i[1][0])):
                await self._send(node, seq, payload)

    async def _send(self, node: str, seq: str, payload: str) -> None:
        key = seq_key(seq)
        if not self._fresh(node, key):
            return
        self.last[node] = key
        await self.send(text_data=f'{{"seq":"{seq}",{payload[1:]}')
