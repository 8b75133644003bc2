"""A deployment's traffic hygiene settings (`traffic`): sticky A/B assignment by a client key
(serving.dataplane.sticky), checked (`clean_traffic`), and compiled for its router with the
deployment's traffic salt (`traffic_fields`).

The salt is an HMAC of Django's SECRET_KEY and the deployment's id: stable across revisions (a
client keeps its bucket while the percent changes), different per deployment, and never shown
to the tenant, so no client can pick a key that lands in the group it wants.
"""

from __future__ import annotations

from typing import Any

from django.utils.crypto import salted_hmac

from portal.exceptions import ValidationFailed
from serving.dataplane.sticky import DEFAULT_HEADER, HEADER_NAME, RESERVED_HEADERS
from serving.deployments.spec_checks import settings_object

TRAFFIC_KEYS = ("sticky", "client_key_header", "user_field")
MAX_HEADER_NAME = 64


def clean_traffic(raw: Any, field: str = "traffic") -> dict[str, Any]:
    """`raw` checked: {"sticky": bool, "client_key_header": a header name (default
    x-client-key), "user_field": bool (the body's `user` is a client key, default true)}."""
    raw = settings_object(raw, field, TRAFFIC_KEYS)
    out: dict[str, Any] = {}
    for name in ("sticky", "user_field"):
        if name in raw:
            if not isinstance(raw[name], bool):
                raise ValidationFailed("must be true or false.", field=f"{field}.{name}")
            out[name] = raw[name]
    if "client_key_header" in raw:
        header = raw["client_key_header"]
        if not isinstance(header, str) or len(header) > MAX_HEADER_NAME:
            raise ValidationFailed(
                f"must be a header name of at most {MAX_HEADER_NAME} characters.",
                field=f"{field}.client_key_header",
            )
        header = header.strip().lower()
        if not HEADER_NAME.match(header):
            raise ValidationFailed(
                "use letters, digits and '-' (a header name).", field=f"{field}.client_key_header"
            )
        if header in RESERVED_HEADERS:
            raise ValidationFailed(
                f"{header} carries a secret or already means something to the router.",
                field=f"{field}.client_key_header",
            )
        out["client_key_header"] = header
    return out


def traffic_salt_hex(deployment_id: int) -> str:
    key = f"deployment:{deployment_id}"
    return salted_hmac("serving.traffic", key, algorithm="sha256").hexdigest()


def traffic_fields(deployment_id: int, traffic: dict[str, Any] | None) -> dict[str, Any]:
    """The router's `traffic` (DeploymentSpec.traffic): the settings and the salt. Every
    deployment's router counts its clients' groups (the split-consistency panel), sticky or
    not."""
    traffic = traffic or {}
    return {
        "sticky": bool(traffic.get("sticky")),
        "client_key_header": str(traffic.get("client_key_header") or DEFAULT_HEADER),
        "user_field": bool(traffic.get("user_field", True)),
        "salt": traffic_salt_hex(deployment_id),
    }
