"""uvicorn's WebSocket protocol (websockets' sans-I/O implementation) with one change for
fan-out: a message text sent to many sockets is framed, and compressed, once per process.

The GPU stream hands the same `str` object to every socket of a group (serving/telemetry/
consumers.py). Here the first socket to send it builds the frame through websockets as usual;
every other socket whose frames would come out byte for byte the same writes those bytes.
For that, permessage-deflate is negotiated with `server_no_context_takeover`: each message is
compressed on its own (same input, same settings: same bytes), which browsers support (RFC
7692 lets the server ask for it). A sample then compresses about 3x instead of about 10x with
a window per socket, and costs one deflate per process instead of one per socket (14 us each;
bench/ws_fanout.py). Every other message, and every socket in any other state, takes uvicorn's
own path.
"""

from __future__ import annotations

import functools
from typing import Any

from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.extensions.permessage_deflate import (
    PerMessageDeflate,
    ServerPerMessageDeflateFactory,
)
from websockets.protocol import State
from websockets.server import ServerProtocol

RAW_SEND = "portal.raw_send"  # the scope key of the server's own send (keep_raw_send)
# The scope key of the server's `send_now(text) -> bool` (SharedFrameProtocol only): the frame
# written before it returns, no task or await, or False when it must go through `send`.
RAW_SEND_NOW = "portal.raw_send_now"
_CACHE_SIZE = 64  # texts in flight at once: one per group a process streams
_frames: dict[tuple[int, Any], tuple[str, bytes]] = {}


def _encoding(conn: ServerProtocol) -> Any:
    """What a text frame's bytes depend on for this connection; None: not shareable."""
    extensions = conn.extensions
    if not extensions:
        return ()
    if len(extensions) == 1 and isinstance(extensions[0], PerMessageDeflate):
        deflate = extensions[0]
        if deflate.local_no_context_takeover:
            return ("deflate", deflate.local_max_window_bits, str(deflate.compress_settings))
    return None


def keep_raw_send(app: Any) -> Any:
    """The server's own `send` in the scope, for streams whose messages need none of the
    middleware's work (channels' session wrapper acts on http.response.start only): the GPU
    stream's samples skip it (serving/telemetry/consumers.py)."""

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> Any:
        raw = {RAW_SEND: send}
        server = getattr(send, "__self__", None)  # uvicorn passes its protocol's bound send
        if isinstance(server, SharedFrameProtocol):
            raw[RAW_SEND_NOW] = server.send_now
        return await app({**scope, **raw}, receive, send)

    return wrapped


class SharedFrameProtocol(WebSocketsSansIOProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.config.ws_per_message_deflate:  # uvicorn's settings, without a window per socket
            factory = ServerPerMessageDeflateFactory(
                server_no_context_takeover=True,
                server_max_window_bits=12,
                client_max_window_bits=12,
                compress_settings={"memLevel": 5},
            )
            self.conn = ServerProtocol(
                extensions=[factory], max_size=self.config.ws_max_size, logger=self.conn.logger
            )

    @functools.cached_property
    def frame_encoding(self) -> Any:
        """_encoding of this connection, read once its handshake is done (the extensions are
        fixed from then on): send_now runs once per socket per sample."""
        return _encoding(self.conn)

    async def send(self, message: Any) -> None:
        text = message.get("text") if message["type"] == "websocket.send" else None
        if text is None:
            return await super().send(message)
        await self.writable.wait()
        if self.disconnected:
            raise ClientDisconnected
        if not self.send_now(text):
            return await super().send(message)
        return None

    def send_now(self, text: str) -> bool:
        """Write `text` as one shared frame at once, when nothing stands in the way: the socket
        open and writable (not paused by backpressure), its frames shareable. False: nothing
        was written, `send` takes it (and waits, or takes uvicorn's own path)."""
        if (
            not self.writable.is_set()
            or self.disconnected
            or not self.handshake_complete
            or self.close_sent
            or self.initial_response is not None
            or self.conn.state is not State.OPEN
        ):
            return False
        encoding = self.frame_encoding
        if encoding is None:
            return False
        key = (id(text), encoding)
        cached = _frames.get(key)
        if cached is not None and cached[0] is text:
            self.transport.write(cached[1])
            return True
        pending = b"".join(self.conn.data_to_send())  # nothing, as uvicorn writes all at once
        self.conn.send_text(text.encode())
        frame = b"".join(self.conn.data_to_send())
        if len(_frames) >= _CACHE_SIZE:
            _frames.clear()
        _frames[key] = (text, frame)
        self.transport.write(pending + frame)
        return True
