"""Inference keys: clients send `Authorization: Bearer <key>`; the router knows only SHA-256
hashes of the tenant's keys (delivered through user_config, rotated without restarts)."""

from __future__ import annotations

import hashlib
import hmac


def hash_key(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def key_matches(raw: str | None, hashes: list[str]) -> bool:
    """Constant-time comparison against every known hash."""
    if not raw:
        return False
    digest = hash_key(raw)
    found = False
    for known in hashes:
        found |= hmac.compare_digest(digest, known)
    return found
