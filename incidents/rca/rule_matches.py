"""How many of the tenant's recent incidents each cause rule would have matched: the same
signals (`evidence.incident_signals`) and the same test (`hints.match`) the hints use. The
signals of a resolved incident no longer change, so they are cached for an hour (an open
incident's for a minute); the newest MAX_INCIDENTS of the window are looked at, which bounds
the cost of the page's fragment that shows the counts."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.core.cache import cache
from django.utils import timezone

from incidents.models import CauseRule, Incident
from incidents.rca.evidence import Signals, incident_signals
from incidents.rca.hints import Symptom, match
from tenants.models import Tenant

logger = logging.getLogger(__name__)

WINDOW = timedelta(days=30)
MAX_INCIDENTS = 50
CACHE_S = 3600
OPEN_CACHE_S = 60


@dataclass(frozen=True)
class RuleMatches:
    counts: dict[int, int]  # rule id -> incidents matched
    incidents: int  # incidents looked at
    capped: bool  # the window holds more than were looked at


def _cache_key(incident: Incident) -> str:
    """A resolved incident's key names its end (its signals are final); an open one's is
    kept OPEN_CACHE_S only (its window still grows)."""
    end = "open" if incident.resolved_at is None else int(incident.resolved_at.timestamp())
    return f"rca-signals:{incident.tenant_id}:{incident.pk}:{end}"


def _signals(tenant: Tenant, incidents: Sequence[Incident]) -> list[Signals]:
    keys = [_cache_key(incident) for incident in incidents]
    try:
        cached = cache.get_many(keys) if keys else {}
    except Exception as exc:  # a cache that is down costs time, not the page
        logger.warning("signals cache unavailable: %s", exc)
        cached = {}
    out: list[Signals] = []
    fresh: dict[bool, dict[str, Signals]] = {True: {}, False: {}}  # resolved? -> key -> signals
    for incident, key in zip(incidents, keys, strict=True):
        signals = cached.get(key)
        if not isinstance(signals, dict):
            signals = incident_signals(tenant=tenant, incident=incident)
            fresh[incident.resolved_at is not None][key] = signals
        out.append(signals)
    for resolved, entries in fresh.items():
        if entries:
            try:
                cache.set_many(entries, timeout=CACHE_S if resolved else OPEN_CACHE_S)
            except Exception as exc:
                logger.warning("signals cache unavailable: %s", exc)
    return out


def rule_match_counts(
    *, tenant: Tenant, rules: Iterable[CauseRule], now: datetime | None = None
) -> RuleMatches:
    """For each rule (active or not), how many of the tenant's incidents triggered in the last
    WINDOW it would have matched."""
    since = (now or timezone.now()) - WINDOW
    incidents = list(
        Incident.objects.filter(tenant=tenant, triggered_at__gte=since)
        .select_related("rollback", "deployment")
        .order_by("-triggered_at", "-id")[: MAX_INCIDENTS + 1]
    )
    capped = len(incidents) > MAX_INCIDENTS
    incidents = incidents[:MAX_INCIDENTS]
    every = _signals(tenant, incidents)
    counts = {}
    for rule in rules:
        symptom = Symptom(rule.symptom, rule.op, rule.threshold, float(rule.weight))
        counts[rule.pk] = sum(1 for signals in every if match(symptom, signals) is not None)
    return RuleMatches(counts, len(incidents), capped)
