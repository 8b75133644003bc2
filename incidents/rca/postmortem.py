"""The postmortem of an incident as Markdown: summary, timeline, breaches, rollbacks, the SLIs
around it minute by minute, ranked root-cause hints, and follow-ups left for humans."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from incidents import selectors
from incidents.models import Incident
from incidents.rca.evidence import GROUPS, incident_window, p95_ms
from serving.ops.models import Rollback
from serving.ops.selectors import sli_samples_between
from tenants.models import Tenant

MAX_MINUTES = 240  # a longer incident shows its first four hours of SLIs
BREACH_COLUMNS = [
    "Objective",
    "Group",
    "Kind",
    "Severity",
    "Action",
    "First",
    "Last",
    "Times",
    "Detail",
]


def _cell(value: Any) -> str:
    if value is None or value == "":
        return "–"
    if isinstance(value, datetime):
        return timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S %Z")
    if isinstance(value, timedelta):
        return _duration(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def _duration(delta: timedelta | None) -> str:
    if delta is None:
        return "–"
    seconds = delta.total_seconds()
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _between(a: datetime | None, b: datetime | None) -> timedelta | None:
    return None if a is None or b is None else b - a


def _table(header: list[str], rows: Iterable[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines.extend("| " + " | ".join(_cell(v) for v in row) + " |" for row in rows)
    return lines


def _summary(incident: Incident) -> list[str]:
    deployment = incident.deployment.name if incident.deployment else None
    rows: list[list[Any]] = [
        ["Severity", incident.severity],
        ["Deployment", deployment],
        ["Status", incident.status],
        ["Drill", "yes" if incident.is_drill else "no"],
        ["Triggered", incident.triggered_at],
        ["Acknowledged", incident.acknowledged_at],
        ["Mitigated", incident.mitigated_at],
        ["Resolved", incident.resolved_at],
        ["Time to acknowledge", _between(incident.triggered_at, incident.acknowledged_at)],
        ["Time to mitigate", incident.time_to_mitigate],
        ["Time to resolve", _between(incident.triggered_at, incident.resolved_at)],
    ]
    return _table(["", ""], rows)


def _rollbacks(tenant: Tenant, incident: Incident, events: list[Any]) -> list[Rollback]:
    """The incident's rollback and any other the timeline names."""
    named = {incident.rollback_id} | {e.data.get("rollback") for e in events if e.data}
    ids = {i for i in named if isinstance(i, int)}
    if not ids:
        return []
    return list(
        Rollback.objects.filter(tenant=tenant, pk__in=ids)
        .select_related("from_revision", "to_revision", "new_revision")
        .order_by("detected_at", "id")
    )


def _rollback_rows(rollbacks: list[Rollback]) -> list[list[Any]]:
    def revisions(rb: Rollback) -> str:
        moved = f"r{rb.from_revision.number} -> r{rb.to_revision.number}"
        return moved + (f" (as r{rb.new_revision.number})" if rb.new_revision else "")

    return [
        [
            rb.key,
            rb.trigger,
            rb.status,
            revisions(rb),
            _between(rb.detected_at, rb.started_at),
            _between(rb.started_at, rb.traffic_switched_at),
            _between(rb.traffic_switched_at, rb.finished_at),
            _between(rb.detected_at, rb.finished_at),
        ]
        for rb in rollbacks
    ]


def sli_minutes(*, tenant: Tenant, incident: Incident) -> list[list[Any]]:
    """Per minute and group: requests, error ratio, p95 latency (ms), from 15 min before."""
    if incident.deployment_id is None:
        return []
    start, end = incident_window(incident)
    end = min(end, start + timedelta(minutes=MAX_MINUTES))
    samples = sli_samples_between(
        tenant=tenant, deployment_id=incident.deployment_id, start=start, end=end
    )
    buckets: dict[tuple[datetime, str], list[Any]] = defaultdict(list)
    for sample in samples:
        minute = sample.start.replace(second=0, microsecond=0)
        buckets[(minute, sample.group)].append(sample)
    rows = []
    for (minute, group), rows_of in sorted(buckets.items()):
        if group not in GROUPS:
            continue
        requests = sum(s.requests for s in rows_of)
        errors = sum(s.errors for s in rows_of)
        rows.append(
            [
                timezone.localtime(minute).strftime("%H:%M"),
                group,
                requests,
                (errors / requests) if requests else None,
                p95_ms(s.latency for s in rows_of),
            ]
        )
    return rows


def postmortem_markdown(*, tenant: Tenant, incident: Incident) -> str:
    incident = selectors.incident_detail_list(tenant=tenant).get(pk=incident.pk)
    out = [f"# Postmortem: {_cell(incident.title)}", ""]
    if incident.is_drill:
        out += ["> This incident was a chaos drill.", ""]
    out += [f"Incident #{incident.pk}.", ""]
    if incident.summary:
        out += [incident.summary, ""]
    out += ["## Summary", "", *_summary(incident), ""]

    events = list(incident.events.all())
    out += ["## Timeline", ""]
    out += _table(
        ["Time", "Event", "Who", "What"],
        ([e.at, e.kind, e.actor_label, e.message] for e in events),
    )
    breaches = list(incident.breaches.all())
    out += ["", "## Breaches", ""]
    if breaches:
        out += _table(
            [
                "Objective",
                "Group",
                "Kind",
                "Severity",
                "Action",
                "First",
                "Last",
                "Times",
                "Detail",
            ],
            (
                [
                    b.objective,
                    b.group,
                    b.kind,
                    b.severity,
                    b.action,
                    b.detected_at,
                    b.last_seen_at,
                    b.occurrences,
                    b.detail,
                ]
                for b in breaches
            ),
        )
    else:
        out.append("None recorded.")
    rollbacks = _rollbacks(tenant, incident, events)
    out += ["", "## Rollbacks", ""]
    if rollbacks:
        out += _table(
            [
                "Key",
                "Trigger",
                "Status",
                "Revisions",
                "Detected -> started",
                "Started -> traffic switched",
                "Switched -> finished",
                "Detected -> finished",
            ],
            _rollback_rows(rollbacks),
        )
    else:
        out.append("None.")
    minutes = sli_minutes(tenant=tenant, incident=incident)
    out += ["", "## SLIs around the incident", ""]
    if minutes:
        out += _table(["Minute", "Group", "Requests", "Error ratio", "p95 latency (ms)"], minutes)
    else:
        out.append("No SLI samples in the window.")
    signals, hints = selectors.incident_hints(tenant=tenant, incident=incident)
    out += ["", "## Likely causes", ""]
    if hints:
        for rank, hint in enumerate(hints, start=1):
            out.append(f"{rank}. **{hint.cause}** (score {hint.score:g}): {hint.fix}")
            out.extend(f"   - {line}" for line in hint.evidence)
    else:
        out.append("No rule matched the signals around the incident.")
    out += [
        "",
        "## Follow-ups",
        "",
        "- [ ] Root cause confirmed by: …",
        "- [ ] What would have caught this earlier: …",
        "- [ ] Actions (owner, due date): …",
        "",
    ]
    return "\n".join(out)
