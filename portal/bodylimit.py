"""ASGI middleware that caps request bodies on chosen paths while they stream in.

Django's ASGI handler spools a whole body to a temporary file before any view runs, so a
view's own limit would come only after the disk has filled. This refuses a declared
Content-Length over the limit before reading, and cuts a body off (413) the moment the bytes
received pass it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


class BodyLimitMiddleware:
    def __init__(self, app: App, *, limits: Iterable[tuple[str, Callable[[], int]]]) -> None:
        self.app = app
        self.limits = [(re.compile(pattern), limit) for pattern, limit in limits]

    def _limit_for(self, path: str) -> int | None:
        for pattern, limit in self.limits:
            if pattern.match(path):
                return limit()
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit = self._limit_for(scope.get("path", "")) if scope["type"] == "http" else None
        if limit is None:
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await _refuse(send, limit)
            return
        received = 0
        exceeded = False

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

        await self.app(scope, limited_receive, send)
        if exceeded:
            await _refuse(send, limit)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _refuse(send: Send, limit: int) -> None:
    message = f"The upload is larger than the limit of {limit} bytes (ARTIFACT_UPLOAD_MAX_BYTES)."
    body = json.dumps(
        {
            "error": {
                "code": "too_large",
                "message": f"artifact: {message}",
                "fields": {"artifact": [message]},
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
