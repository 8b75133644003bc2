"""Model registry services: registration by path, validation to ready or failed, transitions,
deletion, and the deployable-version selector. Validation runs as the Celery task (eager)."""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.urls import reverse

from portal.exceptions import ConflictError, PayloadTooLarge, ValidationFailed
from serving.engine.checkpoint import directory_sha256
from serving.registry import artifacts, selectors, services
from serving.registry.models import ModelVersion, VersionStatus
from serving.registry.tasks import validate_version
from tenants.actors import Actor
from tenants.models import AuditEvent
from tests.conftest import TenantWorld, make_world
from tests.serving.registry_support import checkpoint, hostile_tar, stored_files, tar_of
from tests.tenants.test_worker import worker  # noqa: F401 (the real Celery worker fixture)

pytestmark = pytest.mark.django_db

STEPS = ["checksum", "config", "weights", "tokenizer", "chat template", "forward", "golden answers"]


@pytest.fixture(autouse=True)
def store(settings: Any, tmp_path: Path) -> Path:
    settings.ARTIFACT_STORE_DIR = tmp_path / "store"
    return settings.ARTIFACT_STORE_DIR


def _register(
    world: TenantWorld, directory: Path | str, label: str = "v2", **kwargs: Any
) -> ModelVersion:
    return services.version_register_path(
        tenant=world.tenant,
        actor=Actor(user=world.owner),
        model=world.model,
        label=label,
        path=str(directory),
        **kwargs,
    )


def _actions(version: ModelVersion) -> list[str]:
    return list(
        AuditEvent.objects.filter(object_type="serving.modelversion", object_id=str(version.pk))
        .order_by("id")
        .values_list("action", flat=True)
    )


def test_register_by_path_validates_to_ready_with_summary(
    world_a: TenantWorld, tmp_path: Path, django_capture_on_commit_callbacks: Any
) -> None:
    directory = checkpoint(tmp_path / "ckpt")
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        version = _register(world_a, directory, sha256=directory_sha256(directory).upper())
        assert version.status == VersionStatus.REGISTERED
    assert len(callbacks) == 1  # validation is enqueued only once the registration commits
    version.refresh_from_db()
    assert version.status == VersionStatus.READY, version.failure_reason
    assert version.sha256 == directory_sha256(directory)
    assert version.size_bytes == sum(p.stat().st_size for p in directory.iterdir())
    assert version.format == "hf-safetensors"
    assert version.config_summary["architecture"] == "LlamaForCausalLM"
    assert version.config_summary["num_hidden_layers"] == 2
    assert [s["step"] for s in version.validation_steps] == STEPS
    assert all(s["state"] == "ok" and s["seconds"] >= 0 for s in version.validation_steps)
    assert version.validation_started_at and version.ready_at and not version.failed_at
    assert version.artifact_uri == f"file://{directory.resolve()}"
    assert _actions(version) == [
        "model_version.registered",
        "model_version.validation_started",
        "model_version.ready",
    ]
    assert selectors.version_get_deployable(tenant=world_a.tenant, version_id=version.pk) == version
    assert stored_files(settings.ARTIFACT_STORE_DIR) == []  # a local path is not copied


@pytest.mark.parametrize(
    ("how", "reason", "failed_step"),
    [
        ("checksum", "checksum mismatch", "checksum"),
        ("truncated", "does not load (truncated or corrupt)", "weights"),
        ("architecture", "unsupported architecture 'GPT2LMHeadModel'", "config"),
        ("shape", "has shape", "weights"),
        ("no-tokenizer", "tokenizer.json is missing", "tokenizer"),
        ("symlink", "extra.bin is a symlink", None),
        ("dir-symlink", "linked is a symlink", None),
    ],
)
def test_bad_artifacts_end_failed_with_the_reason(
    how: str,
    reason: str,
    failed_step: str | None,
    world_a: TenantWorld,
    tmp_path: Path,
    django_capture_on_commit_callbacks: Any,
) -> None:
    directory = checkpoint(tmp_path / how, "good" if how in ("checksum", "dir-symlink") else how)
    if how == "dir-symlink":
        (directory / "linked").symlink_to(tmp_path, target_is_directory=True)
    sha = "0" * 64 if how == "checksum" else None
    with django_capture_on_commit_callbacks(execute=True):
        version = _register(world_a, directory, sha256=sha)
    version.refresh_from_db()
    assert version.status == VersionStatus.FAILED
    assert reason in version.failure_reason
    assert version.failed_at is not None and version.ready_at is None
    if failed_step is None:  # refused before the engine's checks began
        assert version.validation_steps == []
    else:
        assert version.validation_steps[-1] == {
            "step": failed_step,
            "state": "failed",
            "seconds": version.validation_steps[-1]["seconds"],
        }
        assert all(s["state"] == "ok" for s in version.validation_steps[:-1])
    assert version.sha256 == "" and version.config_summary == {}
    assert _actions(version)[-1] == "model_version.failed"
    with pytest.raises(ConflictError, match="only ready versions can be deployed") as exc:
        selectors.version_get_deployable(tenant=world_a.tenant, version_id=version.pk)
    assert reason in exc.value.message and exc.value.field == "version"


def test_only_ready_versions_are_deployable(world_a: TenantWorld, world_b: TenantWorld) -> None:
    registered = world_a.version
    with pytest.raises(ConflictError, match="is registered"):
        selectors.version_get_deployable(tenant=world_a.tenant, version_id=registered.pk)
    validate_version(registered.pk)
    registered.refresh_from_db()
    assert registered.status == VersionStatus.READY
    assert selectors.version_get_deployable(tenant=world_a.tenant, version_id=str(registered.pk))
    # Another tenant's ready version and a missing one look the same, naming the caller's field.
    for bad in (registered.pk, 999_999_999, "x", None, True):
        with pytest.raises(ValidationFailed) as exc:
            selectors.version_get_deployable(tenant=world_b.tenant, version_id=bad, field="target")
        assert exc.value.field == "target" and "No model version" in exc.value.message


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("relative", "is not an absolute path"),
        ("missing", "does not exist or is not a directory"),
        ("file", "does not exist or is not a directory"),
        ("outside", "outside the allowed artifact roots"),
        ("escaping-symlink", "outside the allowed artifact roots"),
        ("store", "artifact store"),
        ("above-store", "artifact store"),
        ("empty", "absolute path"),
    ],
)
def test_paths_outside_the_allowed_roots_are_refused(
    where: str, message: str, world_a: TenantWorld, tmp_path: Path, settings: Any
) -> None:
    settings.ARTIFACT_LOCAL_ROOTS = [tmp_path]  # the store (tmp_path / "store") lies under it
    outside = checkpoint(tmp_path.parent / f"{tmp_path.name}-outside")
    store = Path(settings.ARTIFACT_STORE_DIR)
    (store / "tenant-1" / "abc").mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(outside)
    (tmp_path / "a-file").write_text("x")
    path = {
        "relative": "relative/dir",
        "missing": str(tmp_path / "nope"),
        "file": str(tmp_path / "a-file"),
        "outside": str(outside),
        "escaping-symlink": str(link),
        "store": f"file://{store}/tenant-1/abc",
        "above-store": str(tmp_path),
        "empty": "  ",
    }[where]
    before = ModelVersion.objects.count()
    with pytest.raises(ValidationFailed, match=message) as exc:
        _register(world_a, path)
    assert exc.value.field == "path"
    assert ModelVersion.objects.count() == before


def test_registering_paths_is_off_without_roots(
    world_a: TenantWorld, tmp_path: Path, settings: Any
) -> None:
    settings.ARTIFACT_LOCAL_ROOTS = []
    with pytest.raises(ValidationFailed, match="ARTIFACT_LOCAL_ROOTS is empty") as exc:
        _register(world_a, checkpoint(tmp_path / "c"))
    assert exc.value.field == "path"


def test_label_and_checksum_input_is_checked(world_a: TenantWorld, tmp_path: Path) -> None:
    directory = checkpoint(tmp_path / "c")
    with pytest.raises(ConflictError) as exc:
        _register(world_a, directory, label="v1")  # make_world registered v1
    assert exc.value.field == "label"
    for label in ("", "has space", "-dash", "x" * 65):
        with pytest.raises(ValidationFailed) as exc:
            _register(world_a, directory, label=label)
        assert exc.value.field == "label"
    with pytest.raises(ValidationFailed) as exc:
        _register(world_a, directory, sha256="xyz")
    assert exc.value.field == "sha256"
    with pytest.raises(ConflictError) as exc:
        services.model_create(
            tenant=world_a.tenant, actor=Actor(user=world_a.owner), name="assistant"
        )
    assert exc.value.field == "name"


def test_status_moves_only_forward(world_a: TenantWorld) -> None:
    version = world_a.version
    validate_version(version.pk)
    version.refresh_from_db()
    ready_at = version.ready_at
    with pytest.raises(ConflictError, match="A ready version cannot become validating"):
        services.set_status(
            version=version, status=VersionStatus.VALIDATING, actor=services.VALIDATOR
        )
    # Re-running the task on a finished version changes nothing; a missing one is ignored.
    assert validate_version(version.pk) is None
    version.refresh_from_db()
    assert version.status == VersionStatus.READY and version.ready_at == ready_at
    assert validate_version(999_999_999) is None


def test_a_validation_cut_off_by_a_dead_worker_restarts(world_a: TenantWorld) -> None:
    version = world_a.version
    ModelVersion.objects.filter(pk=version.pk).update(
        status=VersionStatus.VALIDATING,
        validation_steps=[{"step": "checksum", "state": "running", "seconds": None}],
    )
    assert validate_version(version.pk) == VersionStatus.READY
    version.refresh_from_db()
    assert [s["state"] for s in version.validation_steps] == ["ok"] * len(STEPS)


def test_a_crash_in_validation_ends_failed_with_the_cause(
    world_a: TenantWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    import serving.engine.checkpoint as checkpoint_module

    def explode(directory: Path, **kwargs: Any) -> None:
        kwargs["progress"]("checksum")
        raise MemoryError("out of memory loading weights")

    monkeypatch.setattr(checkpoint_module, "validate_checkpoint", explode)
    assert validate_version(world_a.version.pk) == VersionStatus.FAILED
    version = ModelVersion.objects.get(pk=world_a.version.pk)
    assert version.failure_reason == "validation error: MemoryError: out of memory loading weights"
    assert version.validation_steps[0]["state"] == "failed"


def test_a_registered_directory_that_vanished_fails(world_a: TenantWorld, tmp_path: Path) -> None:
    directory = checkpoint(tmp_path / "gone")
    version = _register(world_a, directory)
    for path in directory.iterdir():
        path.unlink()
    directory.rmdir()
    assert validate_version(version.pk) == VersionStatus.FAILED
    version.refresh_from_db()
    assert "does not exist" in version.failure_reason


def test_deleting_keeps_registered_directories_and_clears_uploads(
    world_a: TenantWorld, tmp_path: Path, django_capture_on_commit_callbacks: Any
) -> None:
    actor = Actor(user=world_a.owner)
    directory = checkpoint(tmp_path / "c")
    with django_capture_on_commit_callbacks(execute=True):
        uploaded = services.version_register_upload(
            tenant=world_a.tenant,
            actor=actor,
            model=world_a.model,
            label="up",
            stream=io.BytesIO(tar_of(directory)),
        )
    store = Path(settings.ARTIFACT_STORE_DIR)
    assert stored_files(store)
    with django_capture_on_commit_callbacks(execute=True):
        services.version_delete(tenant=world_a.tenant, actor=actor, version=uploaded)
    assert stored_files(store) == []
    with django_capture_on_commit_callbacks(execute=True):
        services.model_delete(tenant=world_a.tenant, actor=actor, model=world_a.model)
    assert not ModelVersion.objects.filter(model=world_a.model).exists()
    assert (directory / "config.json").is_file()
    assert not selectors.model_list(tenant=world_a.tenant).exclude(name="served").exists()
    actions = set(AuditEvent.objects.filter(tenant=world_a.tenant).values_list("action", flat=True))
    assert {"model_version.deleted", "model.deleted"} <= actions


# --- uploads, at the service level ---------------------------------------------------------


def _upload(world: TenantWorld, body: bytes, label: str = "up", **kwargs: Any) -> ModelVersion:
    return services.version_register_upload(
        tenant=world.tenant,
        actor=Actor(user=world.owner),
        model=world.model,
        label=label,
        stream=io.BytesIO(body),
        content_length=kwargs.pop("content_length", len(body)),
        **kwargs,
    )


@pytest.mark.parametrize(
    ("top", "gz"), [(None, False), ("llama-tiny", False), (None, True), ("m", True)]
)
def test_upload_unpacks_into_the_store_and_validates(
    top: str | None,
    gz: bool,
    world_a: TenantWorld,
    tmp_path: Path,
    django_capture_on_commit_callbacks: Any,
) -> None:
    directory = checkpoint(tmp_path / "c")
    with django_capture_on_commit_callbacks(execute=True):
        version = _upload(
            world_a, tar_of(directory, top=top, gz=gz), sha256=directory_sha256(directory)
        )
    version.refresh_from_db()
    assert version.status == VersionStatus.READY, version.failure_reason
    assert version.artifact_uri.startswith(f"store://tenant-{world_a.tenant.pk}/")
    stored = artifacts.local_directory(version.artifact_uri)
    assert sorted(p.name for p in stored.iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
    ]
    assert version.sha256 == directory_sha256(directory)  # same checkpoint, same checksum
    assert stored_files(Path(settings.ARTIFACT_STORE_DIR) / ".staging") == []
    event = AuditEvent.objects.get(action="model_version.registered", object_id=str(version.pk))
    assert event.after["archive_bytes"] > 0 and len(event.after["archive_sha256"]) == 64


@pytest.mark.parametrize(
    ("how", "reason"),
    [
        ("traversal", "archive member '../evil' points outside the artifact"),
        ("nested-traversal", "'sub/../../evil' points outside the artifact"),
        ("absolute", "archive member '/evil-absolute' has an absolute path"),
        ("symlink", "archive member 'link' is a symlink"),
        ("hardlink", "archive member 'hard' is a hard link"),
        ("device", "archive member 'dev' is a device file"),
        ("fifo", "archive member 'pipe' is a FIFO"),
        ("duplicate", "'config.json' appears twice"),
        ("no-config", "no config.json at its root or in a single top folder"),
        ("two-top-folders", "no config.json at its root or in a single top folder"),
        ("not-a-tar", "not a readable tar or tar.gz archive"),
        ("truncated-gz", "not a readable tar or tar.gz archive"),
    ],
)
def test_unsafe_or_broken_archives_fail_and_store_nothing(
    how: str,
    reason: str,
    world_a: TenantWorld,
    tmp_path: Path,
    django_capture_on_commit_callbacks: Any,
) -> None:
    directory = checkpoint(tmp_path / "c")
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        version = _upload(world_a, hostile_tar(directory, how))
    assert callbacks == []  # nothing to validate
    version.refresh_from_db()
    assert version.status == VersionStatus.FAILED
    assert reason in version.failure_reason
    assert version.artifact_uri == ""
    assert version.validation_steps[0]["step"] == "unpack"
    assert stored_files(Path(settings.ARTIFACT_STORE_DIR)) == []
    assert not (tmp_path / "evil").exists() and not Path("/evil-absolute").exists()
    with pytest.raises(ConflictError):
        selectors.version_get_deployable(tenant=world_a.tenant, version_id=version.pk)


def test_oversize_uploads_are_refused_while_streaming(world_a: TenantWorld, settings: Any) -> None:
    settings.ARTIFACT_UPLOAD_MAX_BYTES = 10_000
    before = ModelVersion.objects.count()
    # Declared too large: refused before a byte is read.
    stream = io.BytesIO(b"\0" * 20_000)
    with pytest.raises(PayloadTooLarge) as exc:
        services.version_register_upload(
            tenant=world_a.tenant, actor=Actor(user=world_a.owner), model=world_a.model,
            label="big", stream=stream, content_length=20_000,
        )  # fmt: skip
    assert exc.value.field == "artifact" and stream.tell() == 0
    # No length given: cut off as soon as the limit is passed, the partial file removed.
    stream = io.BytesIO(b"\0" * 50 * artifacts.CHUNK_BYTES)
    with pytest.raises(PayloadTooLarge, match="larger than the limit of 10000 bytes"):
        services.version_register_upload(
            tenant=world_a.tenant, actor=Actor(user=world_a.owner), model=world_a.model,
            label="big", stream=stream, content_length=None,
        )  # fmt: skip
    assert stream.tell() <= artifacts.CHUNK_BYTES
    assert ModelVersion.objects.count() == before
    assert stored_files(Path(settings.ARTIFACT_STORE_DIR)) == []


def test_an_archive_that_unpacks_past_the_limit_fails(
    world_a: TenantWorld, tmp_path: Path, settings: Any
) -> None:
    (tmp_path / "z").mkdir()
    (tmp_path / "z" / "config.json").write_bytes(b"0" * 2_000_000)
    body = tar_of(tmp_path / "z", gz=True)
    settings.ARTIFACT_UPLOAD_MAX_BYTES = 1_000_000
    assert len(body) < 100_000
    version = _upload(world_a, body)
    assert version.status == VersionStatus.FAILED
    assert "unpacks to more than 1000000 bytes" in version.failure_reason
    assert stored_files(Path(settings.ARTIFACT_STORE_DIR)) == []


def test_an_empty_upload_names_the_field(world_a: TenantWorld) -> None:
    with pytest.raises(ValidationFailed, match="body is empty") as exc:
        _upload(world_a, b"")
    assert exc.value.field == "artifact"
    assert stored_files(Path(settings.ARTIFACT_STORE_DIR)) == []


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("worker")
def test_a_celery_worker_validates_registered_versions(tmp_path: Path) -> None:
    world = make_world("Registry")  # its v1 is enqueued to the worker on commit
    good = checkpoint(tmp_path / "good")
    bad = checkpoint(tmp_path / "bad", "truncated")
    client = world.client("token")
    url = reverse("model-version-list", kwargs={"model_pk": world.model.pk})
    for label, directory in (("good", good), ("bad", bad)):
        response = client.post(url, {"label": label, "path": str(directory)}, format="json")
        assert response.status_code == 201, response.content
    versions = ModelVersion.objects.filter(model=world.model)
    deadline = time.monotonic() + 90
    while versions.exclude(status__in=[VersionStatus.READY, VersionStatus.FAILED]).exists():
        assert time.monotonic() < deadline, list(versions.values("label", "status"))
        time.sleep(0.2)
    status = dict(versions.values_list("label", "status"))
    assert status == {"v1": "ready", "good": "ready", "bad": "failed"}
    assert "does not load" in versions.get(label="bad").failure_reason
