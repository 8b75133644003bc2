"""The demo's traffic part: it reads its target and key from the file demo_tenant wrote, sends
only to the local Serve proxy, keeps a steady pace and counts what comes back."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from portal.demo_traffic import PROMPTS, Traffic, load, traffic_file


class _Proxy(BaseHTTPRequestHandler):
    seen: list[dict[str, Any]] = []  # noqa: RUF012 (one server per test)

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        type(self).seen.append({"auth": self.headers["authorization"], **body})
        failing = len(type(self).seen) % 4 == 0  # every fourth: the canary's error burst
        self.send_response(503 if failing else 200)
        self.send_header("x-ab-group", "canary" if failing else "stable")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: Any) -> None:
        pass


def _write(path: Path, url: str, key: str = "ik_demo") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"url": url, "key": key}))
    return path


def test_the_traffic_file_must_name_the_local_proxy(tmp_path: Path) -> None:
    path = traffic_file(tmp_path)
    assert path == tmp_path / "demo" / "traffic.json"
    with pytest.raises(SystemExit, match="unusable"):
        load(path)  # not written yet
    _write(path, "http://127.0.0.1:8001/demo/demo/v1/completions")
    assert load(path) == ("http://127.0.0.1:8001/demo/demo/v1/completions", "ik_demo")
    for url in ("http://10.0.0.8:8001/x", "https://127.0.0.1/x", "file:///etc/passwd"):
        _write(path, url)
        with pytest.raises(SystemExit, match="only the local Serve proxy"):
            load(path)
    path.write_text("{not json")
    with pytest.raises(SystemExit, match="unusable"):
        load(path)


def test_it_sends_at_a_steady_pace_and_counts_the_answers() -> None:
    _Proxy.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Proxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/demo/demo/v1/completions"
    traffic = Traffic(url, "ik_demo", rps=20)
    runner = threading.Thread(target=traffic.run)
    try:
        runner.start()
        time.sleep(1.5)
    finally:
        traffic.stop.set()
        runner.join(timeout=20)
        server.shutdown()
        server.server_close()
    assert not runner.is_alive()
    sent = len(_Proxy.seen)
    assert 15 <= sent <= 40, sent  # ~20 a second for 1.5 s
    assert {s["auth"] for s in _Proxy.seen} == {"Bearer ik_demo"}
    assert {s["prompt"] for s in _Proxy.seen} <= set(PROMPTS)
    assert traffic.counts["200 stable"] >= 1 and traffic.counts["503 canary"] >= 1
    assert sum(traffic.counts.values()) == sent
