"""Steady synthetic traffic for the demo deployment: the `traffic` part of `make up`.

    python -m portal.demo_traffic DATA_DIR/demo/traffic.json [--rps 4]

The file (written by `demo_tenant`, mode 0600) names the deployment's completions URL and an
inference key of its own ("demo-traffic", revocable on the deployment page like any key). A
few readable prompts are sent at a steady rate, spread over two threads, so the health page
has SLIs, the canary its share, and a drill something to break. The Serve proxy is only ever
on loopback here; another host in the file is refused. A summary line every 30 s goes to the
part's log; the terminal sees nothing unless the file is unusable.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from types import FrameType
from urllib.parse import urlsplit

import httpx

logger = logging.getLogger("portal.demo_traffic")

# Sentence starts of the demo model's text (serving.engine.tiny_trained): it finishes them.
PROMPTS = (
    "A canary",
    "Deployments",
    "Rollbacks",
    "An SLA contract",
    "Drills",
    "Incidents",
    "Health checks",
    "Hello",
)
LOOPBACK = {"127.0.0.1", "::1", "localhost"}
SUMMARY_EVERY_S = 30.0
THREADS = 2


def traffic_file(data_dir: str | Path) -> Path:
    """The demo's traffic file under the portal's DATA_DIR (demo_tenant writes it)."""
    return Path(data_dir) / "demo" / "traffic.json"


class Traffic:
    def __init__(self, url: str, key: str, rps: float) -> None:
        self.url, self.key = url, key
        self.pause = THREADS / rps
        self.stop = threading.Event()
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()

    def run(self) -> None:
        threads = [threading.Thread(target=self.send, daemon=True) for _ in range(THREADS)]
        for index, thread in enumerate(threads):
            thread.start()
            self.stop.wait(self.pause * index / THREADS)  # staggered: a steady stream
        last = time.monotonic()
        while not self.stop.wait(1.0):
            if time.monotonic() - last >= SUMMARY_EVERY_S:
                last = time.monotonic()
                with self.lock:
                    seen, self.counts = dict(self.counts), Counter()
                logger.info("traffic: last %.0f s %s", SUMMARY_EVERY_S, seen or "nothing sent")
        for thread in threads:
            thread.join(timeout=15)

    def send(self) -> None:
        headers = {"authorization": f"Bearer {self.key}"}
        with httpx.Client(timeout=10, trust_env=False) as http:
            while not self.stop.is_set():
                started = time.monotonic()
                prompt = random.choice(PROMPTS)  # noqa: S311 (a demo prompt, not a secret)
                body = {"prompt": prompt, "max_tokens": 16, "temperature": 0}
                try:
                    answer = http.post(self.url, json=body, headers=headers)
                    outcome = f"{answer.status_code} {answer.headers.get('x-ab-group', '-')}"
                except httpx.HTTPError as exc:  # not up yet, or restarting: keep the pace
                    outcome = type(exc).__name__
                with self.lock:
                    self.counts[outcome] += 1
                self.stop.wait(max(0.0, self.pause - (time.monotonic() - started)))


def load(path: Path) -> tuple[str, str]:
    """(url, key) from the demo's traffic file; SystemExit with the reason when unusable."""
    try:
        data = json.loads(path.read_text())
        url, key = str(data["url"]), str(data["key"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"demo traffic: {path} is unusable: {exc}") from exc
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname not in LOOPBACK:
        raise SystemExit(f"demo traffic: only the local Serve proxy is a target, not {url!r}")
    return url, key


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path)
    parser.add_argument(
        "--rps", type=float, default=float(os.environ.get("PORTAL_DEMO_RPS", "4") or 4)
    )
    args = parser.parse_args(argv)
    if not 0.1 <= args.rps <= 50:
        parser.error("--rps: between 0.1 and 50 requests a second")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    url, key = load(args.file)
    traffic = Traffic(url, key, args.rps)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        traffic.stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    logger.info("traffic: %.1f requests a second to %s", args.rps, url)
    traffic.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
