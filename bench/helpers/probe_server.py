"""The stand-in for the Serve proxy of bench/health_tick.py: 200 and a small completion for
POST .../v1/completions, HTTP/1.1 keep-alive, in its own process (so it does not share the
tick's GIL). Prints its port, exits when its stdin closes (the bench has gone)."""

import asyncio
import contextlib
import os
import sys
import threading

BODY = (
    b'{"id":"cmpl-probe","object":"text_completion","model":"bench","choices":'
    b'[{"index":0,"text":"ok","finish_reason":"length"}],'
    b'"usage":{"prompt_tokens":2,"completion_tokens":1,"total_tokens":3}}'
)
MISSING = b'{"detail":"not found"}'


async def handle(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, target = lines[0].split(" ")[:2]
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            if length:
                await reader.readexactly(length)
            ok = method == "POST" and target.endswith("/v1/completions")
            body = BODY if ok else MISSING
            status = b"200 OK" if ok else b"404 Not Found"
            writer.write(
                b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n"
                b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
            )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


def exit_with_parent():
    sys.stdin.read()  # EOF: the benchmark has gone, whatever killed it
    os._exit(0)


async def main():
    threading.Thread(target=exit_with_parent, daemon=True).start()
    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


with contextlib.suppress(KeyboardInterrupt):
    asyncio.run(main())
