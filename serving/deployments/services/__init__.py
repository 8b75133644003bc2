"""All writes of deployments: create, change (scale, canary, promote, keys), delete.

Every change is a new immutable revision of desired state, audited, followed on commit by
one reconcile (serving.control.reconcile) that brings Ray Serve to it. `spec` checks a desired
state and the tenant's quota, `revisions` writes the revisions (`deployment_change`),
`deployments` creates, promotes and deletes, `keys` creates and revokes inference keys,
`pools` saves the platform's shared pools; this package re-exports their public names.
"""

from __future__ import annotations

from serving.deployments.services.deployments import (
    deployment_create,
    deployment_delete,
    deployment_promote,
    deployment_set_canary,
    deployment_set_traffic,
)
from serving.deployments.services.keys import (
    KEY_PREFIX,
    inference_key_create,
    inference_key_revoke,
    new_inference_key,
)
from serving.deployments.services.pools import POOL_FIELDS, pool_save
from serving.deployments.services.revisions import (
    change_reason,
    current_revision,
    deployment_change,
    locked_deployment,
    reconcile_on_commit,
    snapshot,
    write_revision,
)
from serving.deployments.services.spec import (
    BREAKER_LIMITS,
    FAULT_KEYS,
    GUARD_LIMITS,
    check_quota,
    clean_spec,
    live_deployments,
)
from serving.deployments.services.tiers import clean_tiers, deployment_switch_tier

__all__ = [
    "POOL_FIELDS",
    "pool_save",
    "BREAKER_LIMITS",
    "FAULT_KEYS",
    "GUARD_LIMITS",
    "KEY_PREFIX",
    "check_quota",
    "clean_spec",
    "change_reason",
    "current_revision",
    "deployment_change",
    "deployment_create",
    "deployment_delete",
    "deployment_promote",
    "deployment_set_canary",
    "deployment_set_traffic",
    "deployment_switch_tier",
    "clean_tiers",
    "inference_key_create",
    "inference_key_revoke",
    "live_deployments",
    "locked_deployment",
    "new_inference_key",
    "reconcile_on_commit",
    "snapshot",
    "write_revision",
]
