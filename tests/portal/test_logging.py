"""Secrets never reach the logs: tokens, invitation links, bearer headers, passwords."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from django.conf import settings

from portal.logging import RedactSecretsFilter, redact
from portal.serve import log_config


@pytest.mark.parametrize(
    "text",
    [
        "token aop_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789-_x issued",
        'GET /invite/inv_Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MA/ HTTP/1.1" 404',
        "Authorization: Bearer sk-live-123456",
        "password=hunter2-and-more&next=/",
        '{"password": "hunter2"}',
    ],
)
def test_redact_removes_secrets(text: str) -> None:
    cleaned = redact(text)
    for secret in ("AbCdEfGhIjKl", "Zm9vYmFyYmF6", "sk-live-123456", "hunter2"):
        assert secret not in cleaned


def test_uvicorn_access_lines_keep_their_shape_and_lose_the_secret() -> None:
    from uvicorn.logging import AccessFormatter

    args = ("127.0.0.1:5000", "GET", "/invite/inv_" + "q" * 40 + "/", "1.1", 404)
    record = logging.LogRecord(
        "uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d', args, None
    )
    RedactSecretsFilter().filter(record)
    line = AccessFormatter('%(client_addr)s - "%(request_line)s" %(status_code)s').format(record)
    assert "qqqq" not in line and "inv_[redacted]" in line and "404" in line


def test_filter_redacts_arguments() -> None:
    record = logging.LogRecord(
        "x", logging.INFO, __file__, 1, "issued %s", ("aop_" + "A" * 40,), None
    )
    RedactSecretsFilter().filter(record)
    assert "AAAA" not in record.getMessage()
    assert "aop_[redacted]" in record.getMessage()


def test_every_log_handler_redacts() -> None:
    for name, handler in settings.LOGGING["handlers"].items():
        assert "redact_secrets" in handler.get("filters", []), name
    for name, handler in log_config()["handlers"].items():
        assert handler["filters"] == ["redact_secrets"], name


def test_a_logged_404_on_an_invitation_link_is_redacted(client, caplog, db) -> None:
    handler_filter = RedactSecretsFilter()
    secret_path = "/invite/inv_" + "s3cr3t" * 8 + "/"
    with caplog.at_level(logging.WARNING, logger="django.request"):
        client.get(secret_path)
    records = [r for r in caplog.records if r.name == "django.request"]
    assert records
    for record in records:
        handler_filter.filter(record)
        assert "s3cr3t" not in record.getMessage()


def test_json_lines_carry_the_request_and_trace_ids_and_no_secrets(
    client: Any, settings: Any, db: Any
) -> None:
    """LOG_FORMAT=json: one object a line, the request's ids on each, secrets redacted."""
    import io
    import json

    from portal.logging import JsonFormatter

    settings.LOG_FORMAT = "json"
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RedactSecretsFilter())
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        trace = "4bf92f3577b34da6a3ce929d0e0e4736"
        response = client.get(
            "/no-such-page/?token=aop_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
            HTTP_X_REQUEST_ID="req-42",
            HTTP_TRACEPARENT=f"00-{trace}-00f067aa0ba902b7-01",
        )
        bad = client.get("/no-such-page/", HTTP_X_REQUEST_ID="bad id\\nwith newline")
    finally:
        root.removeHandler(handler)
    assert response.status_code == 404 and response["X-Request-ID"] == "req-42"
    assert bad["X-Request-ID"] != "bad id\\nwith newline" and len(bad["X-Request-ID"]) == 16
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    mine = [line for line in lines if line["request_id"] == "req-42"]
    assert {line["logger"] for line in mine} >= {"django.request", "portal.access"}, lines
    assert all(line["trace_id"] == trace for line in mine)
    assert all(set(line) >= {"time", "level", "logger", "message"} for line in lines)
    assert "AbCdEfGhIjKl" not in stream.getvalue()
    access = next(line for line in mine if line["logger"] == "portal.access")
    assert access["message"].startswith("GET /no-such-page/ 404")


def test_a_bad_log_format_is_refused_at_start() -> None:
    import subprocess
    import sys

    code = "import portal.settings"
    env = {"LOG_FORMAT": "xml", "PATH": "/usr/bin:/bin", "SECRET_KEY": "x" * 60}
    done = subprocess.run(  # noqa: S603 (this interpreter, fixed code)
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False,
        cwd=str(settings.BASE_DIR),
    )  # fmt: skip
    assert done.returncode != 0 and "LOG_FORMAT must be plain or json" in done.stderr
