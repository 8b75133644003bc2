"""Admin screens of the serving rooms (Django finds this module; each room registers its own)."""

from serving.deployments import admin as deployments_admin  # noqa: F401
from serving.registry import admin as registry_admin  # noqa: F401
