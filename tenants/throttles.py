"""Sign-in and signup throttles: Redis token buckets per client IP and per (hashed) e-mail,
charged before any password is checked, and `client_ip`, the peer address they key on."""

from __future__ import annotations

import hashlib
from typing import Any

from django.conf import settings

from portal import ratelimit


def client_ip(meta: dict[str, Any]) -> str:
    """The peer address (the proxy in front sets REMOTE_ADDR; no client header is trusted)."""
    return str(meta.get("REMOTE_ADDR") or "unknown")[:64]


def _throttle_bucket(kind: str, subject: str, limit_setting: str, default: int) -> ratelimit.Bucket:
    limit = max(1, int(getattr(settings, limit_setting, default)))
    window_s = max(1, int(getattr(settings, "AUTH_THROTTLE_WINDOW_S", 300)))
    digest = hashlib.sha256(subject.encode()).hexdigest()[:32]  # no e-mail in Redis keys
    return ratelimit.Bucket(f"{kind}:{digest}", limit / window_s, burst=limit)


def login_throttle(*, email: str, ip: str) -> float:
    """Charge one sign-in attempt per (normalised) e-mail and per client IP, before any
    password is checked; seconds to wait when either is spent, else 0."""
    buckets = [_throttle_bucket("login-ip", ip, "LOGIN_THROTTLE_PER_IP", 50)]
    email = (email or "").strip().lower()
    if email:
        buckets.append(_throttle_bucket("login-email", email, "LOGIN_THROTTLE_PER_EMAIL", 10))
    return ratelimit.throttle(buckets)


def signup_throttle(*, ip: str) -> float:
    """Charge one signup attempt per client IP; seconds to wait when spent, else 0."""
    return ratelimit.throttle([_throttle_bucket("signup-ip", ip, "SIGNUP_THROTTLE_PER_IP", 10)])
