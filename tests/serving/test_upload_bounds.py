"""Uploads that cost far more than their size: absurd configs and headers fail before anything
is built, archives are charged their unpacked size against the tenant's storage quota before a
byte is extracted, failed versions' files are deleted, and a checkpoint that keeps killing the
validating worker is refused instead of being redelivered forever."""

from __future__ import annotations

import io
import json
import tarfile
import threading
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.urls import reverse

import serving.engine.checkpoint as checkpoint_module
import serving.engine.model as model_module
from portal.exceptions import QuotaExceeded
from serving.engine.checkpoint import validate_checkpoint
from serving.engine.config import CheckpointError, human_bytes
from serving.engine.testing import write_tiny_checkpoint
from serving.registry import artifacts, selectors, services
from serving.registry.models import ArtifactSource, ModelVersion, VersionStatus
from serving.registry.tasks import validate_version
from tenants import services as tenant_services
from tenants.actors import Actor
from tenants.models import Quota
from tests.conftest import TenantWorld, make_world
from tests.serving.registry_support import checkpoint, stored_files, tar_of

MiB = 1 << 20


@pytest.fixture(autouse=True)
def store(settings: Any, tmp_path: Path) -> Path:
    settings.ARTIFACT_STORE_DIR = tmp_path / "store"
    return Path(settings.ARTIFACT_STORE_DIR)


def _rewrite_config(directory: Path, **changes: Any) -> Path:
    path = directory / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    return directory


def _refuse(what: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"{what} was called before the config was bounded")

    return refuse


@pytest.fixture
def forbid_building(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Once called, whatever builds memory sized by the config (the expected-name table,
    tensor loads, the model with its RoPE tables, any torch factory) fails the test."""

    def forbid() -> None:
        monkeypatch.setattr(checkpoint_module, "expected_shapes", _refuse("expected_shapes"))
        monkeypatch.setattr(checkpoint_module, "safe_open", _refuse("safe_open"))
        monkeypatch.setattr(model_module.LlamaModel, "__init__", _refuse("LlamaModel"))
        for name in ("empty", "zeros", "ones", "full", "arange", "randn", "tensor", "outer"):
            monkeypatch.setattr(torch, name, _refuse(f"torch.{name}"))

    return forbid


def _peak_python_bytes(run: Callable[[], Any]) -> int:
    tracemalloc.start()
    try:
        run()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


# A 70B-class model: every field is within its own bound, the whole is not.
_HUGE_BUT_PLAUSIBLE = {
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
}


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        (
            {"max_position_embeddings": 10_000_000_000},
            "max_position_embeddings",
            "config.json: max_position_embeddings = 10000000000 exceeds the limit 131072",
        ),
        (
            {"vocab_size": 1_000_000_000},
            "vocab_size",
            "config.json: vocab_size = 1000000000 exceeds the limit 1048576",
        ),
        (
            {"hidden_size": 40_000_000},
            "hidden_size",
            "config.json: hidden_size = 40000000 exceeds the limit 65536",
        ),
        (
            {"num_hidden_layers": 1_000_000_000},
            "num_hidden_layers",
            "config.json: num_hidden_layers = 1000000000 exceeds the limit 512",
        ),
        (
            {"intermediate_size": 10**12},
            "intermediate_size",
            "config.json: intermediate_size = 1000000000000 exceeds the limit 262144",
        ),
        (
            {"num_attention_heads": 4096, "num_key_value_heads": 4096},
            "num_attention_heads",
            "config.json: num_attention_heads = 4096 exceeds the limit 1024",
        ),
        (
            {"head_dim": 1 << 20},
            "head_dim",
            "config.json: head_dim = 1048576 exceeds the limit 1024",
        ),
        (_HUGE_BUT_PLAUSIBLE, "parameters", "to validate, over the limit of 2.0 GiB"),
    ],
)
def test_absurd_config_fields_fail_naming_the_field_before_anything_is_built(
    changes: dict[str, Any],
    field: str,
    message: str,
    tmp_path: Path,
    forbid_building: Callable[[], None],
) -> None:
    directory = _rewrite_config(write_tiny_checkpoint(tmp_path / "c"), **changes)
    forbid_building()
    steps: list[str] = []
    caught: list[CheckpointError] = []

    def run() -> None:
        with pytest.raises(CheckpointError) as exc:
            validate_checkpoint(directory, progress=steps.append)
        caught.append(exc.value)

    peak = _peak_python_bytes(run)
    assert message in caught[0].reason
    assert caught[0].field == field
    assert steps == ["checksum", "config"]  # refused at the config step, nothing after it
    assert peak < 8 * MiB, f"validation held {peak} bytes of Python objects"


def test_a_max_position_embeddings_within_bounds_builds_no_table_of_that_size(
    tmp_path: Path,
) -> None:
    directory = write_tiny_checkpoint(tmp_path / "long", max_position_embeddings=131072)
    report = validate_checkpoint(directory)
    assert report.config.max_position_embeddings == 131072
    config = checkpoint_module.read_config(directory)
    model = model_module.LlamaModel(config, checkpoint_module.load_tensors(directory, config))
    assert model.cos.shape[0] == 0  # built lazily, by the positions requests reach
    model.reference_logits(torch.tensor([1, 2, 3]))
    assert model.cos.shape[0] == model_module.ROPE_MIN_POSITIONS


def test_config_limits_come_from_settings(
    world_a: TenantWorld, tmp_path: Path, settings: Any
) -> None:
    settings.ENGINE_MAX_POSITION_EMBEDDINGS = 512
    version = _register_path(world_a, checkpoint(tmp_path / "c"))  # max_position 1024
    assert validate_version(version.pk) == VersionStatus.FAILED
    version.refresh_from_db()
    assert "max_position_embeddings = 1024 exceeds the limit 512" in version.failure_reason
    assert version.validation_steps[-1]["step"] == "config"


# --- helpers through the services ----------------------------------------------------------


def _register_path(world: TenantWorld, directory: Path, label: str = "p1") -> ModelVersion:
    return services.version_register_path(
        tenant=world.tenant,
        actor=Actor(user=world.owner),
        model=world.model,
        label=label,
        path=str(directory),
    )


def _upload(world: TenantWorld, body: bytes, label: str = "up") -> ModelVersion:
    return services.version_register_upload(
        tenant=world.tenant,
        actor=Actor(user=world.owner),
        model=world.model,
        label=label,
        stream=io.BytesIO(body),
        content_length=len(body),
    )


def _set_storage_quota(world: TenantWorld, max_bytes: int) -> None:
    staff, _ = User.objects.get_or_create(
        username=f"staff-{world.tenant.pk}",
        defaults={"email": f"staff{world.tenant.pk}@ops.example", "is_staff": True},
    )
    tenant_services.quota_update(
        tenant=world.tenant, actor=Actor(user=staff), changes={"max_storage_bytes": max_bytes}
    )


def _unpacked_size(body: bytes, tmp_path: Path) -> int:
    path = tmp_path / "measure.tar"
    path.write_bytes(body)
    return artifacts.scan_archive(path).unpacked_bytes


def _refuse_unpacking(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(artifacts, "unpack_upload", _refuse("unpack_upload"))
    monkeypatch.setattr(artifacts, "_extract", _refuse("_extract"))


def _zeros_tar(size: int, name: str = "config.json") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        info = tarfile.TarInfo(name)
        info.size = size
        archive.addfile(info, io.BytesIO(b"\0" * size))
    return buffer.getvalue()


# --- tar bombs and the storage quota -------------------------------------------------------


@pytest.mark.django_db
def test_a_tar_bomb_is_refused_before_a_byte_is_unpacked(
    world_a: TenantWorld, store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _set_storage_quota(world_a, 1 * MiB)
    body = _zeros_tar(2 * MiB)
    assert len(body) < 20_000  # a few KiB that would unpack to 2 MiB
    _refuse_unpacking(monkeypatch)
    before = ModelVersion.objects.count()
    with pytest.raises(QuotaExceeded) as exc:
        _upload(world_a, body)
    assert exc.value.field == "artifact"
    assert exc.value.message.startswith(
        "The archive unpacks to 2.0 MiB; the tenant's storage quota is 1.0 MiB with 0 bytes used"
    )
    assert ModelVersion.objects.count() == before  # a request error: nothing registered
    assert stored_files(store) == []  # the staged body is gone too


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("how", "reason"),
    [
        ("sparse", "archive member 'config.json' is a sparse file"),
        ("members", "the archive holds more than 5 entries"),
        ("duplicate", "archive member 'b/config.json' appears twice"),
    ],
)
def test_archives_are_refused_from_their_headers_alone(
    how: str, reason: str, world_a: TenantWorld, store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as archive:
        if how == "sparse":
            info = tarfile.TarInfo("config.json")
            info.type = tarfile.GNUTYPE_SPARSE
            archive.addfile(info)
        elif how == "members":
            monkeypatch.setattr(artifacts, "MAX_MEMBERS", 5)
            for n in range(6):
                archive.addfile(tarfile.TarInfo(f"f{n}"), io.BytesIO())
        else:
            for _ in range(2):
                info = tarfile.TarInfo("b/config.json")
                info.size = 2
                archive.addfile(info, io.BytesIO(b"{}"))
    _refuse_unpacking(monkeypatch)
    version = _upload(world_a, buffer.getvalue())
    assert version.status == VersionStatus.FAILED
    assert reason in version.failure_reason
    assert version.failure_reason.endswith(f"({services.FILES_DELETED})")
    assert version.stored_bytes == 0
    assert stored_files(store) == []


@pytest.mark.django_db
def test_storage_quota_counts_usage_two_versions_fit_the_third_does_not(
    world_a: TenantWorld, tmp_path: Path, store: Path, django_capture_on_commit_callbacks: Any
) -> None:
    body = tar_of(checkpoint(tmp_path / "c"))
    size = _unpacked_size(body, tmp_path)
    _set_storage_quota(world_a, 2 * size + size // 2)
    with django_capture_on_commit_callbacks(execute=True):
        first = _upload(world_a, body, label="a")
        second = _upload(world_a, body, label="b")
    for version in (first, second):
        version.refresh_from_db()
        assert version.status == VersionStatus.READY, version.failure_reason
        assert version.stored_bytes == size
    _register_path(world_a, checkpoint(tmp_path / "local"))  # a local directory costs nothing
    assert selectors.storage_used_bytes(tenant=world_a.tenant) == 2 * size
    with pytest.raises(QuotaExceeded) as exc:
        _upload(world_a, body, label="c")
    assert exc.value.field == "artifact" and "max_storage_bytes" in exc.value.message
    assert not ModelVersion.objects.filter(model=world_a.model, label="c").exists()
    with django_capture_on_commit_callbacks(execute=True):
        services.version_delete(
            tenant=world_a.tenant, actor=Actor(user=world_a.owner), version=first
        )
    assert selectors.storage_used_bytes(tenant=world_a.tenant) == size
    third = _upload(world_a, body, label="c")  # the deleted version's bytes are free again
    assert third.stored_bytes == size
    assert len({p.split("/")[1] for p in stored_files(store)}) == 2


@pytest.mark.django_db
def test_the_quota_is_checked_again_under_the_lock(
    world_a: TenantWorld, tmp_path: Path, store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = tar_of(checkpoint(tmp_path / "c"))
    size = _unpacked_size(body, tmp_path)
    _set_storage_quota(world_a, size + size // 2)
    real_unpack = artifacts.unpack_upload

    def unpack_while_another_upload_commits(path: Path, **kwargs: Any) -> Any:
        unpacked = real_unpack(path, **kwargs)
        # Another upload of the tenant was accepted meanwhile (it passed its own check).
        ModelVersion.objects.filter(pk=world_a.version.pk).update(stored_bytes=size)
        return unpacked

    monkeypatch.setattr(artifacts, "unpack_upload", unpack_while_another_upload_commits)
    with pytest.raises(QuotaExceeded, match=f"with {human_bytes(size)} used"):
        _upload(world_a, body)
    assert not ModelVersion.objects.filter(model=world_a.model, label="up").exists()
    assert stored_files(store) == []  # the unpacked staging folder went too


@pytest.mark.django_db(transaction=True)
def test_concurrent_uploads_cannot_both_take_the_last_space(
    tmp_path: Path, store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = make_world("Racers")
    body = tar_of(checkpoint(tmp_path / "c"))
    size = _unpacked_size(body, tmp_path)
    _set_storage_quota(world, size + size // 2)
    real_unpack = artifacts.unpack_upload
    both_checked = threading.Barrier(2, timeout=30)

    def unpack_in_step(path: Path, **kwargs: Any) -> Any:
        both_checked.wait()  # both passed the unlocked pre-check: only the lock decides now
        return real_unpack(path, **kwargs)

    monkeypatch.setattr(artifacts, "unpack_upload", unpack_in_step)
    outcomes: dict[str, str] = {}

    def upload(label: str) -> None:
        try:
            _upload(world, body, label=label)
            outcomes[label] = "accepted"
        except QuotaExceeded:
            outcomes[label] = "refused"
        finally:
            connection.close()

    threads = [threading.Thread(target=upload, args=(label,)) for label in ("x", "y")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(outcomes.values()) == ["accepted", "refused"], outcomes
    assert selectors.storage_used_bytes(tenant=world.tenant) == size


# --- failed versions lose their files ------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("how", ["truncated", "huge-header", "absurd-config"])
def test_a_version_failing_validation_has_its_files_deleted(
    how: str,
    world_a: TenantWorld,
    tmp_path: Path,
    store: Path,
    django_capture_on_commit_callbacks: Any,
) -> None:
    directory = checkpoint(tmp_path / "c", "truncated" if how == "truncated" else "good")
    if how == "huge-header":  # a header declaring a 4 TB tensor, in a file of a few KiB
        _write_lying_weights(directory / "model.safetensors")
    elif how == "absurd-config":
        _rewrite_config(directory, max_position_embeddings=10_000_000_000)
    with django_capture_on_commit_callbacks(execute=True):
        version = _upload(world_a, tar_of(directory))
    version.refresh_from_db()
    assert version.status == VersionStatus.FAILED
    reason = {
        "truncated": "does not load (truncated or corrupt)",
        "huge-header": "declares shape (1000000, 1000000)",
        "absurd-config": "max_position_embeddings = 10000000000 exceeds the limit 131072",
    }[how]
    assert reason in version.failure_reason
    assert version.failure_reason.endswith(f"({services.FILES_DELETED})")
    assert version.stored_bytes == 0
    assert version.artifact_uri.startswith("store://")
    assert not (store / version.artifact_uri.removeprefix("store://")).exists()
    assert stored_files(store) == []
    assert selectors.storage_used_bytes(tenant=world_a.tenant) == 0


def _write_lying_weights(path: Path) -> None:
    header = json.dumps(
        {
            "model.embed_tokens.weight": {
                "dtype": "F32",
                "shape": [1_000_000, 1_000_000],
                "data_offsets": [0, 4 * 10**12],
            }
        }
    ).encode()
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 64)


@pytest.mark.django_db
def test_a_failed_local_directory_is_never_deleted(world_a: TenantWorld, tmp_path: Path) -> None:
    directory = checkpoint(tmp_path / "mine", "truncated")
    version = _register_path(world_a, directory)
    assert validate_version(version.pk) == VersionStatus.FAILED
    version.refresh_from_db()
    assert services.FILES_DELETED not in version.failure_reason
    assert sorted(p.name for p in directory.iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
    ]


# --- a checkpoint that kills its worker is not redelivered forever -------------------------


@pytest.mark.django_db
def test_validation_interrupted_too_often_fails_without_running_again(
    world_a: TenantWorld,
    tmp_path: Path,
    store: Path,
    monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks: Any,
) -> None:
    with django_capture_on_commit_callbacks(execute=False):  # validation never ran
        version = _upload(world_a, tar_of(checkpoint(tmp_path / "c")))
    stored = artifacts.local_directory(version.artifact_uri)
    assert stored.is_dir()
    # Three workers died validating it (the task is acked late and came back each time).
    ModelVersion.objects.filter(pk=version.pk).update(
        status=VersionStatus.VALIDATING,
        validation_attempts=3,
        validation_steps=[{"step": "weights", "state": "running", "seconds": None}],
    )
    monkeypatch.setattr(checkpoint_module, "validate_checkpoint", _refuse("validate_checkpoint"))
    with django_capture_on_commit_callbacks(execute=True):
        assert validate_version(version.pk) == VersionStatus.FAILED
    version.refresh_from_db()
    assert version.failure_reason == (
        "validation was interrupted 3 times (the worker died); the checkpoint is refused "
        f"({services.FILES_DELETED})"
    )
    assert version.validation_attempts == 3
    assert version.validation_steps == [{"step": "weights", "state": "failed", "seconds": None}]
    assert not stored.exists() and stored_files(store) == []
    assert validate_version(version.pk) is None  # a further delivery finds it final


@pytest.mark.django_db
def test_each_validation_run_is_counted_and_the_limit_is_a_setting(
    world_a: TenantWorld, settings: Any
) -> None:
    version = world_a.version
    ModelVersion.objects.filter(pk=version.pk).update(
        status=VersionStatus.VALIDATING, validation_attempts=1
    )
    assert validate_version(version.pk) == VersionStatus.READY  # the second run may finish
    version.refresh_from_db()
    assert version.validation_attempts == 2
    settings.MODEL_VALIDATION_MAX_ATTEMPTS = 1
    again = _register_path(world_a, world_a.version.artifact_uri.removeprefix("file://"), "p2")
    ModelVersion.objects.filter(pk=again.pk).update(
        status=VersionStatus.VALIDATING, validation_attempts=1
    )
    assert validate_version(again.pk) == VersionStatus.FAILED
    again.refresh_from_db()
    assert again.failure_reason.startswith("validation was interrupted 1 times")
    assert again.source == ArtifactSource.PATH
    assert services.FILES_DELETED not in again.failure_reason


# --- what tenants see -----------------------------------------------------------------------


@pytest.mark.django_db
def test_the_api_refuses_over_quota_uploads_and_shows_usage(
    world_a: TenantWorld, world_b: TenantWorld, tmp_path: Path, store: Path
) -> None:
    client = world_a.client("token")
    body = tar_of(checkpoint(tmp_path / "c"))
    size = _unpacked_size(body, tmp_path)
    _set_storage_quota(world_a, size + size // 2)
    url = reverse("model-version-upload", kwargs={"model_pk": world_a.model.pk})
    response = client.generic("PUT", f"{url}?label=a", body, content_type="application/x-tar")
    assert response.status_code == 201, response.content
    assert response.json()["stored_bytes"] == size
    assert response.json()["validation_attempts"] == 0  # validation starts once it commits
    response = client.generic("PUT", f"{url}?label=b", body, content_type="application/x-tar")
    assert response.status_code == 403
    error = response.json()["error"]
    assert error["code"] == "quota_exceeded" and list(error["fields"]) == ["artifact"]
    assert "storage quota" in error["message"]
    quota = client.get(reverse("quota-list")).json()["results"][0]
    assert quota["storage_used_bytes"] == size
    assert quota["max_storage_bytes"] == size + size // 2
    patch = client.patch(
        reverse("quota-detail", kwargs={"pk": quota["id"]}),
        {"storage_used_bytes": 0},
        format="json",
    )
    assert patch.status_code == 403  # tenants never change their own quota (nor usage)
    assert selectors.storage_used_bytes(tenant=world_a.tenant) == size
    annotated = selectors.quotas_with_storage_used(Quota.objects.order_by("tenant_id"))
    assert [q.storage_used_bytes for q in annotated] == [size, 0]  # world_b holds nothing


@pytest.mark.django_db
def test_registry_pages_show_storage_used_and_allowed(world_a: TenantWorld, tmp_path: Path) -> None:
    body = tar_of(checkpoint(tmp_path / "c"))
    _upload(world_a, body)
    used = selectors.storage_used_bytes(tenant=world_a.tenant)
    _set_storage_quota(world_a, 3 * MiB)
    client = world_a.client("owner")
    slug = world_a.tenant.slug
    from django.template.defaultfilters import filesizeformat

    expected = f"{filesizeformat(used)} of 3.0\xa0MB used"
    for url in (
        reverse("serving-models", kwargs={"slug": slug}),
        reverse("serving-model", kwargs={"slug": slug, "pk": world_a.model.pk}),
    ):
        page = client.get(url).content.decode()
        assert expected in page, url
    _set_storage_quota(world_a, used + 1000)
    upload_url = reverse("serving-version-upload", kwargs={"slug": slug, "pk": world_a.model.pk})
    refused = client.post(
        upload_url, {"label": "over", "archive": SimpleUploadedFile("m.tar", body)}
    )
    assert refused.status_code == 200
    assert "the tenant&#x27;s storage quota is" in refused.content.decode()  # on the form
    assert not ModelVersion.objects.filter(label="over").exists()


@pytest.mark.django_db
def test_tenant_pages_show_storage_used_beside_the_quota(
    world_a: TenantWorld, tmp_path: Path
) -> None:
    """Needs tenants/views.py to pass `storage_used_bytes` to both pages (see the report)."""
    _upload(world_a, tar_of(checkpoint(tmp_path / "c")))
    used = selectors.storage_used_bytes(tenant=world_a.tenant)
    assert used > 0
    from django.template.defaultfilters import filesizeformat

    client = world_a.client("owner")
    for name in ("tenant-overview", "tenant-settings"):
        page = client.get(reverse(name, kwargs={"slug": world_a.tenant.slug})).content.decode()
        assert f"{filesizeformat(used)} used of 10.0\xa0GB" in page, name
