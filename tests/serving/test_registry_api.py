"""Model registry REST API: models, versions by path and by streamed upload, roles, filters,
query budgets, and the ASGI body limit in front of the upload routes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.middleware.csrf import _get_new_csrf_string
from django.urls import reverse
from rest_framework.test import APIClient

from portal.bodylimit import BodyLimitMiddleware
from serving.engine.checkpoint import directory_sha256
from serving.registry import artifacts, services
from serving.registry.models import ModelVersion, VersionStatus
from tenants import services as tenant_services
from tenants.actors import Actor
from tenants.models import AuditEvent
from tests.conftest import TenantWorld
from tests.serving.registry_support import checkpoint, hostile_tar, stored_files, tar_of

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def store(settings: Any, tmp_path: Path) -> Path:
    settings.ARTIFACT_STORE_DIR = tmp_path / "store"
    return settings.ARTIFACT_STORE_DIR


def _versions_url(world: TenantWorld) -> str:
    return reverse("model-version-list", kwargs={"model_pk": world.model.pk})


def _upload_url(world: TenantWorld, **params: str) -> str:
    query = "&".join(f"{k}={v}" for k, v in params.items())
    url = reverse("model-version-upload", kwargs={"model_pk": world.model.pk})
    return f"{url}?{query}" if query else url


def _put_archive(
    client: APIClient, url: str, body: bytes, content_type: str = "application/x-tar", **extra: Any
) -> Any:
    return client.generic("PUT", url, body, content_type=content_type, **extra)


def test_models_crud_with_filters_and_audit(world_a: TenantWorld) -> None:
    client = world_a.client("operator")
    created = client.post(
        reverse("model-list"),
        {"name": "chat-small", "task": "chat", "description": "support bot"},
        format="json",
    )
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["name"] == "chat-small" and body["task"] == "chat" and body["version_count"] == 0
    assert body["created_by"] == world_a.operator.email
    listed = client.get(reverse("model-list"), {"task": "chat"}).json()["results"]
    assert [m["name"] for m in listed] == ["chat-small"]
    assert [
        m["name"] for m in client.get(reverse("model-list"), {"name": "ASSIST"}).json()["results"]
    ] == ["assistant"]
    all_models = {m["name"]: m for m in client.get(reverse("model-list")).json()["results"]}
    assert all_models["assistant"]["version_count"] == 1
    detail = reverse("model-detail", kwargs={"pk": body["id"]})
    patched = client.patch(detail, {"description": "support bot v2"}, format="json")
    assert patched.status_code == 200 and patched.json()["description"] == "support bot v2"
    duplicate = client.post(reverse("model-list"), {"name": "chat-small"}, format="json")
    assert duplicate.status_code == 409
    assert duplicate.json()["error"]["fields"] == {"name": ["A model named 'chat-small' exists."]}
    assert client.delete(detail).status_code == 204
    assert client.get(detail).status_code == 404
    actions = list(
        AuditEvent.objects.filter(object_type="serving.model", object_id=str(body["id"]))
        .order_by("id")
        .values_list("action", flat=True)
    )
    assert actions == ["model.created", "model.updated", "model.deleted"]


def test_register_by_path_then_poll_until_ready(
    world_a: TenantWorld, tmp_path: Path, django_capture_on_commit_callbacks: Any
) -> None:
    client = world_a.client("token")
    directory = checkpoint(tmp_path / "c")
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(
            _versions_url(world_a),
            {"label": "v2", "path": str(directory), "sha256": directory_sha256(directory)},
            format="json",
        )
    assert response.status_code == 201, response.content
    assert response.json()["status"] == "registered"
    assert response.json()["deployable"] is False
    detail = reverse(
        "model-version-detail", kwargs={"model_pk": world_a.model.pk, "pk": response.json()["id"]}
    )
    version = client.get(detail).json()
    assert version["status"] == "ready" and version["deployable"] is True
    assert version["config_summary"]["architecture"] == "LlamaForCausalLM"
    assert [s["step"] for s in version["validation_steps"]] == [
        "checksum", "config", "weights", "tokenizer", "chat template", "forward", "golden answers",
    ]  # fmt: skip
    assert version["sha256"] == directory_sha256(directory)
    ready = client.get(_versions_url(world_a), {"status": "ready"}).json()["results"]
    assert [v["label"] for v in ready] == ["v2"]
    registered = client.get(_versions_url(world_a), {"status": "registered"}).json()["results"]
    assert [v["label"] for v in registered] == ["v1"]


def test_a_bad_checkpoint_by_path_ends_failed_in_the_api(
    world_a: TenantWorld, tmp_path: Path, django_capture_on_commit_callbacks: Any
) -> None:
    directory = checkpoint(tmp_path / "c", "truncated")
    client = world_a.client("token")
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(
            _versions_url(world_a), {"label": "v2", "path": str(directory)}, format="json"
        )
    version = client.get(
        reverse(
            "model-version-detail",
            kwargs={"model_pk": world_a.model.pk, "pk": response.json()["id"]},
        )
    ).json()
    assert version["status"] == "failed" and version["deployable"] is False
    assert "model.safetensors does not load" in version["failure_reason"]


@pytest.mark.parametrize(
    ("top", "gz", "content_type"),
    [
        (None, False, "application/x-tar"),
        ("llama-tiny", True, "application/gzip"),
        ("m", False, "application/octet-stream"),
    ],
)
def test_upload_streams_into_the_store_and_validates(
    top: str | None,
    gz: bool,
    content_type: str,
    world_a: TenantWorld,
    tmp_path: Path,
    settings: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    directory = checkpoint(tmp_path / "c")
    body = tar_of(directory, top=top, gz=gz)
    # The body is streamed, never read whole: Django would refuse request.body past this.
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    assert len(body) > 10 * settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    url = _upload_url(world_a, label="v2", sha256=directory_sha256(directory))
    with django_capture_on_commit_callbacks(execute=True):
        response = _put_archive(world_a.client("token"), url, body, content_type)
    assert response.status_code == 201, response.content
    version = ModelVersion.objects.get(pk=response.json()["id"])
    assert version.source == "upload" and version.status == VersionStatus.READY
    assert artifacts.local_directory(version.artifact_uri).is_dir()
    assert len(stored_files(Path(settings.ARTIFACT_STORE_DIR))) == 3


def test_upload_by_post_with_a_session(world_a: TenantWorld, tmp_path: Path) -> None:
    directory = checkpoint(tmp_path / "c")
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(world_a.operator)
    url = _upload_url(world_a, label="v2")
    refused = client.generic("POST", url, tar_of(directory), content_type="application/x-tar")
    assert refused.status_code == 403 and "CSRF" in refused.json()["error"]["message"]
    secret = _get_new_csrf_string()
    client.cookies["csrftoken"] = secret
    response = client.generic(
        "POST", url, tar_of(directory), content_type="application/x-tar", HTTP_X_CSRFTOKEN=secret
    )
    assert response.status_code == 201, response.content
    assert response.json()["status"] == "registered"
    assert response.json()["created_by"] == world_a.operator.email
    for content_type in ("application/octet-stream", "application/x-gzip"):
        again = client.generic(
            "POST", _upload_url(world_a, label=content_type[12:16]), tar_of(directory),
            content_type=content_type, HTTP_X_CSRFTOKEN=secret,
        )  # fmt: skip
        assert again.status_code == 201, again.content
    wrong = client.generic(
        "POST", _upload_url(world_a, label="json"), b"{}", content_type="application/json",
        HTTP_X_CSRFTOKEN=secret,
    )  # fmt: skip
    assert wrong.status_code == 415


@pytest.mark.parametrize("how", ["traversal", "absolute", "symlink", "hardlink", "device"])
def test_hostile_archives_through_the_api_end_failed_and_store_nothing(
    how: str, world_a: TenantWorld, tmp_path: Path
) -> None:
    body = hostile_tar(checkpoint(tmp_path / "c"), how)
    response = _put_archive(world_a.client("token"), _upload_url(world_a, label="bad"), body)
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["status"] == "failed" and data["deployable"] is False
    assert "archive member" in data["failure_reason"]
    assert stored_files(Path(settings.ARTIFACT_STORE_DIR)) == []


def test_oversize_upload_is_413_naming_the_field(
    world_a: TenantWorld, tmp_path: Path, settings: Any
) -> None:
    settings.ARTIFACT_UPLOAD_MAX_BYTES = 50_000
    body = tar_of(checkpoint(tmp_path / "c"))
    before = ModelVersion.objects.count()
    response = _put_archive(world_a.client("token"), _upload_url(world_a, label="big"), body)
    assert response.status_code == 413
    error = response.json()["error"]
    assert error["code"] == "too_large" and "50000 bytes" in error["message"]
    assert list(error["fields"]) == ["artifact"]
    assert ModelVersion.objects.count() == before
    assert stored_files(Path(settings.ARTIFACT_STORE_DIR)) == []


def test_upload_refuses_other_content_types_and_empty_bodies(world_a: TenantWorld) -> None:
    client = world_a.client("token")
    response = _put_archive(client, _upload_url(world_a, label="v2"), b"{}", "application/json")
    assert response.status_code == 415
    assert response.json()["error"]["code"] == "unsupported_media_type"
    assert "application/x-tar" in response.json()["error"]["message"]
    response = _put_archive(client, _upload_url(world_a, label="v2"), b"")
    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["artifact"]
    response = _put_archive(client, _upload_url(world_a, label="v1"), b"x" * 100)
    assert response.status_code == 409  # refused before reading the body
    assert list(response.json()["error"]["fields"]) == ["label"]
    response = _put_archive(client, _upload_url(world_a, label="v2", sha256="nothex"), b"x")
    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["sha256"]
    assert ModelVersion.objects.filter(model=world_a.model).count() == 1


def test_delete_version_removes_the_uploaded_artifact(
    world_a: TenantWorld, tmp_path: Path, django_capture_on_commit_callbacks: Any
) -> None:
    client = world_a.client("token")
    response = _put_archive(
        client, _upload_url(world_a, label="v2"), tar_of(checkpoint(tmp_path / "c"))
    )
    detail = reverse(
        "model-version-detail", kwargs={"model_pk": world_a.model.pk, "pk": response.json()["id"]}
    )
    with django_capture_on_commit_callbacks(execute=True):
        assert client.delete(detail).status_code == 204
    assert stored_files(Path(settings.ARTIFACT_STORE_DIR)) == []
    assert client.get(detail).status_code == 404


def test_a_version_is_reached_only_through_its_own_model(world_a: TenantWorld) -> None:
    other = services.model_create(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner), name="other"
    )
    url = reverse("model-version-detail", kwargs={"model_pk": other.pk, "pk": world_a.version.pk})
    assert world_a.client("token").get(url).status_code == 404
    assert world_a.client("token").get(_versions_url(world_a)).json()["results"][0]["label"] == "v1"


# (name, method, url, body kind, expected for viewer, operator, owner)
ROLE_MATRIX = [
    ("list models", "get", "models", None, (200, 200, 200)),
    ("create model", "post", "models", "model", (403, 201, 201)),
    ("describe model", "patch", "model", "description", (403, 200, 200)),
    ("list versions", "get", "versions", None, (200, 200, 200)),
    ("read version", "get", "version", None, (200, 200, 200)),
    ("register version", "post", "versions", "path", (403, 201, 201)),
    ("upload version", "put", "upload", "tar", (403, 201, 201)),
    ("delete version", "delete", "version", None, (403, 204, 204)),
    ("delete model", "delete", "model", None, (403, 204, 204)),
]  # fmt: skip


@pytest.mark.parametrize("row", ROLE_MATRIX, ids=[row[0] for row in ROLE_MATRIX])
@pytest.mark.parametrize("role_index", [0, 1, 2], ids=["viewer", "operator", "owner"])
def test_role_matrix(row: tuple, role_index: int, world_a: TenantWorld, tmp_path: Path) -> None:
    _, method, where, body_kind, expected = row
    client = world_a.client(("viewer", "operator", "owner")[role_index])
    url = {
        "models": reverse("model-list"),
        "model": reverse("model-detail", kwargs={"pk": world_a.model.pk}),
        "versions": _versions_url(world_a),
        "version": reverse(
            "model-version-detail", kwargs={"model_pk": world_a.model.pk, "pk": world_a.version.pk}
        ),
        "upload": _upload_url(world_a, label="v9"),
    }[where]
    if body_kind == "tar":
        response = _put_archive(client, url, tar_of(checkpoint(tmp_path / "c")))
    else:
        body = {
            None: None,
            "model": {"name": "new-model"},
            "description": {"description": "changed"},
            "path": {"label": "v9", "path": str(checkpoint(tmp_path / "c"))},
        }[body_kind]
        response = getattr(client, method)(url, data=body, format="json")
    assert response.status_code == expected[role_index], response.content
    if response.status_code == 403:
        assert response.json()["error"]["code"] == "forbidden"


def test_a_read_only_token_cannot_upload(world_a: TenantWorld, tmp_path: Path) -> None:
    _, raw = tenant_services.api_token_create(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner), name="ro", scopes=["read"]
    )
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert client.get(_versions_url(world_a)).status_code == 200
    response = _put_archive(
        client, _upload_url(world_a, label="v2"), tar_of(checkpoint(tmp_path / "c"))
    )
    assert response.status_code == 403
    assert stored_files(Path(settings.ARTIFACT_STORE_DIR)) == []


def test_list_endpoints_stay_within_a_query_budget(
    world_a: TenantWorld, tmp_path: Path, django_assert_max_num_queries: Any
) -> None:
    actor = Actor(user=world_a.owner)
    directory = checkpoint(tmp_path / "c")
    for n in range(5):
        model = services.model_create(tenant=world_a.tenant, actor=actor, name=f"m{n}")
        for label in ("a", "b"):
            services.version_register_path(
                tenant=world_a.tenant, actor=actor, model=model, label=label, path=str(directory)
            )
    for n in range(8):
        services.version_register_path(
            tenant=world_a.tenant,
            actor=actor,
            model=world_a.model,
            label=f"x{n}",
            path=str(directory),
        )
    client = world_a.client("token")
    client.get(reverse("model-list"))  # warm the token cache, like a running client
    with django_assert_max_num_queries(3):
        assert len(client.get(reverse("model-list")).json()["results"]) == 7  # + "served"
    with django_assert_max_num_queries(4):
        assert len(client.get(_versions_url(world_a)).json()["results"]) == 9


def test_the_schema_documents_the_registry() -> None:
    text = APIClient().get(reverse("api-schema")).content.decode()
    for path in (
        "/api/v1/models/",
        "/api/v1/models/{model_pk}/versions/",
        "/api/v1/models/{model_pk}/versions/upload/",
    ):
        assert path in text
    assert "application/x-tar" in text


# --- the ASGI body limit -----------------------------------------------------------------


def _limited(limit: int) -> Any:
    state: dict[str, Any] = {}

    async def inner(scope: dict, receive: Any, send: Any) -> None:
        state["app"] = await _echo(scope, receive, send, state)

    return BodyLimitMiddleware(inner, limits=[(artifacts.API_UPLOAD_PATH, lambda: limit)]), state


async def _echo(scope: dict, receive: Any, send: Any, state: dict) -> None:
    read = b""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            state["aborted"] = True
            return
        read += message.get("body", b"")
        if not message.get("more_body"):
            break
    state["read"] = read
    await send({"type": "http.response.start", "status": 201, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def _drive(app: Any, path: str, chunks: list[bytes], headers: list | None = None) -> list[dict]:
    sent: list[dict] = []
    queue = [
        {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
        for i, chunk in enumerate(chunks)
    ]

    async def receive() -> dict:
        return queue.pop(0) if queue else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "path": path, "headers": headers or [], "method": "PUT"}
    asyncio.run(app(scope, receive, send))
    return sent


UPLOAD_PATH = "/api/v1/models/7/versions/upload/"


def test_body_limit_passes_small_bodies_and_other_paths() -> None:
    app, state = _limited(100)
    sent = _drive(app, UPLOAD_PATH, [b"a" * 60, b"b" * 40])
    assert sent[0]["status"] == 201 and state["read"] == b"a" * 60 + b"b" * 40
    app, state = _limited(100)
    sent = _drive(app, "/api/v1/tokens/", [b"x" * 500])
    assert sent[0]["status"] == 201 and len(state["read"]) == 500


def test_body_limit_refuses_a_declared_length_before_reading() -> None:
    app, state = _limited(100)
    sent = _drive(app, UPLOAD_PATH, [b"x" * 500], headers=[(b"content-length", b"500")])
    assert sent[0]["status"] == 413 and "read" not in state and "aborted" not in state
    body = json.loads(sent[1]["body"])
    assert body["error"]["code"] == "too_large" and list(body["error"]["fields"]) == ["artifact"]


def test_body_limit_cuts_a_streaming_body_off_at_the_limit() -> None:
    app, state = _limited(100)
    chunks = [b"x" * 60] * 10
    sent = _drive(app, UPLOAD_PATH, chunks)
    assert state.get("aborted") is True and "read" not in state
    assert [m.get("status") for m in sent if m["type"] == "http.response.start"] == [413]


def test_the_asgi_application_is_wrapped() -> None:
    from portal.asgi import application

    http = application.application_mapping["http"]
    assert isinstance(http, BodyLimitMiddleware)
    assert (
        http._limit_for("/api/v1/models/3/versions/upload/") == settings.ARTIFACT_UPLOAD_MAX_BYTES
    )
    assert http._limit_for("/t/acme/models/3/upload/") > settings.ARTIFACT_UPLOAD_MAX_BYTES
    assert http._limit_for("/api/v1/models/") == settings.REQUEST_BODY_MAX_BYTES
