"""bench/harness/wsclient.py, the fan-out bench's simulated browsers, against a real server
(the websockets package's, on 127.0.0.1): what it reads is what the server sent, whatever the
framing, compression window or split of the bytes; it answers pings and the close handshake,
and says why a server refused it."""

from __future__ import annotations

import asyncio
import os
import zlib
from http import HTTPStatus
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection, serve

from bench.harness import wsclient

TEXTS = ['{"seq":"1-0","at":1.5,"util":[' + ",".join(["42.5"] * 200) + "]}"] * 3
BIG = os.urandom(70_000)  # past 65,535 bytes: the 8-byte length, and deflate cannot shrink it


async def _scenario(deflate: bool, inflate_later: bool) -> dict[str, Any]:
    pinged: list[bool] = []

    async def handler(ws: ServerConnection) -> None:
        for text in TEXTS:
            await ws.send(text)
        await ws.send(["frag", "mented ", "text"])  # one message in three frames
        await ws.send(BIG)
        pong = await ws.ping(b"are you there")
        await asyncio.wait_for(pong, 5)
        pinged.append(True)
        await ws.close(4403, "go away")

    got: list[bytes] = []
    closed: list[Any] = []
    async with serve(handler, "127.0.0.1", 0, compression="deflate" if deflate else None) as srv:
        port = srv.sockets[0].getsockname()[1]
        client = await wsclient.connect(
            f"ws://127.0.0.1:{port}/ws?x=1",
            on_message=lambda raw, arrived: got.append(raw),
            on_close=closed.append,
            deflate=deflate,
            inflate_later=inflate_later,
            timeout=5,
        )
        reason = await asyncio.wait_for(asyncio.shield(client.closed), 5)
    return {"client": client, "got": got, "closed": closed, "reason": reason, "pinged": pinged}


@pytest.mark.parametrize(
    ("deflate", "inflate_later"), [(True, False), (True, True), (False, False)]
)
def test_what_it_reads_is_what_the_server_sent(deflate: bool, inflate_later: bool) -> None:
    seen = asyncio.run(_scenario(deflate, inflate_later))
    client = seen["client"]
    kinds = {type(raw) for raw in seen["got"]}
    if inflate_later:
        assert wsclient.Deflated in kinds  # held as sent, read after
    else:
        assert wsclient.Deflated not in kinds
    messages = [client.inflate(raw) for raw in seen["got"]]
    assert messages == [t.encode() for t in TEXTS] + [b"fragmented text", BIG]
    assert seen["pinged"] == [True]  # the server's ping got its pong
    assert seen["closed"] == [4403] and seen["reason"] == 4403


def test_a_frame_split_anywhere_still_reads_whole() -> None:
    """The bytes of a compressed frame and a ping handed over one at a time."""
    text = b'{"seq":"7-1","at":2.0}' * 20
    deflater = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    body = (deflater.compress(text) + deflater.flush(zlib.Z_SYNC_FLUSH))[:-4]
    frame = bytes((0xC1, 126)) + len(body).to_bytes(2, "big") + body
    ping = bytes((0x89, 2)) + b"hi"
    got: list[bytes] = []
    written: list[bytes] = []

    class Transport:
        def write(self, data: bytes) -> None:
            written.append(data)

    async def scenario() -> None:
        client = wsclient.WsClient(b"", "key", lambda raw, at: got.append(raw), print)
        client.transport = Transport()  # type: ignore[assignment]
        client.head, client.inflater = None, zlib.decompressobj(-zlib.MAX_WBITS)
        for i in range(len(frame + ping)):
            client.data_received((frame + ping)[i : i + 1])

    asyncio.run(scenario())
    assert got == [text]
    pong = written[0]
    assert pong[0] == 0x8A and pong[1] == 0x80 | 2  # a masked pong with the ping's payload
    assert bytes(b ^ pong[2 + i % 4] for i, b in enumerate(pong[6:])) == b"hi"


def test_a_refused_handshake_says_what_the_server_answered() -> None:
    def refuse(connection: ServerConnection, request: Any) -> Any:
        return connection.respond(HTTPStatus.FORBIDDEN, "not yours\n")

    async def scenario() -> None:
        async def handler(ws: ServerConnection) -> None:
            await ws.wait_closed()

        async with serve(handler, "127.0.0.1", 0, process_request=refuse) as srv:
            port = srv.sockets[0].getsockname()[1]
            await wsclient.connect(
                f"ws://127.0.0.1:{port}/", on_message=print, on_close=print, timeout=5
            )

    with pytest.raises(wsclient.HandshakeError, match="403"):
        asyncio.run(scenario())


def test_its_own_close_gets_the_servers_answer() -> None:
    async def scenario() -> Any:
        async def handler(ws: ServerConnection) -> None:
            await ws.wait_closed()

        async with serve(handler, "127.0.0.1", 0) as srv:
            port = srv.sockets[0].getsockname()[1]
            client = await wsclient.connect(
                f"ws://127.0.0.1:{port}/", on_message=print, on_close=print, timeout=5
            )
            return await client.close(timeout=5)

    assert asyncio.run(scenario()) == 1000


def test_only_a_ws_address_is_taken() -> None:
    with pytest.raises(ValueError, match="url"):
        asyncio.run(wsclient.connect("http://127.0.0.1:1/", on_message=print, on_close=print))
