"""Model validation shared by every app's services."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError

from portal.exceptions import ValidationFailed


def clean_or_fail(obj: Any, **kwargs: Any) -> None:
    """full_clean(), with Django's errors turned into the portal's, naming the first field."""
    try:
        obj.full_clean(**kwargs)
    except ValidationError as exc:
        errors = exc.message_dict
        field = sorted(errors)[0]
        raise ValidationFailed(
            " ".join(errors[field]), field=None if field == "__all__" else field
        ) from None
