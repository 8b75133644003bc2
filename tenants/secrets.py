"""The tenants room's secret markers and hashing: the prefixes of raw API tokens and
invitation link tokens, and `hash_secret`, the SHA-256 under which only their digests are
stored (tokens and invitations are looked up by it)."""

from __future__ import annotations

import hashlib

TOKEN_PREFIX = "aop_"  # noqa: S105 (a public marker, not a secret)
INVITATION_PREFIX = "inv_"


def hash_secret(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()
