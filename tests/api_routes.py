"""Discovery of every API route from the URL conf, so new routes join the matrices by themselves."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from django.urls import URLPattern, URLResolver, get_resolver

API_PREFIX = "api/v1/"
_KWARG = re.compile(r"\(\?P<(\w+)>|<(?:\w+:)?(\w+)>")


@dataclass(frozen=True)
class Route:
    name: str
    pattern: str
    view_class: type
    methods: tuple[str, ...]
    actions: dict[str, str]
    detail: bool
    # Every URL kwarg, in order: a nested route has its parents' too (`model_pk`, ...).
    kwargs: tuple[str, ...] = ()

    @property
    def tenant_scoped(self) -> bool:
        return bool(getattr(self.view_class, "tenant_scoped", False))

    @property
    def lookup_kwarg(self) -> str | None:
        if not self.detail:
            return None
        return _lookup_of(self.view_class)

    @property
    def parent_kwargs(self) -> tuple[str, ...]:
        """URL kwargs naming parent objects; the view maps each to an attribute of its objects
        in `parent_lookups` (e.g. {"model_pk": "model_id"})."""
        return tuple(k for k in self.kwargs if k != self.lookup_kwarg)


def _lookup_of(view_class: type) -> str:
    return getattr(view_class, "lookup_url_kwarg", None) or getattr(
        view_class, "lookup_field", "pk"
    )


def _walk(patterns: list[Any], prefix: str = "") -> list[tuple[str, URLPattern]]:
    found: list[tuple[str, URLPattern]] = []
    for entry in patterns:
        if isinstance(entry, URLResolver):
            found.extend(_walk(entry.url_patterns, prefix + str(entry.pattern)))
        elif isinstance(entry, URLPattern):
            found.append((prefix + str(entry.pattern), entry))
    return found


def api_routes() -> list[Route]:
    routes = []
    for pattern, entry in _walk(get_resolver().url_patterns):
        clean = pattern.replace("^", "").replace("$", "")
        if not clean.startswith(API_PREFIX):
            continue
        view_class = getattr(entry.callback, "cls", None)
        if view_class is None:
            continue
        actions = dict(getattr(entry.callback, "actions", None) or {})
        if actions:
            methods = tuple(sorted(m.upper() for m in actions))
        else:
            methods = tuple(
                m.upper()
                for m in ("get", "post", "put", "patch", "delete")
                if hasattr(view_class, m)
            )
        kwargs = tuple(a or b for a, b in _KWARG.findall(clean))
        detail = _lookup_of(view_class) in kwargs
        routes.append(
            Route(
                name=entry.name or clean,
                pattern=clean,
                view_class=view_class,
                methods=methods,
                actions=actions,
                detail=detail,
                kwargs=kwargs,
            )
        )
    return routes


# --- objects the matrices need that `make_world` does not build -------------------------------
# Model label -> "module:function" that builds one object of a world's tenant (imported lazily,
# so this module stays free of app imports). Append an entry for a new model behind a route.
OBJECT_FACTORIES: dict[str, str] = {
    "incidents.Incident": "tests.incidents.factories:incident_for_world",
    "incidents.SlaBreach": "tests.incidents.factories:incident_for_world",
    "incidents.CauseRule": "tests.incidents.factories:cause_rule_for_world",
    "incidents.NotificationChannel": "tests.incidents.factories:channel_for_world",
    "serving.Rollout": "tests.serving.factories:rollout_for_world",
    "serving.Rollback": "tests.serving.factories:rollback_for_world",
    "incidents.ChaosDrill": "tests.incidents.factories:drill_for_world",
    "incidents.DrillRun": "tests.incidents.factories:drill_run_for_world",
    "serving.VersionCheck": "tests.serving.check_factories:version_check_for_world",
}


def build_object_of(model: Any, world: Any) -> Any:
    """Build one object of `model` for `world` with its registered factory (None if none)."""
    import importlib

    spec = OBJECT_FACTORIES.get(model._meta.label)
    if spec is None:
        return None
    module, function = spec.split(":")
    return getattr(importlib.import_module(module), function)(world)


def object_of(model_label: str, world: Any) -> Any:
    """One object of `model_label` in `world`'s tenant: the first there is, else a new one."""
    from django.apps import apps

    model = apps.get_model(model_label)
    found = model.objects.filter(tenant=world.tenant).order_by("id").first()
    return found if found is not None else build_object_of(model, world)


def model_of(route: Route) -> Any:
    """The model behind a route (its view's queryset), or None for a view without one."""
    queryset = getattr(route.view_class, "queryset", None)
    return None if queryset is None else queryset.model


def kwargs_of(route: Route, world: Any) -> dict[str, Any]:
    """URL kwargs naming one of `world`'s objects (and, for nested routes, its parents)."""
    from tenants.models import Tenant

    if not route.kwargs:
        return {}
    model = model_of(route)
    assert model is not None, f"{route.view_class.__name__} must declare queryset"
    if model is Tenant:
        return {route.lookup_kwarg: getattr(world.tenant, route.view_class.lookup_field)}
    obj = model.objects.filter(tenant=world.tenant).order_by("id").first()
    assert obj is not None, f"no object of the tenant for {model.__name__}: extend make_world"
    kwargs: dict[str, Any] = {}
    if route.detail:
        field = route.view_class.lookup_field
        kwargs[route.lookup_kwarg] = getattr(obj, "pk" if field == "pk" else field)
    parents = getattr(route.view_class, "parent_lookups", {})
    for name in route.parent_kwargs:
        assert name in parents, f"{route.view_class.__name__} must map {name!r} in parent_lookups"
        kwargs[name] = getattr(obj, parents[name])
    return kwargs
