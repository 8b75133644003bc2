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
from serving.dataplane.lifecycle import COMPLETED, FAILED, Lifecycle

_E = TypeVar("_E", bound=BaseException)


async def sse_events(
    kind: str,
    request_id: str,
    model: str,
    breaker: CircuitBreaker,
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
                yield openai.chunk_event(kind, request_id, model, "", event["finish_reason"])
        yield openai.DONE
        breaker.record(True)
        life.to(COMPLETED)
    except Exception as exc:
        breaker.record(False)
        life.to(FAILED, error=short_error(exc))
        error = Refused(502, "upstream_error", f"model version failed: {short_error(exc)}")
        yield f"data: {json.dumps(error.body())}\n\n".encode()
    finally:
        if slot is not None:
            slot.release()


async def publish_router(redis: Any, prefix: str, snapshot: dict[str, Any]) -> None:
    """`<prefix>:router:<app>`: one JSON value per router replica (breakers, the last
    request lifecycles with their timestamps)."""
    key = f"{prefix}:router:{snapshot['app']}"
    async with redis.pipeline(transaction=False) as pipe:
        pipe.hset(key, snapshot["replica"], json.dumps(snapshot, separators=(",", ":")))
        pipe.expire(key, 10)
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
