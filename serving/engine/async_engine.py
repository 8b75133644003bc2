"""The engine driven by a background thread, for asyncio callers (Ray Serve replicas).

Callers `submit()` a request and iterate its tokens; the thread steps the engine while any
request is waiting or running. `swap_model()` takes the same lock as a step, so a hot swap
lands between two steps and never inside one. Requests are known by (tenant, request id), like
the engine's sequences: a tenant reusing another tenant's id reaches nothing of the other's.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from serving.engine.engine import Engine
from serving.engine.memory import memory_caps
from serving.engine.model import LlamaModel
from serving.engine.priority import REALTIME
from serving.engine.scheduler import DuplicateRequest, SamplingParams, Sequence

Key = tuple[str, str]  # (tenant, request id)
CALLER_WAIT_S = 0.05  # the longest a step waits for callers to have their turn


class CallerFirstLock:
    """The engine's lock: a caller (the replica's event loop submitting, reading metrics,
    changing limits) goes before the next step. A plain Lock is not fair: the step thread,
    releasing it and taking it again at once, kept a caller, and with it the replica's whole
    event loop, waiting until the engine ran dry (every answer of a flood, a realtime one sent
    seconds later included, came back together). Steps wait at most CALLER_WAIT_S for callers,
    so a stream of them cannot stall the engine either. `with lock:` is a caller's turn."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting = 0
        self._turns = threading.Condition(threading.Lock())

    def __enter__(self) -> CallerFirstLock:
        with self._turns:
            self._waiting += 1
        try:
            self._lock.acquire()
        finally:
            with self._turns:
                self._waiting -= 1
                if not self._waiting:
                    self._turns.notify_all()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    @contextmanager
    def step_turn(self) -> Iterator[None]:
        """The step thread's turn: after every waiting caller's (bounded), then the lock."""
        with self._turns:
            self._turns.wait_for(lambda: self._waiting == 0, timeout=CALLER_WAIT_S)
        with self._lock:
            yield


@dataclass(frozen=True)
class TokenEvent:
    token_id: int
    finished: bool
    finish_reason: str | None
    at: float
    queued_s: float | None = None  # on the first token: submitted until first scheduled
    cached_tokens: int | None = None  # prompt tokens found in the prefix cache, said once


class EngineFailed(Exception):
    pass


class TenantRemoved(Exception):
    """The tenant was taken off this engine (its access revoked): its requests end."""


class Submission:
    """One submitted request's tokens (an async iterator). `close()` (idempotent) forgets it
    and aborts its sequence if still live: call it however the caller leaves, even before
    iterating (an unstarted async generator would never run its clean-up)."""

    def __init__(self, owner: AsyncEngine, key: Key, queue: asyncio.Queue[Any]) -> None:
        self._owner, self.key, self._queue = owner, key, queue
        self._finished = False
        self._closed = False

    def __aiter__(self) -> Submission:
        return self

    async def __anext__(self) -> TokenEvent:
        if self._finished or self._closed:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, Exception):
            self.close()
            raise item
        if item.finished:
            self._finished = True
        return item  # type: ignore[no-any-return]

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._owner._release(self.key)


class AsyncEngine:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._lock = CallerFirstLock()
        self._wake = threading.Event()
        self._queues: dict[Key, tuple[asyncio.AbstractEventLoop, asyncio.Queue[Any]]] = {}
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    def _deliver(self, key: Key, item: Any) -> None:
        entry = self._queues.get(key)
        if entry is not None:
            loop, queue = entry
            loop.call_soon_threadsafe(queue.put_nowait, item)

    def _run(self) -> None:
        while not self._stopped:
            with self._lock.step_turn():
                busy = self.engine.has_work()
                if busy:
                    try:
                        outputs = self.engine.step()
                    except Exception as exc:  # a broken step fails its requests, not the loop
                        for seq in [*self.engine.running, *self.engine.waiting]:
                            self.engine.abort(seq.id, tenant=seq.tenant)
                            self._deliver(seq.key, EngineFailed(str(exc)))
                        outputs = []
                    now = time.time()
                    for out in outputs:
                        self._deliver(
                            out.key,
                            TokenEvent(
                                out.token_id,
                                out.finished,
                                out.finish_reason,
                                now,
                                out.queued_s,
                                out.cached_tokens,
                            ),
                        )
            if not busy:
                self._wake.wait(0.05)
                self._wake.clear()

    def submit(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        tenant: str,
        request_id: str,
        cache_salt: bytes | None = None,
        priority: str = REALTIME,
    ) -> Submission:
        """Queue a request now (raises what `Engine.add_request` raises: ValueError,
        EngineFull, DuplicateRequest when the tenant already runs this id); iterate the
        result for its tokens and `close()` it when done. `priority`: realtime or batch."""
        key = (tenant, request_id)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        with self._lock:
            if key in self._queues:
                raise DuplicateRequest(f"request id {request_id!r} is already in flight")
            self.engine.add_request(
                prompt_ids,
                params,
                tenant=tenant,
                request_id=request_id,
                cache_salt=cache_salt,
                priority=priority,
            )
            self._queues[key] = (asyncio.get_running_loop(), queue)
        self._wake.set()
        return Submission(self, key, queue)

    def _release(self, key: Key) -> None:
        with self._lock:
            self._queues.pop(key, None)
            self.engine.abort(key[1], tenant=key[0])  # a client that went away frees its blocks

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        tenant: str,
        request_id: str,
        cache_salt: bytes | None = None,
        priority: str = REALTIME,
    ) -> AsyncIterator[TokenEvent]:
        submission = self.submit(
            prompt_ids,
            params,
            tenant=tenant,
            request_id=request_id,
            cache_salt=cache_salt,
            priority=priority,
        )
        try:
            async for item in submission:
                yield item
        finally:
            submission.close()

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

    def set_memory_caps(self, caps_mb: dict[str, int | None], *, shared: bool) -> None:
        """Each tenant's GPU memory cap per replica (MiB): its KV blocks are held under it at
        every allocation, its requests refused at admission (serving.engine.memory)."""
        with self._lock:
            memory_caps(self.engine, caps_mb, shared=shared)

    def drop_tenant(self, tenant: str) -> int:
        """End every live request of `tenant` (each caller gets TenantRemoved) and free its
        sequences' blocks; how many there were."""
        with self._lock:
            seqs = [s for s in [*self.engine.running, *self.engine.waiting] if s.tenant == tenant]
            for seq in seqs:
                self.engine.abort(seq.id, tenant=tenant)
                self._deliver(seq.key, TenantRemoved("this tenant was taken off this version"))
            return len(seqs)

    def set_limits(self, max_running: dict[str, int], default: int | None) -> None:
        """Per-tenant running-sequence limits (a shared pool); empty and None: none."""
        with self._lock:
            self.engine.set_limits(max_running, default)

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
