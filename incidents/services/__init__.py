"""All writes of incidents: breaches open (or join) incidents, status changes, notes, rollback
links and timeline events. Each service owns its transaction; the live pages and the
notification channels hear about a write only once it is committed. By capability:
`breach_records` (breaches and the incidents they open), `incidents` (status moves, notes,
timeline events), `rollbacks` (the rollback that answers an incident); this package re-exports
their public names.
"""

from __future__ import annotations

from incidents.notifications.services import (
    notification_channel_create,
    notification_channel_delete,
    notification_channel_update,
)
from incidents.rca.services import cause_rule_create, cause_rule_delete, cause_rule_update
from incidents.services.breach_records import DEDUP_RETRIES, breach_record, breach_record_if_new
from incidents.services.incidents import (
    AUTOMATION,
    NEXT,
    NOTE_MAX_CHARS,
    incident_acknowledge,
    incident_event_append,
    incident_mitigate,
    incident_note,
    incident_resolve,
)
from incidents.services.rollbacks import (
    incident_link_rollback,
    incident_rollback_finished,
    incident_rollback_started,
)

# The configuration services (rules, channels) live in incidents.rca and incidents.notifications,
# exported here.
__all__ = [
    "AUTOMATION",
    "DEDUP_RETRIES",
    "NEXT",
    "NOTE_MAX_CHARS",
    "breach_record",
    "breach_record_if_new",
    "cause_rule_create",
    "cause_rule_delete",
    "cause_rule_update",
    "incident_acknowledge",
    "incident_event_append",
    "incident_link_rollback",
    "incident_mitigate",
    "incident_note",
    "incident_resolve",
    "incident_rollback_finished",
    "incident_rollback_started",
    "notification_channel_create",
    "notification_channel_delete",
    "notification_channel_update",
]
