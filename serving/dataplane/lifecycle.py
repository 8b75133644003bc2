"""The explicit lifecycle of one inference request, with a timestamp for every state:
pending -> validating -> routing -> executing -> completed | failed; and what the request
inspector shows of it (trace, status, the version and replica that answered, tokens, prefix
hits). Every field is bounded, so a router's published record stays small."""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

PENDING, VALIDATING, ROUTING, EXECUTING = "pending", "validating", "routing", "executing"
COMPLETED, FAILED = "completed", "failed"
_NEXT = {
    PENDING: {VALIDATING, FAILED},
    VALIDATING: {ROUTING, FAILED},
    ROUTING: {EXECUTING, FAILED},
    EXECUTING: {COMPLETED, FAILED},
    COMPLETED: set(),
    FAILED: set(),
}
MAX_REQUEST_ID = 128  # longer client ids are replaced by one of the router's
# A request id the router keeps (and the inspector can search for): visible ASCII only.
REQUEST_ID = re.compile(rf"[!-~]{{1,{MAX_REQUEST_ID}}}\Z")
TRACE_ID = re.compile(r"[0-9a-f]{32}\Z")
MAX_ERROR = 200  # characters of an error message kept
MAX_LABEL = 64  # a version label, a replica id, an error code
RECENT_SIZE = 200  # lifecycles a router keeps and publishes
SLOW_SIZE = 20  # the slowest finished requests kept ...
SLOW_WINDOW_S = 900.0  # ... over the last 15 minutes, whatever the traffic since


def requests_key(prefix: str, app: str) -> str:
    """`<prefix>:requests:<app>`: one JSON value per router replica, {"replica", "pid", "at",
    "recent", "slow"} (published with the router's state, once a second, 10 s TTL)."""
    return f"{prefix}:requests:{app}"


class LifecycleError(Exception):
    pass


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _label(value: Any) -> str | None:
    return None if value is None else str(value)[:MAX_LABEL]


@dataclass
class Lifecycle:
    request_id: str
    state: str = PENDING
    times: dict[str, float] = field(default_factory=dict)
    group: str | None = None
    error: str | None = None
    trace_id: str | None = None
    status: int | None = None  # the HTTP status the client got
    code: str | None = None  # the error code of a refusal or failure
    version: str | None = None  # the model version that answered ...
    replica: str | None = None  # ... on this version replica (Serve's replica id) ...
    pid: int | None = None  # ... in this process
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prefix_hit_tokens: int | None = None  # prompt tokens found in the prefix cache
    on_done: Callable[[Lifecycle], None] | None = field(default=None, repr=False, compare=False)
    # A finished request's record, made once: the router publishes it every second.
    _record: dict[str, Any] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.times.setdefault(PENDING, time.time())

    def to(
        self,
        state: str,
        *,
        error: str | None = None,
        status: int | None = None,
        code: str | None = None,
    ) -> None:
        if state not in _NEXT[self.state]:
            raise LifecycleError(f"{self.request_id}: {self.state} -> {state} is not allowed")
        self.state = state
        self.times[state] = time.time()
        if error is not None:
            self.error = error[:MAX_ERROR]
        if status is not None:
            self.status = status
        elif state == COMPLETED and self.status is None:
            self.status = 200
        if code is not None:
            self.code = code[:MAX_LABEL]
        if self.done and self.on_done is not None:
            self.on_done(self)

    def answered(self, event: Mapping[str, Any]) -> None:
        """What a version's answer, or its stream's start or end event, says: the version and
        replica that served it, its token counts and prefix-cache hits (fields it lacks stay)."""
        self._record = None
        for name in ("version", "replica"):
            if event.get(name) is not None:
                setattr(self, name, _label(event[name]))
        usage = event.get("usage")
        usage = usage if isinstance(usage, Mapping) else {}
        for name, value in (
            ("pid", event.get("pid")),
            ("prompt_tokens", usage.get("prompt_tokens", event.get("prompt_tokens"))),
            ("completion_tokens", usage.get("completion_tokens")),
            ("prefix_hit_tokens", event.get("prefix_hit_tokens")),
        ):
            if _count(value) is not None:
                setattr(self, name, value)

    @property
    def done(self) -> bool:
        return self.state in (COMPLETED, FAILED)

    @property
    def ended_at(self) -> float | None:
        return self.times.get(self.state) if self.done else None

    @property
    def total_s(self) -> float:
        """Pending until the end, or until now while the request runs."""
        return (self.ended_at or time.time()) - self.times[PENDING]

    def durations_ms(self) -> dict[str, float]:
        """Milliseconds spent in each state left so far (the current one is not counted)."""
        stamps = list(self.times.items())
        return {
            state: round((after - at) * 1000, 2)
            for (state, at), (_, after) in zip(stamps, stamps[1:], strict=False)
        }

    def as_dict(self) -> dict[str, Any]:
        if self._record is not None:
            return self._record
        record = {
            "request_id": self.request_id,
            "trace_id": self.trace_id,
            "state": self.state,
            "group": self.group,
            "status": self.status,
            "code": self.code,
            "error": self.error,
            "version": self.version,
            "replica": self.replica,
            "pid": self.pid,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "prefix_hit_tokens": self.prefix_hit_tokens,
            "times": dict(self.times),
            "ms": self.durations_ms(),
            "total_ms": round(self.total_s * 1000, 2),
        }
        if self.done:
            self._record = record
        return record


class RecentRequests:
    """The last `size` lifecycles, and the `slow_size` slowest finished in the last
    `slow_window_s` (so the slow ones survive a flood of fast ones), for the portal's request
    inspector. A finished request faster than every kept slow one costs two comparisons; one
    that is kept, a pass over the slow list (`slow_size` items)."""

    def __init__(
        self,
        size: int = RECENT_SIZE,
        *,
        slow_size: int = SLOW_SIZE,
        slow_window_s: float = SLOW_WINDOW_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._items: deque[Lifecycle] = deque(maxlen=size)
        self._slow: list[Lifecycle] = []
        self._floor = 0.0  # the least total time among the kept slow ones ...
        self._first = 0.0  # ... and the earliest end among them
        self.slow_size, self.slow_window_s, self.clock = slow_size, slow_window_s, clock

    def add(self, lifecycle: Lifecycle) -> None:
        lifecycle.on_done = self._finished
        self._items.append(lifecycle)

    def _recent_enough(self, life: Lifecycle, horizon: float) -> bool:
        return (life.ended_at or 0.0) >= horizon

    def _finished(self, life: Lifecycle) -> None:
        total, horizon = life.total_s, self.clock() - self.slow_window_s
        if len(self._slow) == self.slow_size and total <= self._floor and self._first >= horizon:
            return  # the usual case: faster than every kept one, none of which expired
        slow = [s for s in self._slow if self._recent_enough(s, horizon)]
        if len(slow) < self.slow_size:
            slow.append(life)
        else:
            weakest = min(range(len(slow)), key=lambda i: slow[i].total_s)
            if total > slow[weakest].total_s:
                slow[weakest] = life
        self._slow = slow
        self._floor = min(s.total_s for s in slow)
        self._first = min(s.ended_at or 0.0 for s in slow)

    def snapshot(self) -> dict[str, list[dict[str, Any]]]:
        """{"recent": oldest first, "slow": slowest first}."""
        horizon = self.clock() - self.slow_window_s
        slow = [s for s in self._slow if self._recent_enough(s, horizon)]
        slow.sort(key=lambda s: s.total_s, reverse=True)
        return {
            "recent": [item.as_dict() for item in self._items],
            "slow": [item.as_dict() for item in slow],
        }
