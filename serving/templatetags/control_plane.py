"""`{% control_plane_badge %}`: the Serve control plane's state on every page (base.html).
Staff always see it (with the latency and retries); tenants only while it is degraded, when
their deployment changes and status refreshes are held back."""

from __future__ import annotations

from typing import Any

from django import template

from serving.deployments.controlplane import control_plane_status

register = template.Library()


@register.inclusion_tag("_control_plane_badge.html", takes_context=True)
def control_plane_badge(context: dict[str, Any]) -> dict[str, Any]:
    request = context.get("request")
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"show": False}
    status = control_plane_status()
    staff = bool(user.is_staff)
    return {"show": staff or status["degraded"], "staff": staff, "cp": status}


@register.inclusion_tag("_control_plane_panel.html")
def control_plane_panel() -> dict[str, Any]:
    """The platform status page's card (staff): each process's guard and the recent alerts."""
    return {"cp": control_plane_status()}
