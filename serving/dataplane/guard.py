"""Input guard at the router: refuse what the deployment's contract does not accept, with a
4xx that says why, before any replica spends a cycle on it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


class Refused(Exception):
    """A request the data plane will not serve; `status`, `code` and `message` go to the
    client as `{"error": {"code", "message", "type"}}` (OpenAI's error shape)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def __reduce__(self) -> tuple[type[Refused], tuple[int, str, str]]:
        # Raised inside a version replica, it must survive Ray's pickling to reach the router.
        return (Refused, (self.status, self.code, self.message))

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"code": self.code, "message": self.message, "type": kind}}


@dataclass(frozen=True)
class GuardConfig:
    max_body_bytes: int = 64 * 1024
    max_prompt_tokens: int = 2048
    max_tokens: int = 512
    json_schema: dict[str, Any] | None = None

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> GuardConfig:
        raw = raw or {}
        return cls(
            max_body_bytes=int(raw.get("max_body_bytes", cls.max_body_bytes)),
            max_prompt_tokens=int(raw.get("max_prompt_tokens", cls.max_prompt_tokens)),
            max_tokens=int(raw.get("max_tokens", cls.max_tokens)),
            json_schema=raw.get("json_schema") or None,
        )


def parse_body(raw: bytes, config: GuardConfig) -> dict[str, Any]:
    if len(raw) > config.max_body_bytes:
        raise Refused(
            413,
            "body_too_large",
            f"request body is {len(raw)} bytes; this deployment accepts at most "
            f"{config.max_body_bytes}",
        )
    try:
        body = json.loads(raw or b"{}")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise Refused(400, "invalid_json", f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise Refused(400, "invalid_json", "request body must be a JSON object")
    if config.json_schema:
        import jsonschema

        validator = jsonschema.Draft202012Validator(config.json_schema)
        error = next(iter(sorted(validator.iter_errors(body), key=lambda e: e.path)), None)
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "(body)"
            raise Refused(400, "schema_violation", f"{where}: {error.message}")
    return body


def check_lengths(prompt_tokens: int, max_tokens: int, config: GuardConfig) -> None:
    if prompt_tokens > config.max_prompt_tokens:
        raise Refused(
            400,
            "prompt_too_long",
            f"prompt is {prompt_tokens} tokens; this deployment accepts at most "
            f"{config.max_prompt_tokens}",
        )
    if max_tokens > config.max_tokens:
        raise Refused(
            400,
            "max_tokens_too_large",
            f"max_tokens is {max_tokens}; this deployment allows at most {config.max_tokens}",
        )
