"""Reads of the notification channels' page: the last test message of each channel, from the
tenant's audit log (where `notification_channel_test` records it)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from tenants.models import AuditEvent, Tenant

TESTED = "notification_channel.tested"


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
