"""Secrets never reach the logs: tokens, invitation links, bearer headers, passwords."""

from __future__ import annotations

import logging

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
