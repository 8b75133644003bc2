"""Inference keys: clients send `Authorization: Bearer <key>`; the router knows only SHA-256
hashes of the tenant's keys (delivered through user_config, rotated without restarts), and
which of them are of priority "batch" (`batch_key_hashes`; absent in configs from before
priority classes: every key realtime)."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from typing import Any

from serving.engine.priority import BATCH, REALTIME


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


def key_priority(raw: str | None, config: Mapping[str, Any]) -> str:
    """The priority class of an accepted key's requests: "batch" when its hash is among the
    config's `batch_key_hashes`, otherwise "realtime". Only the portal's config decides it;
    nothing a client sends can raise its requests' class."""
    batch: Iterable[str] = config.get("batch_key_hashes") or ()
    return BATCH if raw and key_matches(raw, list(batch)) else REALTIME


def request_priority(request: Mapping[str, Any]) -> str:
    """The class a version slot runs a routed request at: the router's word (payloads from
    routers older than priority classes carry none: realtime)."""
    return BATCH if request.get("priority") == BATCH else REALTIME
