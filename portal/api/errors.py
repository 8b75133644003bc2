"""One exception handler for the whole API: `{"error": {"code", "message", "fields"}}`."""

from __future__ import annotations

import logging
import math
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from portal.exceptions import PortalError, RateLimited

logger = logging.getLogger(__name__)

_CODES = {
    400: "invalid",
    401: "not_authenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    413: "too_large",
    415: "unsupported_media_type",
    429: "rate_limited",
}


def _flatten(detail: Any, prefix: str = "") -> dict[str, list[str]]:
    """Turn DRF's nested error detail into {"field.sub": ["message", ...]}."""
    fields: dict[str, list[str]] = {}
    if isinstance(detail, dict):
        for key, value in detail.items():
            if isinstance(key, int) or str(key).isdigit():
                name = f"{prefix}[{key}]"
            else:
                name = f"{prefix}.{key}" if prefix else str(key)
            fields.update(_flatten(value, name))
    elif isinstance(detail, list):
        if all(not isinstance(item, dict | list) for item in detail):
            fields[prefix or "non_field_errors"] = [str(item) for item in detail]
        else:
            for index, item in enumerate(detail):
                fields.update(_flatten(item, f"{prefix}[{index}]" if prefix else str(index)))
    else:
        fields[prefix or "non_field_errors"] = [str(detail)]
    return fields


def error_body(code: str, message: str, fields: dict[str, list[str]] | None = None) -> dict:
    return {"error": {"code": code, "message": message, "fields": fields or {}}}


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, PortalError):
        message = f"{exc.field}: {exc.message}" if exc.field else exc.message
        response = Response(error_body(exc.code, message, exc.fields), status=exc.status_code)
        if isinstance(exc, RateLimited):
            response["Retry-After"] = str(max(1, math.ceil(exc.wait)))
        return response
    if isinstance(exc, DjangoValidationError):
        if hasattr(exc, "error_dict"):
            fields = {k: [str(m) for e in v for m in e.messages] for k, v in exc.error_dict.items()}
        else:
            fields = {"non_field_errors": [str(m) for m in exc.messages]}
        exc = exceptions.ValidationError(fields)
    elif isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()

    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    code = _CODES.get(response.status_code, "error")
    if isinstance(exc, exceptions.ValidationError):
        fields = _flatten(exc.detail)
        names = ", ".join(sorted(fields))
        message = f"Invalid input: {names}." if names else "Invalid input."
    else:
        fields = {}
        detail = getattr(exc, "detail", "")
        message = str(detail) if detail else response.status_text
        if isinstance(exc, exceptions.APIException) and exc.default_code:
            code = _CODES.get(response.status_code, str(exc.default_code))
    response.data = error_body(code, message, fields)
    if response.status_code == status.HTTP_429_TOO_MANY_REQUESTS:
        wait = getattr(exc, "wait", None)
        if wait is not None:
            response["Retry-After"] = str(max(1, int(wait + 0.999)))
    return response
