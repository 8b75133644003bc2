"""Who is acting: a signed-in user, an API token, or the system (Celery, commands)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

    from tenants.models import ApiToken


@dataclass(frozen=True)
class Actor:
    user: AbstractBaseUser | AnonymousUser | None = None
    token: ApiToken | None = None
    system: str | None = None

    @property
    def user_id(self) -> int | None:
        if self.user is None or not self.user.is_authenticated:
            return None
        return int(self.user.pk)

    @property
    def is_platform_staff(self) -> bool:
        return self.token is None and bool(getattr(self.user, "is_staff", False))

    @property
    def label(self) -> str:
        if self.token is not None:
            return f"token:{self.token.name} ({self.token.prefix})"
        if self.user is not None and self.user.is_authenticated:
            return str(getattr(self.user, "email", "") or self.user.get_username())
        return f"system:{self.system or 'portal'}"


SYSTEM = Actor(system="portal")
