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
        return await app({**scope, RAW_SEND: send}, receive, send)

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

    async def send(self, message: Any) -> None:
        text = message.get("text") if message["type"] == "websocket.send" else None
        if text is None:
            return await super().send(message)
        await self.writable.wait()
        if self.disconnected:
            raise ClientDisconnected
        encoding = _encoding(self.conn)
        if (
            encoding is None
            or not self.handshake_complete
            or self.close_sent
            or self.initial_response is not None
            or self.conn.state is not State.OPEN
        ):
            return await super().send(message)
        key = (id(text), encoding)
        cached = _frames.get(key)
        if cached is not None and cached[0] is text:
            self.transport.write(cached[1])
            return None
        pending = b"".join(self.conn.data_to_send())  # nothing, as uvicorn writes all at once
        self.conn.send_text(text.encode())
        frame = b"".join(self.conn.data_to_send())
        if len(_frames) >= _CACHE_SIZE:
            _frames.clear()
        _frames[key] = (text, frame)
        self.transport.write(pending + frame)
        return None
