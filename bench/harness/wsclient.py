"""A lean WebSocket client for benches that hold thousands of sockets in one process.

Each socket is an `asyncio.Protocol`: a message is parsed in the transport's own callback and
handed to `on_message(data, arrived)`, where `arrived` is the time the bytes were read, taken
before any parsing. No task, future or queue per message (the `websockets` package costs ~45
us a message that way, which at 2,000 sockets on 2 cores is most of what a fan-out bench would
measure). It speaks what a browser speaks to the portal: RFC 6455 (client frames masked,
server pings answered, the close handshake) and RFC 7692 permessage-deflate, offered as
browsers offer it (`client_max_window_bits`, any server parameters accepted). Standard library
only: the bench's client processes import no Django.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import time
import zlib
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
MAX_HANDSHAKE = 16 * 1024
MAX_MESSAGE = 16 * 1024 * 1024
OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
DEFLATE_TAIL = b"\x00\x00\xff\xff"


class Deflated(bytes):
    """A message still compressed (`inflate_later`): `WsClient.inflate` it, in arrival order."""


class HandshakeError(Exception):
    """The server did not open the WebSocket (status, headers or accept key)."""


class ProtocolError(Exception):
    """The server broke RFC 6455 / 7692 (a masked frame, an unknown opcode, a bad size)."""


def accept_key(key: str) -> str:
    return base64.b64encode(hashlib.sha1(key.encode() + GUID).digest()).decode()  # noqa: S324


def mask_frame(opcode: int, payload: bytes) -> bytes:
    """One final client frame (masked, as RFC 6455 requires of clients); control-sized."""
    if len(payload) > 125:
        raise ValueError("client frames here are control frames (at most 125 bytes)")
    mask = os.urandom(4)
    key = (mask * (len(payload) // 4 + 1))[: len(payload)]
    body = (int.from_bytes(payload, "big") ^ int.from_bytes(key, "big")).to_bytes(
        len(payload), "big"
    )
    return bytes((0x80 | opcode, 0x80 | len(payload))) + mask + body


class WsClient(asyncio.Protocol):
    def __init__(
        self,
        request: bytes,
        key: str,
        on_message: Callable[[bytes, float], None],
        on_close: Callable[[Any], None],
        inflate_later: bool = False,
    ) -> None:
        self.request, self.key = request, key
        self.inflate_later = inflate_later
        self.on_message, self.on_close = on_message, on_close
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.closed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None
        self.head: bytearray | None = bytearray()  # the handshake's bytes until it is done
        self.buf = bytearray()
        self.parts: list[bytes] = []
        self.compressed = False
        self.inflater: Any = None  # zlib.decompressobj once permessage-deflate is agreed
        self.close_sent = False

    # -- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment] (uvloop's is no asyncio.Transport)
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        arrived = time.time()
        try:
            if self.head is not None:
                data = self._handshake(data)
                if not data:
                    return
            buf = self.buf
            buf += data
            while len(buf) >= 2:
                if not self._frame(buf, arrived):
                    break
        except Exception as exc:  # noqa: BLE001 (ends this socket, reported by on_close)
            self._end(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(exc if exc is not None else "connection lost")

    # -- the opening handshake ----------------------------------------------------------
    def _handshake(self, data: bytes) -> bytes:
        assert self.head is not None
        self.head += data
        end = self.head.find(b"\r\n\r\n")
        if end < 0:
            if len(self.head) > MAX_HANDSHAKE:
                raise HandshakeError("the server's handshake has no end")
            return b""
        lines = bytes(self.head[:end]).decode("latin-1").split("\r\n")
        rest = bytes(self.head[end + 4 :])
        self.head = None
        status = lines[0].split(" ", 2)
        if len(status) < 2 or status[1] != "101":
            raise HandshakeError(f"the server answered {lines[0]!r}")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("sec-websocket-accept") != accept_key(self.key):
            raise HandshakeError("Sec-WebSocket-Accept does not match the key sent")
        extensions = headers.get("sec-websocket-extensions", "")
        if extensions:
            if not extensions.lower().startswith("permessage-deflate"):
                raise HandshakeError(f"unasked-for extension {extensions!r}")
            self.inflater = zlib.decompressobj(-zlib.MAX_WBITS)
        self.opened.set_result(None)
        return rest

    # -- frames -------------------------------------------------------------------------
    def _frame(self, buf: bytearray, arrived: float) -> bool:
        """Take one whole frame off `buf` (False: it is not all here yet)."""
        b0, b1 = buf[0], buf[1]
        if b1 & 0x80:
            raise ProtocolError("a masked frame from the server")
        size, start = b1 & 0x7F, 2
        if size == 126:
            if len(buf) < 4:
                return False
            size, start = int.from_bytes(buf[2:4], "big"), 4
        elif size == 127:
            if len(buf) < 10:
                return False
            size, start = int.from_bytes(buf[2:10], "big"), 10
        if size > MAX_MESSAGE:
            raise ProtocolError(f"a {size}-byte frame")
        if len(buf) < start + size:
            return False
        payload = bytes(buf[start : start + size])
        del buf[: start + size]
        opcode = b0 & 0x0F
        if opcode >= OP_CLOSE:
            self._control(opcode, payload)
            return True
        if opcode in (OP_TEXT, OP_BINARY):
            self.parts, self.compressed = [payload], bool(b0 & 0x40)
        elif opcode == OP_CONT and self.parts:
            self.parts.append(payload)
        else:
            raise ProtocolError(f"opcode {opcode} out of place")
        if b0 & 0x80:  # FIN: the message is whole
            message = self.parts[0] if len(self.parts) == 1 else b"".join(self.parts)
            self.parts = []
            if self.compressed:
                if self.inflater is None:
                    raise ProtocolError("a compressed message without permessage-deflate")
                message = Deflated(message)
                if not self.inflate_later:
                    message = self.inflate(message)
            self.on_message(message, arrived)
        return True

    def _control(self, opcode: int, payload: bytes) -> None:
        assert self.transport is not None
        if opcode == OP_PING:
            self.transport.write(mask_frame(OP_PONG, payload))
        elif opcode == OP_CLOSE:
            code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else 1005
            if not self.close_sent:
                self.close_sent = True
                self.transport.write(mask_frame(OP_CLOSE, payload[:2]))
            self.transport.close()
            self._end(code)
        elif opcode != OP_PONG:
            raise ProtocolError(f"control opcode {opcode}")

    def _end(self, reason: Any) -> None:
        """The socket is over: `on_close(reason)` once (a close code, a string, or the
        exception that ended it), only for a socket that opened (else `connect` raises)."""
        was_open = self.opened.done() and self.opened.exception() is None
        if not self.opened.done():
            error = reason if isinstance(reason, Exception) else HandshakeError(str(reason))
            self.opened.set_exception(error)
        if not self.closed.done():
            self.closed.set_result(reason)
            if was_open:
                self.on_close(reason)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    # -- the caller's side --------------------------------------------------------------
    def inflate(self, message: bytes) -> bytes:
        """The message as sent: a Deflated one decompressed. With `inflate_later`, call it on
        every message in the order they came (the server's window may span messages)."""
        if type(message) is not Deflated:
            return message
        return bytes(self.inflater.decompress(message + DEFLATE_TAIL))

    async def close(self, timeout: float = 10.0) -> Any:
        """The close handshake (1000): send ours, wait for the server's, then drop the socket."""
        if self.transport is not None and not self.closed.done() and not self.close_sent:
            self.close_sent = True
            self.transport.write(mask_frame(OP_CLOSE, (1000).to_bytes(2, "big")))
        try:
            return await asyncio.wait_for(asyncio.shield(self.closed), timeout)
        except TimeoutError:
            self._end("close timed out")
            return "close timed out"


async def connect(
    url: str,
    *,
    on_message: Callable[[bytes, float], None],
    on_close: Callable[[Any], None],
    origin: str | None = None,
    cookie: str | None = None,
    deflate: bool = True,
    inflate_later: bool = False,
    timeout: float = 60.0,
) -> WsClient:
    """Open `url` (ws://host:port/path?query) and return its socket once the server said 101.
    `inflate_later`: compressed messages reach `on_message` as `Deflated`, for the caller to
    inflate when it likes (a bench takes arrival times now and does the work after)."""
    parts = urlsplit(url)
    if parts.scheme != "ws" or not parts.hostname:
        raise ValueError(f"url: a ws://host:port/ address, got {url!r}")
    port = parts.port or 80
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    key = base64.b64encode(os.urandom(16)).decode()
    headers = [
        f"GET {target} HTTP/1.1",
        f"Host: {parts.hostname}:{port}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
    ]
    if origin:
        headers.append(f"Origin: {origin}")
    if cookie:
        headers.append(f"Cookie: {cookie}")
    if deflate:
        headers.append("Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits")
    request = ("\r\n".join(headers) + "\r\n\r\n").encode("latin-1")
    loop = asyncio.get_running_loop()
    _, client = await asyncio.wait_for(
        loop.create_connection(
            lambda: WsClient(request, key, on_message, on_close, inflate_later),
            parts.hostname,
            port,
        ),
        timeout,
    )
    await asyncio.wait_for(asyncio.shield(client.opened), timeout)
    return client
