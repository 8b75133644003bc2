"""How many of the tenant's recent incidents each cause rule would have matched: the same
signals (`evidence.incident_signals`) and the same test (`hints.match`) the hints use. The
signals of a resolved incident no longer change, so they are cached for an hour (an open
incident's for a minute); the newest MAX_INCIDENTS of the window are looked at, which bounds
the cost of the page's fragment that shows the counts. A tenant reloading that fragment (many
tabs, a script) is bounded too: its loads are charged to a per-tenant bucket
(`rule_matches_throttle`), and one tenant's counts are computed one at a time across web
processes (`rule_match_counts` waits for the tenant's running count, then reuses the signals it
cached), so a tenant never makes concurrent recomputations of its own signals."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.utils import timezone
from redis.exceptions import LockError

from incidents.models import CauseRule, Incident
from incidents.rca.evidence import Signals, incident_signals
from incidents.rca.hints import Symptom, match
from portal import ratelimit
from portal.exceptions import RateLimited
from tenants.models import Tenant

logger = logging.getLogger(__name__)

WINDOW = timedelta(days=30)
MAX_INCIDENTS = 50
CACHE_S = 3600
OPEN_CACHE_S = 60
# Loads of the counts per tenant a minute (all its members and tabs together), how long a load
# waits for the tenant's count already running, and how long a count may hold its turn (a
# killed web process's turn ends by itself). Settings override each (RULE_MATCHES_*).
DEFAULT_PER_MINUTE = 12
DEFAULT_WAIT_S = 5.0
DEFAULT_HOLD_S = 120.0


def _setting(name: str, default: Any) -> Any:
    return getattr(settings, f"RULE_MATCHES_{name}", default)


def rule_matches_per_minute() -> int:
    return max(1, int(_setting("PER_MINUTE", DEFAULT_PER_MINUTE)))


def rule_matches_throttle(*, tenant: Tenant) -> None:
    """Charge one load of the counts to the tenant's bucket, or raise RateLimited naming
    the limit."""
    limit = rule_matches_per_minute()
    wait = ratelimit.throttle(
        [ratelimit.Bucket(f"rule-matches:{tenant.pk}", limit / 60, burst=limit)]
    )
    refused = f"too many loads of the rule match counts (at most {limit} a minute per tenant)"
    RateLimited.unless_ready(wait, refused)


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


def rule_matches_turn(*, tenant: Tenant) -> Any:
    """The tenant's turn to count (a Redis lock shared by every web process), held at most
    RULE_MATCHES_HOLD_S: a web process killed mid-count gives the turn back by then."""
    return ratelimit.redis_client(settings.REDIS_URL).lock(
        f"{settings.RATE_LIMIT_KEY_PREFIX}:rule-matches-running:{tenant.pk}",
        timeout=float(_setting("HOLD_S", DEFAULT_HOLD_S)),
        sleep=0.05,
        thread_local=False,  # each Lock is one load's; its token need not hide from threads
    )


def rule_match_counts(
    *, tenant: Tenant, rules: Iterable[CauseRule], now: datetime | None = None
) -> RuleMatches:
    """For each rule (active or not), how many of the tenant's incidents triggered in the last
    WINDOW it would have matched. Raises RateLimited when the tenant's count already
    running takes longer than RULE_MATCHES_WAIT_S."""
    wait_s = float(_setting("WAIT_S", DEFAULT_WAIT_S))
    # One count per tenant at a time: a load arriving while another runs waits for it, then
    # finds the signals it cached (its own run is cheap); none past wait_s computes its own.
    turn = rule_matches_turn(tenant=tenant)
    if not turn.acquire(blocking_timeout=wait_s):
        retry = max(1, math.ceil(wait_s))
        raise RateLimited(
            f"the tenant's rule match counts are already being computed (one at a time per "
            f"tenant) and did not finish within {wait_s:g} s; try again in {retry} s.",
            wait=retry,
        )
    try:
        return _counts(tenant=tenant, rules=rules, now=now)
    finally:
        try:
            turn.release()
        except LockError:  # held past hold_s: another load has the turn now
            logger.warning("rule match count of tenant %s outlived its turn", tenant.pk)


def _counts(*, tenant: Tenant, rules: Iterable[CauseRule], now: datetime | None) -> RuleMatches:
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
