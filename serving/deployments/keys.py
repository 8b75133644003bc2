"""Per-tenant cache salts and per-deployment probe keys, derived from the portal's KV secret."""

from __future__ import annotations

import hashlib
import hmac

from serving.dataplane.keys import hash_key


def cache_salt_hex(tenant_id: int) -> str:
    """The tenant's prefix-cache salt: HMAC of the current KV secret and the tenant id (only
    the current one: a rotation leaves every older prefix-cache block unreachable)."""
    from portal.secrets import kv_secret

    return hmac.new(kv_secret(), f"tenant:{tenant_id}".encode(), hashlib.sha256).hexdigest()


def _probe_key_under(secret: bytes, deployment_id: int) -> str:
    digest = hmac.new(secret, f"probe:{deployment_id}".encode(), hashlib.sha256).hexdigest()
    return f"ik_probe_{digest[:40]}"


def probe_key(deployment_id: int) -> str:
    """The health checker's inference key for a deployment, derived (never stored): the
    portal can always recompute it, and only its hash reaches the router. Derived from the
    oldest KV secret still accepted, whose hash the router already holds during a rotation."""
    from portal.secrets import probe_secret

    return _probe_key_under(probe_secret(), deployment_id)


def probe_key_hashes(deployment_id: int) -> list[str]:
    """The hashes the router accepts for the probe: the probe key under every accepted KV
    secret (current first, then the previous one during a rotation's grace)."""
    from portal.secrets import kv_secrets

    return [hash_key(_probe_key_under(secret, deployment_id)) for secret in kv_secrets()]
