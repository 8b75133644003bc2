"""Apply a declarative Serve config so that one bad application never blocks the others.

Serve takes the whole multi-application config or nothing: one application it refuses (a
400) would stall every tenant's deploys, rollbacks and key revocations. The config is
therefore built from *units* (a portal deployment's applications, a shared pool's, the GPU
samplers'), each checked locally against Serve's own schema before it is sent. If Serve still
refuses the PUT, the changed units are split in halves and applied over the last config Serve
accepted (`applied`), until the units Serve refuses are found: they keep their last good
applications (or stay absent), every other change lands. One PUT when nothing is wrong,
O(k log n) when k of n changed units are bad. Django-free.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from serving.control.compile import Placement, assemble
from serving.control.serve_api import ServeApiClient, ServeApiError

GPU_UNIT = "gpu-nodes"
# Serve answers 400 for a config it will not take (schema, a deploy_apps error); anything else
# (unreachable, 5xx) is not about one application: the reconcile task retries it whole.
REFUSED_STATUSES = frozenset({400, 422})


def deployment_unit(deployment_id: int) -> str:
    return f"deployment:{deployment_id}"


def pool_unit(name: str) -> str:
    return f"pool:{name}"


FOREIGN = "foreign:"


def foreign_unit(app: str) -> str:
    """Another owner's application on the same Serve instance, carried as Serve reports it."""
    return f"{FOREIGN}{app}"


def foreign_declarative(details: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Applications the portal does not own that were deployed declaratively (Serve's REST
    API), with the config they were deployed with. A declarative PUT deletes every
    declarative application it does not name, so the portal's PUT names these, unchanged;
    imperative ones (`serve.run`) Serve leaves alone."""
    from serving.control.names import BadName, parse_app

    out: dict[str, dict[str, Any]] = {}
    for name, raw in (details.get("applications") or {}).items():
        try:
            parse_app(str(name))
            continue  # the portal's
        except BadName:
            pass
        config = raw.get("deployed_app_config") if isinstance(raw, dict) else None
        if str(raw.get("source", "")).lower() == "declarative" and isinstance(config, dict):
            out[str(name)] = config
    return out


@dataclass
class Unit:
    order: str  # sort key: GPU samplers, then pools, then deployments by application name
    apps: list[dict[str, Any]]

    def as_json(self) -> dict[str, Any]:
        return {"order": self.order, "apps": self.apps}


@dataclass
class Plan:
    """The desired units, and those refused before anything was sent (with the reason)."""

    units: dict[str, Unit] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    http_host: str = "127.0.0.1"
    http_port: int = 8001
    runtime_env: dict[str, Any] | None = None
    placement: Placement = field(default_factory=Placement)

    def add(self, key: str, order: str, build: Callable[[], list[dict[str, Any]]]) -> None:
        """Compile one unit; a unit that cannot be compiled is refused, not raised."""
        try:
            self.units[key] = Unit(order, build())
        except Exception as exc:  # one tenant's bad spec must not stop the others' compile
            self.refused[key] = f"{type(exc).__name__}: {exc}"[:2000]

    def config(self, units: dict[str, Unit]) -> dict[str, Any]:
        ordered = sorted(units.items(), key=_order)
        applications = [app for key, u in ordered if not key.startswith(FOREIGN) for app in u.apps]
        config = assemble(
            applications,
            http_host=self.http_host,
            http_port=self.http_port,
            runtime_env=self.runtime_env,
            placement=self.placement,
        )
        # Another owner's applications go back exactly as Serve reported them: no restart.
        config["applications"] += [
            app for key, u in ordered if key.startswith(FOREIGN) for app in u.apps
        ]
        return config


def _order(item: tuple[str, Unit]) -> tuple[str, str]:
    return item[1].order, item[0]


def units_from_json(raw: Any) -> dict[str, Unit]:
    if not isinstance(raw, dict):
        return {}
    return {
        key: Unit(str(value.get("order", "")), list(value.get("apps") or []))
        for key, value in raw.items()
        if isinstance(value, dict)
    }


def schema_errors(plan: Plan, unit: Unit) -> str:
    """Serve's own schema check of a unit's applications, without sending them: '' if fine."""
    from pydantic import ValidationError
    from ray.serve.schema import ServeApplicationSchema

    config = plan.config({"unit": unit})
    for app in config["applications"]:
        try:
            ServeApplicationSchema.model_validate(app)
        except ValidationError as exc:
            lines = [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5]]
            return f"Serve's schema refuses application {app.get('name')!r}: " + "; ".join(lines)
    return ""


@dataclass
class Outcome:
    applied: dict[str, Unit]  # what Serve now runs, unit by unit
    refused: dict[str, str]  # unit -> why (compile, schema or Serve's answer)
    puts: int = 0


def apply_isolating(
    client: ServeApiClient, plan: Plan, applied: dict[str, Unit], *, force: bool = False
) -> Outcome:
    """PUT the plan; isolate the units Serve refuses. Raises ServeApiError when Serve is
    unreachable or fails for a reason that is no application's (the caller retries)."""
    refused = dict(plan.refused)
    desired = dict(plan.units)
    for key, unit in list(desired.items()):
        if applied.get(key) != unit:
            reason = schema_errors(plan, unit)
            if reason:
                refused[key] = reason
                del desired[key]
    # A refused unit keeps what Serve accepted last; a unit gone from the plan is removed.
    changed = sorted(
        key
        for key in set(desired) | set(applied)
        if key not in refused and desired.get(key) != applied.get(key)
    )
    current = dict(applied)
    outcome = Outcome(applied=current, refused=refused)

    def trial(keys: list[str]) -> dict[str, Unit]:
        units = dict(current)
        for key in keys:
            if key in desired:
                units[key] = desired[key]
            else:
                units.pop(key, None)
        return units

    def solve(keys: list[str]) -> None:
        units = trial(keys)
        try:
            outcome.puts += 1
            client.put(plan.config(units))
        except ServeApiError as exc:
            if exc.status not in REFUSED_STATUSES:
                raise
            if len(keys) <= 1:
                if keys:
                    refused[keys[0]] = f"Serve refused it: {exc.serve_message or exc}"[:2000]
                    return
                raise  # the last accepted config itself is refused: nothing to isolate
            middle = len(keys) // 2
            solve(keys[:middle])
            solve(keys[middle:])
            return
        current.clear()
        current.update(units)

    if changed or force or not applied:
        solve(changed)
    return outcome
