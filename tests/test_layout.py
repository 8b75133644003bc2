"""Layout tests: the rules of ../docs/architecture.md ("The map") as tests.

Each rule scans the product code (portal/, tenants/, serving/, incidents/; migrations aside) with
the AST, lazy imports and `importlib.import_module("...")` strings included. Where a rule has
exceptions they sit in an allowlist next to it, each with its reason; an allowlist may only
shrink: an entry whose file no longer breaks the rule fails the test until it is removed.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from portal.celery import app as celery_app
from portal.exceptions import PortalError
from tests.api_routes import api_routes, build_object_of, kwargs_of, model_of
from tests.support.ast_scan import (
    PRODUCT,
    ROOT,
    absolute_module,
    imports_of,
    product_files,
    rel,
    tree_of,
    within,
)
from tests.support.worlds import TenantWorld


# --- 1. serving never imports incidents -----------------------------------------------------
def test_serving_never_imports_incidents() -> None:
    """serving tells incidents what happened through the events port (serving.ops.events);
    incidents subscribes in its AppConfig.ready(). A lazy import would hide a cycle."""
    found = [
        f"{rel(path)}:{line} imports {module}"
        for path in product_files()
        if rel(path).startswith("serving/")
        for line, module in imports_of(path)
        if within(module, "incidents")
    ]
    assert not found, found


# --- 2. serving.models is Django's aggregator only ------------------------------------------
def test_nobody_imports_the_serving_models_aggregator() -> None:
    """Django imports serving.models; code imports the room's own models module
    (serving.deployments.models, serving.ops.models, ...), so the rooms' edges stay visible."""
    found = [
        f"{rel(path)}:{line}"
        for path in [
            *product_files(),
            *(ROOT / "tests").rglob("*.py"),
            *(ROOT / "bench").rglob("*.py"),
        ]
        if rel(path) != "serving/models.py"
        for line, module in imports_of(path)
        if module == "serving.models" or module.startswith("serving.models.")
    ]
    assert not found, found


# --- 3. writes only in services -------------------------------------------------------------
_QUERYSET_STEPS = {"objects", "filter", "exclude", "all", "select_for_update", "order_by", "using"}
_MANAGER_WRITES = {
    "create",
    "get_or_create",
    "update_or_create",
    "bulk_create",
    "bulk_update",
    "update",
    "delete",
}


def _call_chain(node: ast.AST) -> list[str]:
    steps: list[str] = []
    while isinstance(node, ast.Call | ast.Attribute):
        if isinstance(node, ast.Call):
            node = node.func
        else:
            steps.append(node.attr)
            node = node.value
    return steps


def orm_writes(path: Path) -> list[int]:
    """Lines that write rows: `<Model>.objects....create/update/delete(...)`, `.save(...)` and
    argument-less `.delete()` (a model instance; Redis and dict deletes take arguments)."""
    lines = []
    for node in ast.walk(tree_of(path)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        attr = node.func.attr
        if (
            (attr in _MANAGER_WRITES and set(_call_chain(node.func.value)) & _QUERYSET_STEPS)
            or attr == "save"
            or (attr == "delete" and not node.args and not node.keywords)
        ):
            lines.append(node.lineno)
    return sorted(lines)


def _is_write_home(path: Path) -> bool:
    parts = path.relative_to(ROOT).parts
    return (
        path.name.startswith("services")
        or "services" in parts
        or path.name in ("reconcile.py", "sli_store.py")
    )


# path -> why it writes outside a services module. Shrink only.
WRITES_OUTSIDE_SERVICES: dict[str, str] = {
    "portal/management/commands/demo_tenant.py": "resets the demo user's password (a CLI "
    "command over Django's own User model, no business rule)",
    "serving/ops/contracts.py": "the contract services of the ops room (contract_apply)",
    "serving/ops/rollouts.py": "the rollout services (rollout_start/advance/promote/abort)",
    "serving/ops/rollbacks.py": "the rollback services (rollback_start, the executor's steps)",
    "serving/ops/health/slots.py": "the health tick records the probe state of its deployments",
    "serving/engine/testing.py": "saves a tokenizer file (not a row)",
    "serving/deployments/models.py": "Model.save() override calls super().save()",
    "incidents/models.py": "Model.save() override calls super().save()",
    "incidents/notifications/delivery.py": "the delivery services (attempts, retries, dead "
    "letters) of the notifications room",
    "incidents/drills/base.py": "the drill engine records its run events",
    "incidents/drills/engine.py": "the drill engine advances its own runs",
    "incidents/drills/faults/base.py": "the drill faults record their own events",
}


def test_writes_only_in_services() -> None:
    outside = {
        rel(path): lines
        for path in product_files()
        if not _is_write_home(path) and (lines := orm_writes(path))
    }
    unexplained = {
        path: lines for path, lines in outside.items() if path not in WRITES_OUTSIDE_SERVICES
    }
    assert not unexplained, f"rows are written outside services: {unexplained}"
    stale = sorted(set(WRITES_OUTSIDE_SERVICES) - set(outside))
    assert not stale, f"no longer writes outside services, drop from the allowlist: {stale}"


# --- 4. services are keyword-only -----------------------------------------------------------
# "path:function" -> why it takes positional parameters. Shrink only.
POSITIONAL_SERVICES: dict[str, str] = {}


def _public_functions(path: Path) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in tree_of(path).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith(
            "_"
        ):
            yield node


def test_services_are_keyword_only() -> None:
    positional = {
        f"{rel(path)}:{fn.name}"
        for path in product_files()
        if path.name.startswith("services") or "services" in path.relative_to(ROOT).parts
        for fn in _public_functions(path)
        if fn.args.posonlyargs or fn.args.args
    }
    assert positional <= set(POSITIONAL_SERVICES), sorted(positional - set(POSITIONAL_SERVICES))
    stale = sorted(set(POSITIONAL_SERVICES) - positional)
    assert not stale, f"now keyword-only, drop from the allowlist: {stale}"


# --- 5. no private names across modules -----------------------------------------------------
# "importing path:imported module._name" -> why. Shrink only.
PRIVATE_IMPORTS: dict[str, str] = {}


def test_no_private_cross_module_imports() -> None:
    """A name that starts with `_` is the module's own; a sibling that needs it gets a public
    name, so a change to a private helper never breaks another module unseen."""
    found = set()
    for path in product_files():
        for node in ast.walk(tree_of(path)):
            if not isinstance(node, ast.ImportFrom):
                continue
            module = absolute_module(path, node)
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.add(f"{rel(path)}:{module}.{alias.name}")
    assert found <= set(PRIVATE_IMPORTS), sorted(found - set(PRIVATE_IMPORTS))
    stale = sorted(set(PRIVATE_IMPORTS) - found)
    assert not stale, f"no longer imported, drop from the allowlist: {stale}"


# --- 6. tasks have explicit, stable names ---------------------------------------------------
def _project_tasks() -> dict[str, object]:
    celery_app.loader.import_default_modules()
    return {n: t for n, t in celery_app.tasks.items() if n.split(".")[0] in PRODUCT}


def test_tasks_have_explicit_stable_names() -> None:
    """`<app>.<function>`: a name that does not follow the file, so moving a module never
    orphans queued messages, beat entries or stored drill schedules."""
    for name, task in _project_tasks().items():
        function = task.run.__name__  # type: ignore[attr-defined]
        app_label = task.run.__module__.split(".")[0]  # type: ignore[attr-defined]
        assert name == f"{app_label}.{function}", f"{name} is {task.run.__module__}.{function}"  # type: ignore[attr-defined]


def _named_tasks_in_code() -> set[tuple[str, str]]:
    """Every literal `"task": "<name>"` in the product code and in the migrations (beat
    entries, PeriodicTask rows written by services and data migrations)."""
    found = set()
    paths = [*product_files(), *(ROOT / "incidents" / "migrations").glob("*.py")]
    for path in paths:
        for node in ast.walk(tree_of(path)):
            if isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values, strict=True):
                    if (
                        isinstance(key, ast.Constant)
                        and key.value == "task"
                        and isinstance(value, ast.Constant)
                        and isinstance(value.value, str)
                    ):
                        found.add((rel(path), value.value))
    return found


def test_every_periodic_task_and_beat_entry_names_a_registered_task() -> None:
    registered = set(_project_tasks())
    for entry, spec in settings.CELERY_BEAT_SCHEDULE.items():
        assert spec["task"] in registered, f"beat entry {entry} names {spec['task']}"
    named = _named_tasks_in_code()
    assert any(name == "incidents.start_scheduled_drill" for _, name in named)
    for path, name in named:
        if "/migrations/" in path and name.count(".") > 1:
            continue  # the old, file-derived name a data migration rewrites
        assert name in registered, f"{path} names the task {name!r}, which is not registered"


@pytest.mark.django_db
def test_every_stored_periodic_task_names_a_registered_task() -> None:
    from django_celery_beat.models import PeriodicTask

    registered = set(_project_tasks()) | {"celery.backend_cleanup"}
    for row in PeriodicTask.objects.all():
        assert row.task in registered, f"PeriodicTask {row.name} names {row.task}"


# --- 7. every list route has a query budget -------------------------------------------------
# route name -> the most queries one GET of the list may take once the client's token and
# membership are cached (the first GET takes one more). Measured with one object and again with
# two where the factory can build a second: the count must not grow with the rows (an N+1
# shows as one query more).
QUERY_BUDGETS: dict[str, int] = {
    "audit-event-list": 4,
    "breach-list": 4,
    "cause-rule-list": 4,
    "deployment-capacity": 3,  # no rows: Ray's accounting (cached), not a table
    "deployment-list": 4,
    "drill-faults": 3,  # the catalogue is code: no page, no count
    "drill-list": 4,
    "drill-run-list": 4,
    "incident-list": 4,
    "incident-analytics": 7,  # weeks, timings (onsets as subqueries), deployments, SLI sums
    "inference-key-list": 4,
    "invitation-list": 4,
    "member-list": 4,
    "model-list": 4,
    "model-version-list": 5,  # + the parent model of the nested route
    "notification-channel-list": 4,
    "quota-list": 4,
    "rollback-list": 4,
    "rollout-list": 5,  # + the parent deployment of the nested route
    "tenant-list": 4,
    "token-list": 4,
}


def list_routes() -> list[str]:
    return sorted(
        {r.name for r in api_routes() if r.tenant_scoped and "GET" in r.methods and not r.detail}
    )


def test_every_list_route_has_a_query_budget() -> None:
    routes = set(list_routes())
    assert routes - set(QUERY_BUDGETS) == set(), sorted(routes - set(QUERY_BUDGETS))
    assert set(QUERY_BUDGETS) - routes == set(), sorted(set(QUERY_BUDGETS) - routes)


def _second_object(model: Any, world: TenantWorld) -> bool:
    """Build one more row of `model` where its factory can (some build a fixed name or key)."""
    try:
        with transaction.atomic():
            return build_object_of(model, world) is not None
    except (PortalError, IntegrityError):
        return False


@pytest.mark.django_db
@pytest.mark.parametrize("name", list_routes())
def test_a_list_route_stays_within_its_query_budget(
    name: str, world_a: TenantWorld, django_assert_max_num_queries: Any
) -> None:
    route = next(r for r in api_routes() if r.name == name and not r.detail)
    model = model_of(route)
    owned = model is not None and any(f.name == "tenant" for f in model._meta.fields)
    if owned and not model.objects.filter(tenant=world_a.tenant).exists():
        build_object_of(model, world_a)  # a list with rows: an empty page skips its fetches
    url = reverse(name, kwargs=kwargs_of(route, world_a))
    client = world_a.client("owner")
    client.get(url)  # warm the per-process caches (token, membership) like a live client

    def count() -> int:
        with CaptureQueriesContext(connection) as queries:
            response = client.get(url)
        assert response.status_code == 200, (url, response.status_code, response.content[:300])
        return len(queries)

    one = count()
    assert one <= QUERY_BUDGETS[name], f"{name}: {one} queries, budget {QUERY_BUDGETS[name]}"
    if owned and _second_object(model, world_a):
        assert count() == one, f"{name}: one more row costs more queries (an N+1)"


# --- 8. module size budget ------------------------------------------------------------------
MAX_LINES = 400
# path -> why it is longer than MAX_LINES. Shrink only: an entry must still be over the line.
LONG_MODULES: dict[str, str] = {
    "portal/settings.py": "one settings module, read top to bottom by operators; each block "
    "is one concern (database, Redis, Celery queues, Ray, limits)",
}


def test_module_size_budget() -> None:
    sizes = {rel(path): len(path.read_text().splitlines()) for path in product_files()}
    over = {path: n for path, n in sizes.items() if n > MAX_LINES and path not in LONG_MODULES}
    assert not over, f"modules over {MAX_LINES} lines (split them by capability): {over}"
    stale = sorted(path for path in LONG_MODULES if sizes.get(path, 0) <= MAX_LINES)
    assert not stale, f"now within budget, drop from the allowlist: {stale}"


# --- 8b. the formatter formats everything ---------------------------------------------------
# path -> why the formatter must leave a statement as written (true tables only). Shrink only.
FORMATTER_SKIPS: dict[str, str] = {}
_SKIP = re.compile(r"#\s*fmt:\s*(skip|off)\b")


def test_product_code_has_no_formatter_skips() -> None:
    """`ruff format` owns the layout: hand-aligned statements drift and hide long lines."""
    found = {
        rel(path) for path in product_files() if _SKIP.search(path.read_text(encoding="utf-8"))
    }
    assert found <= set(FORMATTER_SKIPS), sorted(found - set(FORMATTER_SKIPS))
    stale = sorted(set(FORMATTER_SKIPS) - found)
    assert not stale, f"no formatter skip left, drop from the allowlist: {stale}"


# --- 9. channel events have handlers, groups have one shape ---------------------------------
_EVENT_TYPE = re.compile(r"^[a-z]+\.[a-z_]+$")
_ASGI_TYPES = ("http.", "websocket.", "lifespan.")


def channel_event_types() -> dict[str, str]:
    """Every `"<app>.<event>"` a module sends over the channel layer: the `"type"` of a message
    dict literal in a module that calls group_send, and module constants named `*EVENT`."""
    found: dict[str, str] = {}
    for path in product_files():
        tree = tree_of(path)
        source = path.read_text()
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id.endswith("EVENT")
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
            ):
                found[node.value.value] = rel(path)
            elif isinstance(node, ast.Dict) and "group_send" in source:
                for key, value in zip(node.keys, node.values, strict=True):
                    if (
                        isinstance(key, ast.Constant)
                        and key.value == "type"
                        and isinstance(value, ast.Constant)
                        and isinstance(value.value, str)
                        and _EVENT_TYPE.match(value.value)
                        and not value.value.startswith(_ASGI_TYPES)
                    ):
                        found[value.value] = rel(path)
    return found


def consumer_handlers() -> set[str]:
    handlers = set()
    for path in product_files():
        for node in ast.walk(tree_of(path)):
            if isinstance(node, ast.ClassDef) and any(
                "Consumer" in ast.unparse(base) for base in node.bases
            ):
                handlers |= {
                    item.name
                    for item in node.body
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                }
    return handlers


def test_channel_events_have_handlers() -> None:
    events = channel_event_types()
    assert {"gpu.sample", "incident.updated", "membership.removed"} <= set(events)
    handlers = consumer_handlers()
    missing = {
        event: path for event, path in events.items() if event.replace(".", "_") not in handlers
    }
    assert not missing, f"channel events without a consumer handler: {missing}"


_GROUP = re.compile(r"^(tenant-\{\w+\}\.[a-z]+(-\{\w+\})?|node-\{\w+\}\.[a-z]+)$")


def test_channel_groups_have_one_shape() -> None:
    """Groups are `tenant-<id>.<stream>` (a member's own: `tenant-<id>.user-<id>`); the staff
    node streams are `node-<name>.<stream>`. Every function named `*_group` returns one."""
    seen = 0
    for path in product_files():
        for node in ast.walk(tree_of(path)):
            if not (isinstance(node, ast.FunctionDef) and node.name.endswith("_group")):
                continue
            for ret in ast.walk(node):
                if isinstance(ret, ast.Return) and isinstance(ret.value, ast.JoinedStr):
                    shape = ast.unparse(ret.value)[2:-1]
                    shape = re.sub(r"\{[^}]*\}", "{x}", shape)
                    assert _GROUP.match(shape), f"{rel(path)}:{node.name} builds {shape!r}"
                    seen += 1
    assert seen >= 3
