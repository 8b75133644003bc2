"""Chaos drills (services): the fault catalogue, drills and their cron schedules
(django-celery-beat), and the run's state machine:

    scheduled -> checking (steady state) -> injecting -> observing -> reverting
              -> passed | failed | aborted

Faults go in only through the reconcile path: a new revision whose spec carries the fault in
the target slot's `faults` (audited like any change), with `issued_at` and `expires_at`, so the
replicas drop it by themselves at the TTL even if the worker that should revert it is gone.
Each step runs in the `advance_drill_run` task (queue `chaos`, acks_late) under a row lock and
is idempotent; a killed worker's run is picked up again by the `resume_drill_runs` sweep.
"""

from incidents.drills.base import (
    CATCH_UP_MAX_S,
    PROBE_WINDOW_S,
    RECOVERY_WAIT_S,
    RESUME_AFTER_S,
    STEP_S,
    TTL_GRACE_S,
)
from incidents.drills.catalogue import BLAST_RADIUS, CATALOGUE, PROBE_SLIS, Fault, catalogue
from incidents.drills.engine import fault_entry, note_detection, run_advance
from incidents.drills.selectors import active_run_id, runs_to_resume
from incidents.drills.services import drill_create, drill_delete, drill_update, run_start, run_stop
from incidents.drills.steady import measure, steady_state

__all__ = [
    "BLAST_RADIUS",
    "CATALOGUE",
    "CATCH_UP_MAX_S",
    "PROBE_SLIS",
    "PROBE_WINDOW_S",
    "RECOVERY_WAIT_S",
    "RESUME_AFTER_S",
    "STEP_S",
    "TTL_GRACE_S",
    "Fault",
    "note_detection",
    "active_run_id",
    "catalogue",
    "drill_create",
    "drill_delete",
    "drill_update",
    "fault_entry",
    "measure",
    "run_advance",
    "run_start",
    "run_stop",
    "runs_to_resume",
    "steady_state",
]
