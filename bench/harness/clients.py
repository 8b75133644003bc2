"""Client threads sending completions through the Serve proxy, every answer logged."""

from __future__ import annotations

import threading
import time

PROMPT = {"prompt": "The quick brown fox", "max_tokens": 1, "temperature": 0}
Answer = tuple[float, float, int, str]  # (sent, done, status, group)


class Clients:
    """`threads` client threads; every answer is logged as (sent, done, status, group) (group
    from `x-ab-group`, "?" when the proxy answered without the router; status 0: no answer)."""

    def __init__(
        self, url: str, key: str, threads: int = 2, *, pause_on_error: float = 0.05
    ) -> None:
        self.url, self.key, self.pause_on_error = url, key, pause_on_error
        self.log: list[Answer] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]
        for thread in self.threads:
            thread.start()

    def _run(self) -> None:
        import httpx

        headers = {"authorization": f"Bearer {self.key}"}
        with httpx.Client(timeout=30, trust_env=False) as http:
            while not self.stop.is_set():
                sent = time.time()
                try:
                    response = http.post(self.url, json=PROMPT, headers=headers)
                    status, group = response.status_code, response.headers.get("x-ab-group", "?")
                except httpx.HTTPError:
                    status, group = 0, "?"
                with self.lock:
                    self.log.append((sent, time.time(), status, group))
                if status != 200 and self.pause_on_error:
                    time.sleep(self.pause_on_error)  # a dead proxy answers at once

    def between(self, start: float, end: float) -> list[Answer]:
        """Answers that came back within [start, end]."""
        with self.lock:
            return [entry for entry in self.log if start <= entry[1] <= end]

    def since(self, start: float) -> list[Answer]:
        return self.between(start, float("inf"))

    def rate(self) -> float:
        """Answers a second over the whole log (first sent to last answered)."""
        with self.lock:
            if len(self.log) < 2:
                return 0.0
            span = self.log[-1][1] - self.log[0][0]
            return round(len(self.log) / span, 1) if span > 0 else 0.0

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=35)
