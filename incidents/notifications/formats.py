"""What each kind of channel is sent: the signed webhook's JSON, the e-mail, a Slack message
(`text` plus Block Kit `blocks`) and a PagerDuty Events API v2 event. Every link is the
incident's page (PORTAL_BASE_URL + its HTML URL), never the API; every text a tenant can
influence (titles, deployment names, breach details) is cut to the receiver's limits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.urls import reverse

from incidents.models import EventKind, Incident, IncidentStatus, SlaBreach
from incidents.notifications.models import NotificationDelivery

# Receivers' limits (Slack Block Kit: header 150, section field 2000, button text 75, button
# url 3000; PagerDuty: summary 1024, dedup_key 255), and ours for the free texts.
SLACK_HEADER_MAX = 150
SLACK_FIELD_MAX = 300
SLACK_TEXT_MAX = 600
SLACK_CONTEXT_MAX = 500
PD_SUMMARY_MAX = 1024
MESSAGE_MAX = 2000

# PagerDuty's severities: a page wakes someone (critical), a ticket waits (warning); a drill's
# incident is information only, whatever its severity, so no rehearsal pages anybody.
PD_SEVERITY = {"page": "critical", "ticket": "warning"}
PD_DRILL_SEVERITY = "info"
PORTAL_CLIENT = "AI Ops Portal"


def cut(text: str, limit: int) -> str:
    """At most `limit` characters, an ellipsis marking the cut."""
    text = str(text)
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def incident_page_url(incident: Incident, tenant_slug: str) -> str:
    """The incident's page, absolute: what every notification links to."""
    path = reverse("incident-detail", kwargs={"slug": tenant_slug, "pk": incident.pk})
    return str(settings.PORTAL_BASE_URL).rstrip("/") + path


def dedup_key(incident: Incident) -> str:
    """PagerDuty's key for the incident: the same for its trigger, acknowledge and resolve."""
    return f"aiops-portal/tenant-{incident.tenant_id}/incident-{incident.pk}"


@dataclass(frozen=True)
class Facts:
    """What a message says about its incident, read once per delivery."""

    incident: Incident
    tenant_slug: str
    url: str
    event_kind: str
    event_message: str
    event_at: str
    status_to: str
    deployment: str
    version: str
    sli: str
    burn: str
    breach_kind: str
    group: str


def _version_of(incident: Incident, breach: SlaBreach | None) -> str:
    """The model version serving the breached slot now (the canary's for a canary breach)."""
    deployment = incident.deployment
    revision = getattr(deployment, "current_revision", None) if deployment else None
    if revision is None:
        return ""
    version = revision.stable_version
    if breach is not None and breach.group == "canary" and revision.canary_version is not None:
        version = revision.canary_version
    return str(version)


def _burn_of(breach: SlaBreach | None) -> str:
    if breach is None or (breach.burn_long is None and breach.burn_short is None):
        return ""
    parts = [
        f"{value:.1f}x" for value in (breach.burn_long, breach.burn_short) if value is not None
    ]
    return " / ".join(parts) + (" (long / short window)" if len(parts) == 2 else "")


def facts(delivery: NotificationDelivery) -> Facts:
    incident, event = delivery.incident, delivery.event
    breach = incident.first_breach
    return Facts(
        incident=incident,
        tenant_slug=delivery.tenant.slug,
        url=incident_page_url(incident, delivery.tenant.slug),
        event_kind=event.kind if event else "updated",
        event_message=cut(event.message, MESSAGE_MAX) if event else "",
        event_at=(event.at if event else incident.triggered_at).isoformat(),
        status_to=str((event.data or {}).get("to", "")) if event else "",
        deployment=incident.deployment.name if incident.deployment else "",
        version=_version_of(incident, breach),
        sli=f"{breach.objective} ({breach.group})" if breach else "",
        burn=_burn_of(breach),
        breach_kind=breach.kind if breach else "",
        group=breach.group if breach else "",
    )


def webhook_payload(delivery: NotificationDelivery, f: Facts) -> dict[str, Any]:
    incident = f.incident
    event = delivery.event
    return {
        "delivery": delivery.pk,
        "type": f"incident.{f.event_kind}",
        "incident": {
            "id": incident.pk,
            "title": incident.title,
            "severity": incident.severity,
            "status": incident.status,
            "deployment": incident.deployment_id,
            "is_drill": incident.is_drill,
            "triggered_at": incident.triggered_at.isoformat(),
            "url": f.url,
        },
        "event": None
        if event is None
        else {"kind": event.kind, "at": f.event_at, "message": f.event_message},
    }


def email_message(f: Facts) -> tuple[str, str]:
    """(subject, body) of the e-mail."""
    incident = f.incident
    lines = [
        incident.title,
        f"Severity: {incident.severity}   Status: {incident.status}",
        f"Triggered: {incident.triggered_at.isoformat()}",
    ]
    if f.event_message:
        lines.append(f"Event: {f.event_kind}: {f.event_message}")
    lines.append(f.url)
    drill = "[drill] " if incident.is_drill else ""
    subject = f"{drill}[{incident.severity}] #{incident.pk} {incident.title}"
    return cut(" ".join(subject.split()), 200), "\n".join(lines)


def mrkdwn(text: str) -> str:
    """Slack's three control characters escaped: a tenant's text never mentions @channel or
    turns into a link."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _field(label: str, value: str) -> dict[str, str]:
    return {"type": "mrkdwn", "text": f"*{label}*\n{mrkdwn(cut(value or '-', SLACK_FIELD_MAX))}"}


def slack_message(f: Facts) -> dict[str, Any]:
    """An incoming-webhook message: `text` (the notification's and old clients' fallback)
    and Block Kit blocks: header, the facts as section fields, a context line, a button."""
    incident = f.incident
    drill = "[drill] " if incident.is_drill else ""
    severity = incident.severity.upper()
    headline = f"{drill}[{severity}] {' '.join(incident.title.split())}"
    event = f"{f.event_kind}: {f.event_message}" if f.event_message else f.event_kind
    context = f"Incident #{incident.pk} \u00b7 {incident.status} \u00b7 {event}"
    summary = f"{drill}[{severity}] #{incident.pk} {' '.join(incident.title.split())}"
    return {
        "text": f"{mrkdwn(cut(summary, SLACK_TEXT_MAX))} ({incident.status}): <{f.url}|open>",
        "blocks": [
            {
                "type": "header",
                "text": {"type": "plain_text", "text": cut(headline, SLACK_HEADER_MAX)},
            },
            {
                "type": "section",
                "fields": [
                    _field("Deployment", f.deployment),
                    _field("Version", f.version),
                    _field("SLI", f.sli),
                    _field("Burn", f.burn),
                ],
            },
            {
                "type": "context",
                "elements": [{"type": "mrkdwn", "text": mrkdwn(cut(context, SLACK_CONTEXT_MAX))}],
            },
            {
                "type": "actions",
                "elements": [
                    {
                        "type": "button",
                        "action_id": "open_incident",
                        "text": {"type": "plain_text", "text": f"Open incident #{incident.pk}"},
                        "url": f.url,
                    }
                ],
            },
        ],
    }


def pagerduty_action(f: Facts) -> str:
    """trigger / acknowledge / resolve, following the incident's lifecycle: a breach or an
    escalation triggers, an acknowledgement or mitigation acknowledges, resolving resolves."""
    if f.event_kind == EventKind.STATUS_CHANGED:
        to = f.status_to
    elif f.event_kind in (EventKind.BREACH, EventKind.ESCALATED):
        to = IncidentStatus.TRIGGERED
    else:
        to = f.incident.status
    if to == IncidentStatus.RESOLVED:
        return "resolve"
    if to in (IncidentStatus.ACKNOWLEDGED, IncidentStatus.MITIGATED):
        return "acknowledge"
    return "trigger"


def pagerduty_event(f: Facts, routing_key: str) -> dict[str, Any]:
    """One Events API v2 event. Acknowledge and resolve carry only the key and dedup_key (as
    PagerDuty's reference shows them); a trigger carries the payload and the link."""
    incident = f.incident
    action = pagerduty_action(f)
    body: dict[str, Any] = {
        "routing_key": routing_key,
        "event_action": action,
        "dedup_key": dedup_key(incident),
    }
    if action != "trigger":
        return body
    drill = "[drill] " if incident.is_drill else ""
    severity = PD_DRILL_SEVERITY if incident.is_drill else PD_SEVERITY.get(incident.severity)
    deployment = f.deployment or "portal"
    body["payload"] = {
        "summary": cut(f"{drill}#{incident.pk} {' '.join(incident.title.split())}", PD_SUMMARY_MAX),
        "source": cut(f"{f.tenant_slug}/{deployment}", 255),
        "severity": severity or "error",
        "timestamp": f.event_at,
        "component": cut(deployment, 255),
        "group": f.group or "all",
        "class": f.breach_kind or f.event_kind,
        "custom_details": {
            "incident": incident.pk,
            "status": incident.status,
            "severity": incident.severity,
            "is_drill": incident.is_drill,
            "deployment": f.deployment,
            "version": f.version,
            "sli": f.sli,
            "burn": f.burn,
            "event": f.event_kind,
            "message": f.event_message,
            "url": f.url,
        },
    }
    body["links"] = [{"href": f.url, "text": f"Incident #{incident.pk} in the AI Ops Portal"}]
    body["client"] = PORTAL_CLIENT
    body["client_url"] = f.url
    return body
