"""Convention tests: they keep the architecture honest as the code grows."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.apps import apps
from django.conf import settings
from django.db import models

from portal.celery import QUEUES
from portal.celery import app as celery_app
from tenants.api.base import TenantScopedMixin
from tenants.models import Tenant
from tenants.scoping import TenantOwned
from tests.api_routes import api_routes
from tests.support.ast_scan import ROOT, imports_of, product_files

PROJECT_APPS = ("portal", "tenants", "serving", "incidents")

# API views that are deliberately not tenant-scoped, each with its reason.
UNSCOPED_VIEWS = {
    "SpectacularAPIView": "the OpenAPI schema is public",
    "SpectacularSwaggerView": "the docs page is public",
    "SpectacularRedocView": "the docs page is public",
    "SignupView": "a visitor has no tenant yet",
    "InvitationAcceptView": "the invitee is not a member yet",
}


def _project_models() -> list[type[models.Model]]:
    return [m for m in apps.get_models() if m._meta.app_label in PROJECT_APPS]


def test_every_tenant_owned_model_uses_the_base() -> None:
    for model in _project_models():
        if model is Tenant:
            continue
        has_tenant_fk = any(
            isinstance(f, models.ForeignKey) and f.related_model is Tenant
            for f in model._meta.fields
        )
        if has_tenant_fk:
            assert issubclass(model, TenantOwned), f"{model.__name__} must inherit TenantOwned"
            field = model._meta.get_field("tenant")
            assert not field.null and field.db_index, model.__name__
            assert field.remote_field.on_delete is models.PROTECT, model.__name__


def test_unique_constraints_of_tenant_owned_models_include_the_tenant() -> None:
    for model in _project_models():
        if not issubclass(model, TenantOwned):
            continue
        for constraint in model._meta.constraints:
            if isinstance(constraint, models.UniqueConstraint):
                assert "tenant" in constraint.fields, f"{model.__name__}.{constraint.name}"
        for together in model._meta.unique_together:
            assert "tenant" in together, model.__name__


def test_every_api_view_uses_the_scoped_base() -> None:
    for route in api_routes():
        name = route.view_class.__name__
        if name in UNSCOPED_VIEWS:
            assert not route.tenant_scoped
            continue
        assert issubclass(route.view_class, TenantScopedMixin), f"{name} ({route.pattern})"


def test_every_task_declares_a_known_queue_and_limits() -> None:
    celery_app.loader.import_default_modules()
    ours = {n: t for n, t in celery_app.tasks.items() if n.split(".")[0] in PROJECT_APPS}
    assert ours, "no project tasks registered"
    for name, task in ours.items():
        assert task.queue in QUEUES, f"{name} has no declared queue"
        assert task.time_limit and task.soft_time_limit, f"{name} needs time limits"
        if task.acks_late:
            assert task.reject_on_worker_lost, name


def test_every_beat_entry_names_a_real_task() -> None:
    celery_app.loader.import_default_modules()
    for entry, spec in settings.CELERY_BEAT_SCHEDULE.items():
        assert spec["task"] in celery_app.tasks, f"beat entry {entry} names {spec['task']}"


def _imports(path: Path) -> set[str]:
    """Top-level package of every import, lazy, relative and importlib ones included."""
    return {module.split(".")[0] for _, module in imports_of(path)}


def test_the_import_scanner_sees_lazy_relative_and_importlib_imports(tmp_path: Path) -> None:
    """The rules below are only as good as what the scanner sees."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import importlib\n"
        "def f():\n"
        "    from incidents import services\n"
        "    from . import rollouts\n"
        "    from ..deployments import models\n"
        "    return importlib.import_module('incidents.breaches')\n"
    )
    seen = {module for _, module in imports_of(probe, "serving.ops.probe")}
    assert {
        "incidents.services",
        "serving.ops.rollouts",
        "serving.deployments.models",
        "incidents.breaches",
    } <= seen


@pytest.mark.parametrize(
    "room",
    [
        "serving/dataplane",
        "serving/engine",
        "serving/slo",
        "serving/telemetry/providers",
        "serving/control",
    ],
)
def test_data_plane_and_engine_import_no_django(room: str) -> None:
    """What runs inside Ray: the data plane, the engine, and the GPU providers (the node
    samplers of GPU_AGENT_MODE=ray read them there)."""
    forbidden = {"django", "rest_framework", "channels", "celery", "portal", "tenants", "incidents"}
    for path in product_files(room):
        rel = path.relative_to(ROOT).as_posix()
        assert not _imports(path) & forbidden, f"{rel} imports {_imports(path) & forbidden}"
        for line, module in imports_of(path):
            if module.startswith("serving."):
                assert module.startswith(
                    (
                        "serving.dataplane",
                        "serving.engine",
                        "serving.slo",
                        "serving.telemetry.providers",
                        "serving.control",
                    )
                ), f"{rel}:{line} imports {module}"


@pytest.mark.parametrize(
    ("module", "allowed_room"), [("ray", "serving/control"), ("pynvml", "serving/telemetry")]
)
def test_hardware_and_ray_imports_stay_in_their_room(module: str, allowed_room: str) -> None:
    for path in product_files(*PROJECT_APPS):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(("serving/dataplane", "serving/engine")) and module == "ray":
            continue  # data-plane code runs inside Ray and may import it
        if module in _imports(path):
            assert rel.startswith(allowed_room), f"{rel} imports {module}"
