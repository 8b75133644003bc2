"""Reads of the notification channels' page: the last test message of each channel, from the
tenant's audit log (where the worker's `channel_test_send` records it), and which channels have
a test queued and not sent yet (a short-lived cache mark set by `notification_channel_test`)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.core.cache import cache

from tenants.models import AuditEvent, Tenant

logger = logging.getLogger(__name__)

TESTED = "notification_channel.tested"
# How long a queued test shows as "sending" at most (a lost task stops showing by itself).
SENDING_S = 300


def sending_key(tenant_id: int, channel_id: int) -> str:
    return f"channel-test-sending:{tenant_id}:{channel_id}"


def channel_tests_sending(*, tenant: Tenant, channel_ids: Iterable[int]) -> set[int]:
    """The channels (of `channel_ids`) whose queued test the worker has not sent yet."""
    keys = {sending_key(tenant.pk, pk): pk for pk in channel_ids}
    if not keys:
        return set()
    try:
        found = cache.get_many(list(keys))
    except Exception as exc:  # a cache that is down hides the mark, not the page
        logger.warning("channel test marks unavailable: %s", exc)
        return set()
    return {keys[key] for key in found}


@dataclass(frozen=True)
class LastTest:
    at: datetime
    ok: bool
    code: int | None
    error: str


def channel_last_tests(*, tenant: Tenant) -> dict[int, LastTest]:
    """{channel id: its newest test}, one query (PostgreSQL's DISTINCT ON)."""
    rows = (
        AuditEvent.objects.filter(
            tenant=tenant, action=TESTED, object_type="incidents.notificationchannel"
        )
        .order_by("object_id", "-id")
        .distinct("object_id")
        .only("object_id", "after", "created_at")
    )
    tests = {}
    for row in rows:
        after = row.after if isinstance(row.after, dict) else {}
        code = after.get("response_code")
        tests[int(row.object_id)] = LastTest(
            at=row.created_at,
            ok=after.get("result") == "sent",
            code=code if isinstance(code, int) else None,
            error=str(after.get("error") or ""),
        )
    return tests
