"""Business errors of the portal: one small hierarchy, mapped to HTTP by one handler."""

from __future__ import annotations

import math


class PortalError(Exception):
    """Base of every business error; carries a machine code and the field it is about."""

    status_code = 400
    code = "invalid"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    @property
    def fields(self) -> dict[str, list[str]]:
        return {self.field: [self.message]} if self.field else {}


class ValidationFailed(PortalError):
    code = "invalid"


class PermissionDeniedError(PortalError):
    status_code = 403
    code = "forbidden"


class NotFoundError(PortalError):
    status_code = 404
    code = "not_found"


class ConflictError(PortalError):
    status_code = 409
    code = "conflict"


class QuotaExceeded(PortalError):
    status_code = 403
    code = "quota_exceeded"


class PayloadTooLarge(PortalError):
    status_code = 413
    code = "too_large"


class RateLimited(PortalError):
    """A tenant's bucket or concurrency cap refused the work; `wait`: the seconds until it may
    try again (the Retry-After a page or the API answers with)."""

    status_code = 429
    code = "rate_limited"

    def __init__(self, message: str, *, wait: float, field: str | None = None) -> None:
        super().__init__(message, field=field)
        self.wait = wait

    @classmethod
    def unless_ready(cls, wait: float, refused: str) -> None:
        """Raise "<refused>; try again in N s." (N: `wait` rounded up, at least 1) when the
        bucket said to wait; nothing when `wait` is 0."""
        if wait > 0:
            retry = max(1, math.ceil(wait))
            raise cls(f"{refused}; try again in {retry} s.", wait=retry)
