"""The router's answers on the way out: a stream's server-sent events (counted against the
version's breaker and lifecycle), the router's stats publisher, and the helpers that unwrap
what Ray wrapped around a replica's exception."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, TypeVar

from serving.dataplane import openai
from serving.dataplane.breaker import CircuitBreaker
from serving.dataplane.guard import Refused
from serving.dataplane.handles import PoolSlot
from serving.dataplane.lifecycle import COMPLETED, FAILED, Lifecycle, requests_key

_E = TypeVar("_E", bound=BaseException)


async def sse_events(
    kind: str,
    request_id: str,
    model: str,
    breaker: tuple[CircuitBreaker, float],
    first: dict[str, Any],
    stream: Any,
    life: Lifecycle,
    slot: PoolSlot | None = None,
) -> AsyncIterator[bytes]:
    try:
        async for event in chain_events(first, stream):
            if event["type"] == "token":
                yield openai.chunk_event(kind, request_id, model, event["text"], None)
            elif event["type"] == "end":
                life.answered(event)
                yield openai.chunk_event(kind, request_id, model, "", event["finish_reason"])
        yield openai.DONE
        breaker[0].record(True, breaker[1])  # held against its time to the first event
        life.to(COMPLETED)
    except Exception as exc:
        breaker[0].record(False)
        error = Refused(502, "upstream_error", f"model version failed: {short_error(exc)}")
        # The client already has its 200: the failure is told in the stream.
        life.to(FAILED, error=short_error(exc), status=200, code=error.code)
        yield f"data: {json.dumps(error.body())}\n\n".encode()
    finally:
        if not life.done:  # the client went away mid-stream
            life.to(FAILED, error="the client closed the stream", status=200, code="cancelled")
        if slot is not None:
            slot.release()


async def publish_router(redis: Any, prefix: str, snapshot: dict[str, Any]) -> None:
    """`<prefix>:router:<app>`: one JSON value per router replica (breakers, tier, split);
    its request lifecycles (`snapshot["requests"]`) go to `<prefix>:requests:<app>` in the
    same round trip, so the health tick, which reads every router's state, never parses
    them. Both expire unless refreshed."""
    app, replica = snapshot["app"], snapshot["replica"]
    state = {k: v for k, v in snapshot.items() if k != "requests"}
    async with redis.pipeline(transaction=False) as pipe:
        key = f"{prefix}:router:{app}"
        pipe.hset(key, replica, json.dumps(state, separators=(",", ":")))
        pipe.expire(key, 10)
        if "requests" in snapshot:
            requests = {"replica": replica, "pid": snapshot.get("pid"), "at": snapshot.get("at")}
            value = json.dumps({**requests, **snapshot["requests"]}, separators=(",", ":"))
            pipe.hset(requests_key(prefix, app), replica, value)
            pipe.expire(requests_key(prefix, app), 10)
        await pipe.execute()


async def chain_events(first: dict[str, Any], rest: Any) -> AsyncIterator[dict[str, Any]]:
    yield first
    async for item in rest:
        yield item


def unwrap_refused(exc: BaseException) -> Refused | None:
    """A Refused raised inside the version replica arrives wrapped by Ray."""
    return unwrap_as(exc, Refused)


def unwrap_as(exc: BaseException, kind: type[_E]) -> _E | None:
    """`exc` or the exception of type `kind` it wraps (Ray wraps a replica's exceptions)."""
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return None
        if isinstance(seen, kind):
            return seen
        cause = getattr(seen, "cause", None)
        seen = cause if isinstance(cause, BaseException) else seen.__cause__
    return None


def short_error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[-1] if text else type(exc).__name__)[:300]
