"""The engine driven by a background thread, for asyncio callers (Ray Serve replicas).

Callers `submit()` a request and iterate its tokens; the thread steps the engine while any
request is waiting or running. `swap_model()` takes the same lock as a step, so a hot swap
lands between two steps and never inside one.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from serving.engine.engine import Engine, SamplingParams, Sequence
from serving.engine.model import LlamaModel


@dataclass(frozen=True)
class TokenEvent:
    token_id: int
    finished: bool
    finish_reason: str | None
    at: float


class EngineFailed(Exception):
    pass


class AsyncEngine:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[Any]]] = {}
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    def _deliver(self, request_id: str, item: Any) -> None:
        entry = self._queues.get(request_id)
        if entry is not None:
            loop, queue = entry
            loop.call_soon_threadsafe(queue.put_nowait, item)

    def _run(self) -> None:
        while not self._stopped:
            with self._lock:
                busy = self.engine.has_work()
                if busy:
                    try:
                        outputs = self.engine.step()
                    except Exception as exc:  # a broken step fails its requests, not the loop
                        for seq in [*self.engine.running, *self.engine.waiting]:
                            self.engine.abort(seq.id)
                            self._deliver(seq.id, EngineFailed(str(exc)))
                        outputs = []
                    now = time.time()
                    for out in outputs:
                        self._deliver(
                            out.request_id,
                            TokenEvent(out.token_id, out.finished, out.finish_reason, now),
                        )
            if not busy:
                self._wake.wait(0.05)
                self._wake.clear()

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        tenant: str,
        request_id: str,
        cache_salt: bytes | None = None,
    ) -> AsyncIterator[TokenEvent]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._queues[request_id] = (loop, queue)
        try:
            with self._lock:
                self.engine.add_request(
                    prompt_ids, params, tenant=tenant, request_id=request_id, cache_salt=cache_salt
                )
            self._wake.set()
            while True:
                item = await queue.get()
                if isinstance(item, Exception):
                    raise item
                yield item
                if item.finished:
                    return
        finally:
            self._queues.pop(request_id, None)
            with self._lock:
                self.engine.abort(request_id)  # a client that went away frees its blocks

    def check_admissible(self, prompt_tokens: int, max_tokens: int, tenant: str) -> None:
        with self._lock:
            self.engine.check_admissible(prompt_tokens, max_tokens, tenant)

    def swap_model(self, model: LlamaModel) -> None:
        with self._lock:
            self.engine.swap_model(model)

    def set_quotas(self, quotas: dict[str, int], default_quota: int | None) -> None:
        with self._lock:
            self.engine.pool.quotas = dict(quotas)
            self.engine.pool.default_quota = default_quota

    def metrics(self) -> dict[str, Any]:
        with self._lock:
            return self.engine.metrics()

    def running(self) -> list[Sequence]:
        with self._lock:
            return list(self.engine.running)

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout=5)
