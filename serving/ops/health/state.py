"""The health tick's Redis layout (`<prefix>:health:*`) and its reads: per-slot state, what
the last tick found per deployment, the tenants' feature reports, the tick lock."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings


def health_redis() -> Any:
    import redis

    return redis.Redis.from_url(settings.REDIS_URL)


def health_keys() -> dict[str, str]:
    prefix = settings.SLI_KEY_PREFIX
    return {
        "state": f"{prefix}:health:state",
        "deployments": f"{prefix}:health:deployments",
        "features": f"{prefix}:health:features",
        "lock": f"{prefix}:health:tick-lock",
        "sli": f"{prefix}:sli",
    }


def loads(raw: Any) -> Any:
    """The JSON value of a Redis field, None where the field is missing or empty."""
    return json.loads(raw) if raw else None


def deployment_health(deployment_id: int, redis_client: Any = None) -> dict[str, Any]:
    """What the last tick found for one deployment (pages, API)."""
    r = redis_client or health_redis()
    raw = r.hget(health_keys()["deployments"], str(deployment_id))
    return loads(raw) or {}
