"""What the router holds around its deployment handles: the shared pool's request slots
(`PoolSlot`) and the retirement of the applications it calls (`Retirements`).

A handle call to an application that Serve is deleting can wait for ever: Serve's handle
router queues a request until a replica of the deployment appears, and none will. That
happens at every promote and rollback, where the canary's application is deleted in the same
config that moves its traffic back to the stable slot: a request routed to the canary just
before its replicas stopped would hang. So every call by handle races the retirement of its
application: when a reconfigure drops the application, the call is cancelled and the router
answers it from the group that replaces it. (A canary that failed to deploy is not retired:
Serve refuses its calls at once, and they count against its breaker.)
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

_T = TypeVar("_T")


class Retired(Exception):
    """The application a call went to left the router's config (or Serve's) before it
    answered."""

    def __init__(self, app: str) -> None:
        super().__init__(f"{app} was retired while the request waited for it")
        self.app = app


class Retirements:
    """One event per application the router calls by handle, set when it is dropped."""

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}

    def keep(self, apps: Iterable[str]) -> None:
        """The applications of the new config: every other one is retired now."""
        wanted = set(apps)
        for app in [a for a in self._events if a not in wanted]:
            self._events.pop(app).set()
        for app in wanted:
            self._events.setdefault(app, asyncio.Event())

    async def first(self, app: str, response: Any, waiting: Awaitable[_T]) -> _T:
        """`waiting` (the call's answer, or a stream's first event), unless `app` is retired
        first: then `response` (the DeploymentResponse or its generator) is cancelled and
        Retired raised."""
        event = self._events.get(app)
        work = asyncio.ensure_future(waiting)
        if event is None or event.is_set():
            _drop(work, response)
            raise Retired(app)
        gone = asyncio.ensure_future(event.wait())
        try:
            done, _ = await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # the client went away: so does the call
            _drop(work, response)
            raise
        finally:
            gone.cancel()
        if work not in done:
            _drop(work, response)
            raise Retired(app)
        return work.result()


def _drop(work: asyncio.Future[Any], response: Any) -> None:
    work.cancel()
    response.cancel()


class PoolSlot:
    """One of a shared deployment's pool slots (a permit of the router's gate), given back
    exactly once: when the answer is done, when a stream ends, or, for a stream the client
    dropped before it started (whose generator never runs its clean-up), when the stream
    object is collected."""

    def __init__(self, gate: asyncio.Semaphore | None) -> None:
        self._gate = gate
        self._handed = False

    @classmethod
    async def take(cls, gate: asyncio.Semaphore | None) -> PoolSlot:
        if gate is not None:
            await gate.acquire()
        return cls(gate)

    def release(self) -> None:
        gate, self._gate = self._gate, None
        if gate is not None:
            gate.release()

    def hand_to(self, owner: object) -> None:
        """`owner` (the response's body stream) gives the slot back from now on."""
        if self._gate is not None:
            self._handed = True
            weakref.finalize(owner, self.release)

    def release_unless_handed(self) -> None:
        if not self._handed:
            self.release()
