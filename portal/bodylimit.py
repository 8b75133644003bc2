"""ASGI middleware that caps every request body while it streams in.

Django's ASGI handler spools a whole body to a temporary file before any view runs, so a
view's own limit would come only after the disk has filled. Every HTTP route gets a cap: the
upload routes their own (ARTIFACT_UPLOAD_MAX_BYTES), every other route a small default
(REQUEST_BODY_MAX_BYTES). A declared Content-Length over the cap is refused before reading; a
body without one (chunked) is counted as it arrives and cut off (413) the moment it passes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True)
class BodyCap:
    """A byte limit (read when a request starts, so a changed setting applies at once), the
    setting that sets it and the field a refusal names."""

    limit: Callable[[], int]
    setting: str
    field: str


class BodyLimitMiddleware:
    """`limits`: (path pattern, limit) of each upload route; `default`: every other route."""

    def __init__(
        self,
        app: App,
        *,
        limits: Iterable[tuple[str, Callable[[], int]]],
        default: Callable[[], int] | None = None,
    ) -> None:
        self.app = app
        self.routes = [
            (re.compile(pattern), BodyCap(limit, "ARTIFACT_UPLOAD_MAX_BYTES", "artifact"))
            for pattern, limit in limits
        ]
        self.default = (
            None if default is None else BodyCap(default, "REQUEST_BODY_MAX_BYTES", "body")
        )

    def cap_for(self, path: str) -> BodyCap | None:
        for pattern, cap in self.routes:
            if pattern.match(path):
                return cap
        return self.default

    def _limit_for(self, path: str) -> int | None:
        cap = self.cap_for(path)
        return None if cap is None else cap.limit()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        cap = self.cap_for(scope.get("path", "")) if scope["type"] == "http" else None
        if cap is None:
            await self.app(scope, receive, send)
            return
        limit = cap.limit()
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await _refuse(send, cap, limit)
            return
        received = 0
        exceeded = False
        responded = False

        async def limited_receive() -> Message:
            nonlocal received, exceeded
            if exceeded:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    exceeded = True
                    # Django's handler stops reading on a disconnect and sends nothing.
                    return {"type": "http.disconnect"}
            return message

        async def watched_send(message: Message) -> None:
            nonlocal responded
            if message["type"] == "http.response.start":
                responded = True
            await send(message)

        await self.app(scope, limited_receive, watched_send)
        if exceeded and not responded:
            await _refuse(send, cap, limit)


def _content_length(scope: Scope) -> int | None:
    """The largest Content-Length declared (a request may repeat the header)."""
    declared: int | None = None
    for name, value in scope.get("headers", []):
        if name.lower() == b"content-length":
            try:
                length = int(value)
            except ValueError:
                continue  # the stream is still counted
            declared = length if declared is None else max(declared, length)
    return declared


async def _refuse(send: Send, cap: BodyCap, limit: int) -> None:
    message = f"The request body is larger than the limit of {limit} bytes ({cap.setting})."
    body = json.dumps(
        {
            "error": {
                "code": "too_large",
                "message": f"{cap.field}: {message}",
                "fields": {cap.field: [message]},
            }
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
