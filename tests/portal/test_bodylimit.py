"""Every HTTP route's body is capped in ASGI (declared and streamed), the upload routes at their
own limit; driven as ASGI calls (scope, receive, send), no network."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from portal.bodylimit import BodyLimitMiddleware
from serving.registry import artifacts

API_PATH = "/api/v1/tokens/"
PAGE_PATH = "/accounts/login/"
UPLOAD_PATH = "/api/v1/models/7/versions/upload/"
PAGE_UPLOAD_PATH = "/t/acme/models/7/upload/"


def _drive(
    app: Any,
    path: str,
    chunks: list[bytes],
    headers: list[tuple[bytes, bytes]] | None = None,
    method: str = "POST",
) -> list[dict[str, Any]]:
    """One HTTP request through `app`; the messages it sent back."""
    sent: list[dict[str, Any]] = []
    queue = [
        {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
        for i, chunk in enumerate(chunks)
    ]

    async def receive() -> dict[str, Any]:
        if queue:
            return queue.pop(0)
        await asyncio.sleep(3600)  # a client that is done sending waits for the answer
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1"), *(headers or [])],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }

    async def run() -> None:
        await asyncio.wait_for(app(scope, receive, send), timeout=30)

    asyncio.run(run())
    return sent


def _status(sent: list[dict[str, Any]]) -> list[int]:
    return [m["status"] for m in sent if m["type"] == "http.response.start"]


def _error(sent: list[dict[str, Any]]) -> dict[str, Any]:
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    error: dict[str, Any] = json.loads(body)["error"]
    return error


def _length(size: int) -> list[tuple[bytes, bytes]]:
    return [(b"content-length", str(size).encode()), (b"content-type", b"application/json")]


# --- the middleware around an app that reads the whole body ------------------------------


class Echo:
    def __init__(self) -> None:
        self.called = False
        self.read: bytes | None = None
        self.aborted = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.called = True
        read = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.aborted = True
                return
            read += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.read = read
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def _capped(inner: Any, default: int = 1000, upload: int = 5000) -> BodyLimitMiddleware:
    return BodyLimitMiddleware(
        inner, limits=[(artifacts.API_UPLOAD_PATH, lambda: upload)], default=lambda: default
    )


def test_a_declared_length_over_the_default_is_refused_before_the_app_runs() -> None:
    inner = Echo()
    sent = _drive(_capped(inner), API_PATH, [b"x" * 1001], headers=_length(1001))
    assert _status(sent) == [413] and not inner.called
    error = _error(sent)
    assert error["code"] == "too_large" and list(error["fields"]) == ["body"]
    assert "1000 bytes (REQUEST_BODY_MAX_BYTES)" in error["message"]


def test_a_chunked_body_over_the_default_is_cut_off_as_it_streams() -> None:
    inner = Echo()
    sent = _drive(_capped(inner), PAGE_PATH, [b"x" * 300] * 10)  # no Content-Length
    assert inner.aborted and inner.read is None
    assert _status(sent) == [413]
    assert "REQUEST_BODY_MAX_BYTES" in _error(sent)["message"]


def test_bodies_up_to_the_default_reach_the_app_whole() -> None:
    inner = Echo()
    sent = _drive(_capped(inner), API_PATH, [b"a" * 600, b"b" * 400])
    assert _status(sent) == [201] and inner.read == b"a" * 600 + b"b" * 400


def test_the_upload_route_has_its_own_cap() -> None:
    inner = Echo()
    sent = _drive(_capped(inner), UPLOAD_PATH, [b"x" * 4000], headers=_length(4000))
    assert _status(sent) == [201] and inner.read == b"x" * 4000  # over the default: allowed
    inner = Echo()
    sent = _drive(_capped(inner), UPLOAD_PATH, [b"x" * 2000] * 3)
    assert inner.aborted and _status(sent) == [413]
    error = _error(sent)
    assert list(error["fields"]) == ["artifact"]
    assert "5000 bytes (ARTIFACT_UPLOAD_MAX_BYTES)" in error["message"]


def test_a_repeated_content_length_is_judged_by_its_largest_value() -> None:
    inner = Echo()
    headers = [(b"content-length", b"10"), (b"content-length", b"999999")]
    sent = _drive(_capped(inner), API_PATH, [b"x" * 10], headers=headers)
    assert _status(sent) == [413] and not inner.called


def test_an_app_that_already_answered_gets_no_second_response() -> None:
    class AnswersFirst(Echo):
        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"early"})
            while (await receive())["type"] != "http.disconnect":
                pass

    sent = _drive(_capped(AnswersFirst()), API_PATH, [b"x" * 600] * 3)
    assert _status(sent) == [200]


# --- the portal's ASGI application -------------------------------------------------------


@pytest.fixture
def application() -> Any:
    from portal.asgi import application as app

    return app.application_mapping["http"]


def test_the_application_caps_every_route(application: Any, settings: Any) -> None:
    assert isinstance(application, BodyLimitMiddleware)
    assert application._limit_for(API_PATH) == settings.REQUEST_BODY_MAX_BYTES == 1024**2
    assert application._limit_for(PAGE_PATH) == settings.REQUEST_BODY_MAX_BYTES
    assert application._limit_for("/t/acme/deployments/3/contract/") == 1024**2
    assert application._limit_for(UPLOAD_PATH) == settings.ARTIFACT_UPLOAD_MAX_BYTES
    assert application._limit_for(PAGE_UPLOAD_PATH) > settings.ARTIFACT_UPLOAD_MAX_BYTES
    assert settings.DATA_UPLOAD_MAX_MEMORY_SIZE == settings.REQUEST_BODY_MAX_BYTES  # WSGI


@pytest.mark.parametrize("path", [API_PATH, PAGE_PATH])
def test_the_application_refuses_a_declared_body_over_the_default(
    application: Any, path: str
) -> None:
    size = 2 * 1024**2
    sent = _drive(application, path, [b"{}"], headers=_length(size))
    assert _status(sent) == [413]
    assert "1048576 bytes (REQUEST_BODY_MAX_BYTES)" in _error(sent)["message"]


@pytest.mark.parametrize("path", [API_PATH, PAGE_PATH])
def test_the_application_cuts_off_a_chunked_body_over_the_default(
    application: Any, path: str
) -> None:
    sent = _drive(application, path, [b"x" * 65536] * 20)  # 1.25 MiB, no Content-Length
    assert _status(sent) == [413]
    assert list(_error(sent)["fields"]) == ["body"]


@pytest.mark.parametrize(("path", "expected"), [(API_PATH, {401, 403}), (PAGE_PATH, {403})])
def test_the_application_lets_an_allowed_body_through(
    application: Any, path: str, expected: set[int]
) -> None:
    """Anonymous: the API answers 401/403, the login page 403 (no CSRF cookie): Django ran."""
    body = json.dumps({"name": "x" * 500_000}).encode()
    sent = _drive(application, path, [body[:250_000], body[250_000:]], headers=_length(len(body)))
    (status,) = _status(sent)
    assert status in expected


def test_the_upload_route_takes_more_than_the_default_and_has_its_own_cap(
    application: Any, settings: Any
) -> None:
    settings.ARTIFACT_UPLOAD_MAX_BYTES = 3 * 1024**2
    body = [b"x" * 65536] * 32  # 2 MiB: over the default, under the upload cap
    headers = [(b"content-type", b"application/x-tar")]
    (status,) = _status(_drive(application, UPLOAD_PATH, body, headers=headers))
    assert status in {401, 403}  # Django ran (anonymous)
    settings.ARTIFACT_UPLOAD_MAX_BYTES = 1024**2
    sent = _drive(application, UPLOAD_PATH, body, headers=headers)
    assert _status(sent) == [413]
    assert "1048576 bytes (ARTIFACT_UPLOAD_MAX_BYTES)" in _error(sent)["message"]
    sent = _drive(application, UPLOAD_PATH, [b""], headers=_length(8 * 1024**3))
    assert _status(sent) == [413] and list(_error(sent)["fields"]) == ["artifact"]


def test_uvicorn_gets_a_small_websocket_message_cap(settings: Any) -> None:
    from portal import serve

    assert serve.ws_max_size() == settings.WS_MAX_BYTES <= 64 * 1024
