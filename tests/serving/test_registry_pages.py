"""Model registry pages: list and create, versions with status badges, register by path,
upload, the live validation row (htmx polling), roles and foreign tenants."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from serving.registry.models import Model, ModelVersion, VersionStatus
from serving.registry.tasks import validate_version
from tests.conftest import TenantWorld
from tests.serving.registry_support import checkpoint, hostile_tar, stored_files, tar_of

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def store(settings: Any, tmp_path: Path) -> Path:
    settings.ARTIFACT_STORE_DIR = tmp_path / "store"
    return settings.ARTIFACT_STORE_DIR


def _model_url(world: TenantWorld, name: str = "serving-model", **extra: Any) -> str:
    return reverse(name, kwargs={"slug": world.tenant.slug, "pk": world.model.pk, **extra})


def test_models_page_lists_and_creates(client: Any, world_a: TenantWorld) -> None:
    client.force_login(world_a.operator)
    url = reverse("serving-models", args=[world_a.tenant.slug])
    page = client.get(url)
    assert page.status_code == 200
    assert b'data-testid="models-table"' in page.content and b"assistant" in page.content
    assert b'data-testid="model-form"' in page.content
    assert f'href="{url}"'.encode() in page.content  # the nav link
    created = client.post(url, {"name": "chat-small", "task": "chat", "description": "bot"})
    model = Model.objects.get(tenant=world_a.tenant, name="chat-small")
    assert created.status_code == 302 and created["Location"] == _model_url(world_a).replace(
        str(world_a.model.pk), str(model.pk)
    )
    again = client.post(url, {"name": "chat-small", "task": "chat"})
    assert again.status_code == 200 and b"errorlist" in again.content
    assert b"A model named" in again.content
    bad = client.post(url, {"name": "no spaces", "task": "chat"})
    assert b"errorlist" in bad.content
    assert Model.objects.filter(tenant=world_a.tenant).exclude(name="served").count() == 2


def test_viewers_read_but_cannot_write(client: Any, world_a: TenantWorld, tmp_path: Path) -> None:
    client.force_login(world_a.viewer)
    url = reverse("serving-models", args=[world_a.tenant.slug])
    page = client.get(url)
    assert page.status_code == 200 and b'data-testid="model-form"' not in page.content
    assert client.post(url, {"name": "sneaky", "task": "chat"}).status_code == 403
    detail = client.get(_model_url(world_a))
    assert detail.status_code == 200 and b'data-testid="register-form"' not in detail.content
    directory = str(checkpoint(tmp_path / "c"))
    for name, data in (
        ("serving-version-register", {"label": "v2", "path": directory}),
        ("serving-version-upload", {"label": "v2"}),
        ("serving-model-delete", {}),
    ):
        assert client.post(_model_url(world_a, name), data).status_code == 403
    delete = _model_url(world_a, "serving-version-delete", version_pk=world_a.version.pk)
    assert client.post(delete).status_code == 403
    assert ModelVersion.objects.filter(model=world_a.model).count() == 1
    assert not Model.objects.filter(name="sneaky").exists()


def test_register_by_path_shows_progress_then_the_result(
    client: Any, world_a: TenantWorld, tmp_path: Path, django_capture_on_commit_callbacks: Any
) -> None:
    client.force_login(world_a.owner)
    page = client.get(_model_url(world_a))
    assert b'data-status="registered"' in page.content
    assert b'hx-trigger="every 1s"' in page.content  # a version not yet final is polled
    directory = checkpoint(tmp_path / "c")
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(
            _model_url(world_a, "serving-version-register"), {"label": "v2", "path": str(directory)}
        )
    assert response.status_code == 302
    version = ModelVersion.objects.get(model=world_a.model, label="v2")
    assert version.status == VersionStatus.READY
    row = client.get(_model_url(world_a, "serving-version-row", version_pk=version.pk))
    assert row.status_code == 200 and row.content.lstrip().startswith(b"<tr")
    assert b'class="badge ready"' in row.content and b"hx-trigger" not in row.content
    assert b"LlamaForCausalLM" in row.content and b"forward" in row.content
    # A version mid-validation: its row shows the steps so far and keeps polling.
    ModelVersion.objects.filter(pk=world_a.version.pk).update(
        status=VersionStatus.VALIDATING,
        validation_steps=[
            {"step": "checksum", "state": "ok", "seconds": 0.01},
            {"step": "config", "state": "running", "seconds": None},
        ],
    )
    row = client.get(_model_url(world_a, "serving-version-row", version_pk=world_a.version.pk))
    assert b'hx-trigger="every 1s"' in row.content and b'class="badge validating"' in row.content
    assert b'class="step running"' in row.content and b'class="step ok"' in row.content


def test_register_form_names_the_bad_field(
    client: Any, world_a: TenantWorld, tmp_path: Path
) -> None:
    client.force_login(world_a.owner)
    response = client.post(
        _model_url(world_a, "serving-version-register"), {"label": "v2", "path": "relative"}
    )
    assert response.status_code == 200
    assert b"errorlist" in response.content and b"is not an absolute path" in response.content
    assert not ModelVersion.objects.filter(label="v2").exists()


def test_a_failed_version_shows_its_reason(
    client: Any, world_a: TenantWorld, tmp_path: Path, django_capture_on_commit_callbacks: Any
) -> None:
    client.force_login(world_a.owner)
    directory = checkpoint(tmp_path / "c", "architecture")
    with django_capture_on_commit_callbacks(execute=True):
        client.post(
            _model_url(world_a, "serving-version-register"), {"label": "v2", "path": str(directory)}
        )
    page = client.get(_model_url(world_a))
    assert b'class="badge failed"' in page.content
    assert b'data-testid="failure-reason">unsupported architecture' in page.content


def test_upload_form_stores_or_refuses(
    client: Any, world_a: TenantWorld, tmp_path: Path, settings: Any
) -> None:
    client.force_login(world_a.operator)
    directory = checkpoint(tmp_path / "c")
    url = _model_url(world_a, "serving-version-upload")
    archive = SimpleUploadedFile("model.tar.gz", tar_of(directory, top="tiny", gz=True))
    response = client.post(url, {"label": "v2", "archive": archive})
    assert response.status_code == 302
    version = ModelVersion.objects.get(model=world_a.model, label="v2")
    assert version.source == "upload" and version.artifact_uri.startswith("store://")
    assert len(stored_files(Path(settings.ARTIFACT_STORE_DIR))) == 3
    validate_version(version.pk)
    assert ModelVersion.objects.get(pk=version.pk).status == VersionStatus.READY

    hostile = SimpleUploadedFile("evil.tar", hostile_tar(directory, "traversal"))
    followed = client.post(url, {"label": "v3", "archive": hostile}, follow=True)
    assert b"v3 failed: archive member &#x27;../evil&#x27; points outside" in followed.content
    assert ModelVersion.objects.get(label="v3").status == VersionStatus.FAILED
    assert len(stored_files(Path(settings.ARTIFACT_STORE_DIR))) == 3

    settings.ARTIFACT_UPLOAD_MAX_BYTES = 1000
    big = SimpleUploadedFile("big.tar", tar_of(directory))
    refused = client.post(url, {"label": "v4", "archive": big})
    assert refused.status_code == 200 and b"larger than the limit of 1000 bytes" in refused.content
    assert not ModelVersion.objects.filter(label="v4").exists()
    assert len(stored_files(Path(settings.ARTIFACT_STORE_DIR))) == 3


def test_description_and_deletes_from_the_pages(
    client: Any, world_a: TenantWorld, django_capture_on_commit_callbacks: Any
) -> None:
    client.force_login(world_a.owner)
    assert client.post(_model_url(world_a), {"description": "new words"}).status_code == 302
    assert b"new words" in client.get(_model_url(world_a)).content
    delete = _model_url(world_a, "serving-version-delete", version_pk=world_a.version.pk)
    assert client.post(delete).status_code == 302
    assert not ModelVersion.objects.filter(pk=world_a.version.pk).exists()
    response = client.post(_model_url(world_a, "serving-model-delete"))
    assert response["Location"] == reverse("serving-models", args=[world_a.tenant.slug])
    assert not Model.objects.filter(pk=world_a.model.pk).exists()


def test_pages_of_another_tenant_are_404(
    client: Any, world_a: TenantWorld, world_b: TenantWorld
) -> None:
    client.force_login(world_b.owner)
    a = world_a.tenant.slug
    b = world_b.tenant.slug
    model, version = world_a.model.pk, world_a.version.pk
    assert client.get(reverse("serving-models", args=[a])).status_code == 404
    for slug in (a, b):  # A's slug, or B's own slug with A's ids: the same 404
        kwargs = {"slug": slug, "pk": model}
        assert client.get(reverse("serving-model", kwargs=kwargs)).status_code == 404
        row = reverse("serving-version-row", kwargs={**kwargs, "version_pk": version})
        assert client.get(row).status_code == 404
        for name in ("serving-model-delete", "serving-version-register", "serving-version-upload"):
            assert client.post(reverse(name, kwargs=kwargs), {"label": "x"}).status_code == 404
        delete = reverse("serving-version-delete", kwargs={**kwargs, "version_pk": version})
        assert client.post(delete).status_code == 404
    # B's own model with A's version id: also a 404.
    row = reverse(
        "serving-version-row", kwargs={"slug": b, "pk": world_b.model.pk, "version_pk": version}
    )
    assert client.get(row).status_code == 404
    assert ModelVersion.objects.filter(pk=version).exists()
    assert Model.objects.filter(pk=model).exists()
