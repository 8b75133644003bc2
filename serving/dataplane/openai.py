"""OpenAI-compatible request parsing and response shapes (completions, chat completions,
server-sent events)."""

from __future__ import annotations

import json
import time
from typing import Any

from serving.dataplane.guard import Refused
from serving.engine.chat import plain


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise Refused(400, "invalid_parameter", f"{name} must be a number in [{low}, {high}]")
    return float(value)


MAX_STOP = 4  # OpenAI's own limit on stop sequences
MAX_STOP_CHARS = 256
# Parameters of OpenAI's API this server does not honour, with the value that means "off": a
# request asking for anything else is refused (400 naming the field), never silently ignored.
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "n": (None, 1),
    "best_of": (None, 1),
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "suffix": (None, ""),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "function_call": (None, "none"),
    "response_format": (None, {"type": "text"}),
}


def _refuse_unsupported(body: dict[str, Any]) -> None:
    for name, off in UNSUPPORTED.items():
        value = body.get(name)
        if value is not None and not any(value == o and type(value) is type(o) for o in off):
            raise Refused(
                400,
                "unsupported_parameter",
                f"{name} is not supported by this server (leave it out, or send "
                f"{json.dumps(off[1])})",
            )


def stop_sequences(body: dict[str, Any]) -> list[str]:
    """`stop`: a string or up to MAX_STOP strings; generation ends before the first one."""
    stop = body.get("stop")
    if stop is None:
        return []
    items = [stop] if isinstance(stop, str) else stop
    if (
        not isinstance(items, list)
        or len(items) > MAX_STOP
        or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in items)
    ):
        raise Refused(
            400,
            "invalid_parameter",
            f"stop must be a string or a list of at most {MAX_STOP} non-empty strings of at "
            f"most {MAX_STOP_CHARS} characters",
        )
    return list(items)


def first_stop(text: str, stops: list[str], start: int = 0) -> int | None:
    """Where the first of `stops` begins in `text` (searching from `start`), or None."""
    found = [i for i in (text.find(stop, start) for stop in stops) if i >= 0]
    return min(found) if found else None


def sampling_fields(body: dict[str, Any]) -> dict[str, Any]:
    _refuse_unsupported(body)
    if "cache_salt" in body:  # vLLM's server takes one from clients; here it is the platform's
        raise Refused(
            400,
            "invalid_parameter",
            "cache_salt is set by the platform for each tenant (leave it out)",
        )
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens", 16))
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise Refused(400, "invalid_parameter", "max_tokens must be a positive integer")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise Refused(400, "invalid_parameter", "seed must be an integer")
    return {
        "max_tokens": max_tokens,
        "temperature": _number(body, "temperature", 1.0, 0.0, 2.0),
        "top_p": _number(body, "top_p", 1.0, 1e-9, 1.0),
        "seed": seed,
        "stream": bool(body.get("stream", False)),
        "stop": stop_sequences(body),
    }


def messages_of(body: dict[str, Any]) -> list[dict[str, str]]:
    """A chat request's messages: each with a role (system, user, assistant) and string
    content, nothing else kept."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise Refused(400, "invalid_parameter", "messages must be a non-empty list")
    clean = []
    for index, message in enumerate(messages):
        if (
            not isinstance(message, dict)
            or message.get("role") not in ("system", "user", "assistant")
            or not isinstance(message.get("content"), str)
        ):
            raise Refused(
                400,
                "invalid_parameter",
                f"messages[{index}] needs a role (system, user, assistant) and string content",
            )
        clean.append({"role": message["role"], "content": message["content"]})
    return clean


def prompt_of(kind: str, body: dict[str, Any]) -> str:
    """A completion's prompt; a chat's messages in the plain format (the version server
    applies the model's own chat template when it has one)."""
    if kind == "completions":
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str) or not prompt:
            raise Refused(400, "invalid_parameter", "prompt must be a non-empty string")
        return prompt
    return plain(messages_of(body))


def models_body(config: dict[str, Any], groups: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`GET /v1/models`: the deployment's name once per slot, with the slot's version."""
    deployment = str(config.get("deployment"))
    return {
        "object": "list",
        "data": [
            {"id": deployment, "object": "model", "version": g.get("version"), "group": name}
            for name, g in groups.items()
        ],
    }


def completion_body(
    kind: str, request_id: str, model: str, text: str, reason: str | None, usage: dict[str, int]
) -> dict[str, Any]:
    created = int(time.time())
    if kind == "completions":
        choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": reason}
        obj = "text_completion"
    else:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": reason,
        }
        obj = "chat.completion"
    return {
        "id": request_id,
        "object": obj,
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage,
    }


def chunk_event(kind: str, request_id: str, model: str, text: str, reason: str | None) -> bytes:
    if kind == "completions":
        choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": reason}
        obj = "text_completion"
    else:
        choice = {"index": 0, "delta": {"content": text}, "finish_reason": reason}
        obj = "chat.completion.chunk"
    payload = {
        "id": request_id,
        "object": obj,
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
    }
    return f"data: {json.dumps(payload)}\n\n".encode()


DONE = b"data: [DONE]\n\n"
