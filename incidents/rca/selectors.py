"""Reads of what incidents learn: the tenant's learned cause weights, an incident's hints
re-ranked by them (with the caller's own votes), and the Serve symptoms as evidence."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from django.db.models import QuerySet

from incidents import selectors
from incidents.models import Incident
from incidents.rca import learning
from incidents.rca.evidence import Signals, incident_evidence
from incidents.rca.hints import Hint, rank_hints
from incidents.rca.models import HintFeedback, HintWeight
from incidents.rca.symptoms import SymptomItem
from tenants.actors import Actor
from tenants.models import Tenant


@dataclass
class Analysis:
    signals: Signals
    hints: list[Hint]
    muted: list[Hint]
    symptoms: list[SymptomItem]
    my_votes: dict[str, str] = field(default_factory=dict)  # cause key -> verdict

    def as_dict(self) -> dict[str, Any]:
        return {
            "signals": self.signals,
            "hints": [asdict(h) for h in self.hints],
            "muted": [asdict(h) for h in self.muted],
            "symptoms": [asdict(s) for s in self.symptoms],
            "my_votes": self.my_votes,
        }


def hint_weight_list(*, tenant: Tenant) -> QuerySet[HintWeight]:
    return HintWeight.objects.filter(tenant=tenant).order_by("cause_key")


def hint_weights(*, tenant: Tenant) -> dict[str, tuple[int, int]]:
    """{cause key: (right, wrong)} of the tenant's votes."""
    return {w.cause_key: (w.right, w.wrong) for w in hint_weight_list(tenant=tenant)}


def my_votes(*, tenant: Tenant, incident: Incident, user_id: int | None) -> dict[str, str]:
    if user_id is None:
        return {}
    rows = HintFeedback.objects.filter(tenant=tenant, incident=incident, user_id=user_id)
    return dict(rows.values_list("cause_key", "verdict"))


def incident_analysis(
    *, tenant: Tenant, incident: Incident, user_id: int | None = None
) -> Analysis:
    """The incident's signals, its hints re-ranked by the tenant's votes (likely and muted),
    what Serve said (symptoms) and the caller's own votes."""
    signals, symptoms = incident_evidence(tenant=tenant, incident=incident)
    rules = list(selectors.cause_rule_list(tenant=tenant, active_only=True).order_by("id"))
    likely, muted = learning.apply_feedback(rank_hints(signals, rules), hint_weights(tenant=tenant))
    votes = my_votes(tenant=tenant, incident=incident, user_id=user_id)
    return Analysis(signals, likely, muted, symptoms, votes)


def voter_id(actor: Actor) -> int | None:
    """The person behind a vote: the signed-in user, or the person who made the token."""
    if actor.user_id is not None:
        return int(actor.user_id)
    if actor.token is not None and actor.token.created_by_id is not None:
        return int(actor.token.created_by_id)
    return None
