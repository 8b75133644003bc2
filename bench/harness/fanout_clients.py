"""The simulated browsers of bench/ws_fanout.py: one process of WebSocket clients.

`python -m bench.harness.fanout_clients` reads its configuration as one JSON line on stdin,
opens the sockets, prints {"ready": ...} once every socket got its first sample (it has joined
the group), then obeys "start" / "stop" lines; at "stop" it writes every client's (seq,
latency) to the file it was given and prints {"done": ...}. Only the standard library, the lean
client (bench/harness/wsclient.py) and, with `"impl": "websockets"`, the websockets package:
no Django in the clients' process.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

from bench.harness import wsclient


def raise_fd_limit(needed: int) -> int:
    """Soft RLIMIT_NOFILE up to `needed` (capped by the hard limit); returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


def self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _stdin_lines() -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


def _say(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def sample_stamp(raw: bytes) -> tuple[str, float]:
    """(seq, at) of one message: the stream sends `{"seq":"<seq>","at":<at>,...` (consumers.py),
    read without parsing the rest (the clients' process is not what is measured); anything else
    is parsed in full."""
    if raw.startswith(b'{"seq":"'):
        end = raw.find(b'","at":', 8)
        stop = raw.find(b",", end + 7) if end > 0 else -1
        if stop > 0:
            return raw[8:end].decode(), float(raw[end + 7 : stop])
    sample = json.loads(raw)
    return str(sample["seq"]), float(sample["at"])


async def client_worker() -> None:
    stdin = await _stdin_lines()
    config = json.loads(await stdin.readline())
    n = int(config["clients"])
    raise_fd_limit(n + 256)
    seqs: list[list[str]] = [[] for _ in range(n)]
    lats: list[list[float]] = [[] for _ in range(n)]
    closed: dict[int, Any] = {}
    errors: list[str] = []
    sockets: list[Any] = []
    ready = [0]
    all_ready = asyncio.Event()
    limit = asyncio.Semaphore(int(config["concurrency"]))
    started = time.monotonic()

    # The lean client notes each message's bytes and arrival in its socket's callback and
    # inflates and reads them after the window (`read_held`): the work a browser does on a
    # machine of its own is kept off the two cores the server is measured on.
    held: list[list[tuple[bytes, float]]] = [[] for _ in range(n)]
    by_index: dict[int, Any] = {}

    def got(i: int, raw: bytes, now: float) -> None:
        seq, at = sample_stamp(raw)
        seqs[i].append(seq)
        lats[i].append(now - at)
        if len(seqs[i]) == 1:
            first(i)

    def first(i: int) -> None:
        ready[0] += 1
        if ready[0] == n:
            all_ready.set()

    def hold(i: int, raw: bytes, now: float) -> None:
        mine = held[i]
        mine.append((raw, now))
        if len(mine) == 1:
            first(i)

    def read_held() -> float:
        """Inflate and read every held message, each socket's in arrival order; CPU seconds."""
        cpu = self_cpu_s()
        for i, mine in enumerate(held):
            taken, held[i] = mine, []
            for raw, now in taken:
                got(i, by_index[i].inflate(raw), now)
        return self_cpu_s() - cpu

    def settle() -> None:
        if not all_ready.is_set() and len(closed) + len(errors) + ready[0] >= n:
            all_ready.set()  # nobody else will: give up waiting

    async def one_lean(i: int) -> None:
        """The default: `bench.harness.wsclient`, each message noted in its socket's callback."""

        def gone(reason: Any) -> None:
            if isinstance(reason, Exception) and not isinstance(reason, ConnectionError):
                errors.append(f"client {i}: {reason!r}")
            else:
                closed[i] = reason if isinstance(reason, int) else str(reason)
            settle()

        try:
            async with limit:
                ws = await wsclient.connect(
                    config["url"],
                    on_message=lambda raw, now: hold(i, raw, now),
                    on_close=gone,
                    origin=config["origin"],
                    cookie=config["cookie"],
                    deflate=config["deflate"],
                    inflate_later=True,
                    timeout=120,
                )
            sockets.append(ws)
            by_index[i] = ws
        except Exception as exc:  # noqa: BLE001 (reported to the parent, which decides)
            errors.append(f"client {i}: {exc!r}")
            settle()

    async def one_websockets(i: int) -> None:
        """`--client-impl websockets`: the websockets package, a task and a recv() a message."""
        from websockets.asyncio.client import connect
        from websockets.exceptions import ConnectionClosed

        try:
            async with limit:
                ws = await connect(
                    config["url"],
                    origin=config["origin"],
                    additional_headers={"Cookie": config["cookie"]},
                    compression="deflate" if config["deflate"] else None,
                    proxy=None,
                    open_timeout=120,
                    ping_interval=None,  # browsers answer the server's pings, send none
                    max_queue=None,
                )
            sockets.append(ws)
            while True:
                raw = await ws.recv(decode=False)  # bytes: no UTF-8 decoding of the whole
                got(i, raw, time.time())
            closed[i] = "closed by the server"
        except ConnectionClosed as exc:
            closed[i] = exc.rcvd.code if exc.rcvd is not None else "no close frame"
        except Exception as exc:  # noqa: BLE001 (reported to the parent, which decides)
            errors.append(f"client {i}: {exc!r}")
        finally:
            settle()

    one = one_websockets if config.get("impl") == "websockets" else one_lean
    tasks = [asyncio.ensure_future(one(i)) for i in range(n)]
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(all_ready.wait(), timeout=float(config["ready_timeout"]))
    # The sockets and the growing lists of what they got live to the end: out of the
    # collector's sight, a full collection of this process no longer stalls every client.
    gc.collect()
    gc.freeze()
    _say({"ready": ready[0], "errors": errors[:20], "closed": len(closed),
          "connect_s": round(time.monotonic() - started, 3)})  # fmt: skip
    marks: dict[str, tuple[float, float, int]] = {}
    while True:
        line = (await stdin.readline()).decode().strip()
        if line in ("start", "stop"):
            count = sum(len(s) for s in seqs) + sum(len(h) for h in held)
            marks[line] = (time.monotonic(), self_cpu_s(), count)
        if line in ("stop", ""):
            break
    if "start" in marks and "stop" in marks:
        (w0, c0, m0), (w1, c1, m1) = marks["start"], marks["stop"]
        usage = {"wall_s": w1 - w0, "cpu_s": c1 - c0, "messages": m1 - m0}
    else:
        usage = {}
    try:
        usage["read_after_s"] = round(read_held(), 3)
    except Exception as exc:  # noqa: BLE001 (a message that does not inflate or read)
        errors.append(f"reading the messages: {exc!r}")
    Path(config["out"]).write_text(
        json.dumps({"seqs": seqs, "lat": [[round(v, 6) for v in ls] for ls in lats]})
    )
    _say({"done": True, "usage": usage, "closed": {str(k): v for k, v in closed.items()},
          "errors": errors[:20]})  # fmt: skip
    for task in tasks:
        task.cancel()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(
            asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True), timeout=20
        )


def run_client_worker() -> int:
    try:
        import uvloop

        uvloop.run(client_worker())
    except ImportError:
        asyncio.run(client_worker())
    return 0


if __name__ == "__main__":
    sys.exit(run_client_worker())
