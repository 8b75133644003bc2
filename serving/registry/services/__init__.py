"""All writes of the model registry: models, versions (by path or upload), validation.

Status moves only through `set_status` (registered -> validating -> ready | failed); every
change writes its AuditEvent in the same transaction, and validation is enqueued on commit.
`versions` holds the models, versions and status moves, `uploads` the versions registered
from an archive, `validation` the validation run; this package re-exports their public names.
"""

from __future__ import annotations

from serving.registry.services.uploads import version_register_upload
from serving.registry.services.validation import (
    DEFAULT_VALIDATION_MAX_ATTEMPTS,
    LIMIT_SETTINGS,
    VALIDATOR,
    config_limits,
    version_validate,
)
from serving.registry.services.versions import (
    FILES_DELETED,
    MODEL_FIELDS,
    VERSION_FIELDS,
    model_create,
    model_delete,
    model_update,
    save_new_version,
    set_status,
    version_delete,
    version_register_path,
)

__all__ = [
    "DEFAULT_VALIDATION_MAX_ATTEMPTS",
    "FILES_DELETED",
    "LIMIT_SETTINGS",
    "MODEL_FIELDS",
    "VALIDATOR",
    "VERSION_FIELDS",
    "config_limits",
    "model_create",
    "model_delete",
    "model_update",
    "save_new_version",
    "set_status",
    "version_delete",
    "version_register_path",
    "version_register_upload",
    "version_validate",
]
