"""Request-body validation shared by the API views: a serializer's validated data, or a 400."""

from __future__ import annotations

from typing import Any


def validated(serializer_class: type, data: Any, **kwargs: Any) -> dict[str, Any]:
    """Validated data of `serializer_class` for `data`; invalid input raises the 400 that the
    portal's exception handler turns into `{"error": {..., "fields"}}`."""
    serializer = serializer_class(data=data, **kwargs)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)
