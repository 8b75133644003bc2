"""portal/wsframes.py under a real uvicorn server and real WebSocket clients: one message text
sent to several sockets is framed once and reaches every client intact, compressed or not;
other messages take uvicorn's own path."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn
from websockets.asyncio.client import connect
from websockets.extensions.permessage_deflate import PerMessageDeflate
from websockets.server import ServerProtocol

from portal import wsframes

SAMPLE = '{"seq":"1-0","at":1.0,"devices":[' + ",".join(['{"util":42.5}'] * 40) + "]}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.asynccontextmanager
async def _server(app: Any, deflate: bool) -> AsyncIterator[int]:
    """uvicorn with portal.wsframes' protocol on a free port of 127.0.0.1, for the block."""
    port = _free_port()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        ws="portal.wsframes:SharedFrameProtocol",
        ws_per_message_deflate=deflate,
        lifespan="off",
        log_level="warning",
    )
    server = uvicorn.Server(config)
    serving = asyncio.ensure_future(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield port
    finally:
        server.should_exit = True
        await serving


async def _fan_out(deflate: bool, clients: int = 3) -> tuple[list[list[str]], list[Any]]:
    """Every socket gets SAMPLE (one str object for all), then a text of its own."""
    joined: list[Any] = []
    everyone_in = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "websocket"
        await receive()
        await send({"type": "websocket.accept"})
        joined.append(send)
        if len(joined) == clients:
            everyone_in.set()
        await everyone_in.wait()
        await send({"type": "websocket.send", "text": SAMPLE})
        await send({"type": "websocket.send", "text": f"own-{joined.index(send)}"})
        await receive()  # until the client leaves

    async with _server(app, deflate) as port:
        sockets = [
            await connect(f"ws://127.0.0.1:{port}/", compression="deflate" if deflate else None)
            for _ in range(clients)
        ]
        got = [[str(await ws.recv()) for _ in range(2)] for ws in sockets]
        negotiated = [ws.response.headers.get("Sec-WebSocket-Extensions") for ws in sockets]
        for ws in sockets:
            await ws.close()
    return got, negotiated


@pytest.mark.parametrize("deflate", [True, False])
def test_one_text_to_many_sockets_reaches_each_intact(
    deflate: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    framed: list[bytes] = []
    original = ServerProtocol.send_text

    def send_text(self: ServerProtocol, data: bytes, fin: bool = True) -> None:
        framed.append(bytes(data))
        original(self, data, fin)

    monkeypatch.setattr(ServerProtocol, "send_text", send_text)
    wsframes._frames.clear()
    got, negotiated = asyncio.run(_fan_out(deflate))
    assert sorted(got, key=lambda g: g[1]) == [[SAMPLE, f"own-{i}"] for i in range(3)]
    assert framed.count(SAMPLE.encode()) == 1  # framed (and compressed) once, for 3 sockets
    if deflate:
        # Each message compressed on its own: the same bytes fit every socket.
        assert all(h and "server_no_context_takeover" in h for h in negotiated)
    else:
        assert negotiated == [None, None, None]


def test_a_socket_with_a_window_of_its_own_is_not_shared() -> None:
    """A connection whose compressor keeps its context cannot take another's bytes."""
    conn = ServerProtocol()
    conn.extensions = [PerMessageDeflate(False, False, 12, 12)]
    assert wsframes._encoding(conn) is None
    conn.extensions = [PerMessageDeflate(False, True, 12, 12)]
    assert wsframes._encoding(conn) is not None
    conn.extensions = []
    assert wsframes._encoding(conn) == ()


async def _send_now_scenario() -> tuple[list[Any], list[str]]:
    """Through keep_raw_send, as portal.asgi mounts it: the app writes with RAW_SEND_NOW."""
    said: list[Any] = []

    async def inner(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "websocket.accept"})
        send_now = scope[wsframes.RAW_SEND_NOW]
        server = send.__self__
        said.append(send_now(SAMPLE))  # written before it returns: no task, no await
        server.writable.clear()  # backpressure: the transport asked to pause
        said.append(send_now("held back"))
        server.writable.set()
        said.append(send_now("own"))
        await send({"type": "websocket.close", "code": 1000})
        said.append(send_now("too late"))  # closing: uvicorn's path says what happens
        await receive()

    got: list[str] = []
    async with (
        _server(wsframes.keep_raw_send(inner), deflate=True) as port,
        connect(f"ws://127.0.0.1:{port}/", compression="deflate") as ws,
    ):
        got.extend([str(message) async for message in ws])
    return said, got


def test_send_now_writes_at_once_unless_backpressure_or_closing_stands_in_the_way() -> None:
    wsframes._frames.clear()
    said, got = asyncio.run(_send_now_scenario())
    assert said == [True, False, True, False]
    assert got == [SAMPLE, "own"]  # nothing written for a False


def test_another_server_gets_no_send_now() -> None:
    """Only SharedFrameProtocol's send is known to frame at once; any other keeps RAW_SEND."""
    seen: list[dict[str, Any]] = []

    async def inner(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(scope)

    async def plain_send(message: dict[str, Any]) -> None:
        pass

    asyncio.run(wsframes.keep_raw_send(inner)({"type": "websocket"}, None, plain_send))
    assert seen[0][wsframes.RAW_SEND] is plain_send
    assert wsframes.RAW_SEND_NOW not in seen[0]
