"""The explicit lifecycle of one inference request, with a timestamp for every state:
pending -> validating -> routing -> executing -> completed | failed."""

from __future__ import annotations

import time
from collections import deque
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


class LifecycleError(Exception):
    pass


@dataclass
class Lifecycle:
    request_id: str
    state: str = PENDING
    times: dict[str, float] = field(default_factory=dict)
    group: str | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        self.times.setdefault(PENDING, time.time())

    def to(self, state: str, *, error: str | None = None) -> None:
        if state not in _NEXT[self.state]:
            raise LifecycleError(f"{self.request_id}: {self.state} -> {state} is not allowed")
        self.state = state
        self.times[state] = time.time()
        if error is not None:
            self.error = error

    @property
    def done(self) -> bool:
        return self.state in (COMPLETED, FAILED)

    def as_dict(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "state": self.state,
            "group": self.group,
            "error": self.error,
            "times": dict(self.times),
        }


class RecentRequests:
    """The last N lifecycles, for the portal's request inspector."""

    def __init__(self, size: int = 200) -> None:
        self._items: deque[Lifecycle] = deque(maxlen=size)

    def add(self, lifecycle: Lifecycle) -> None:
        self._items.append(lifecycle)

    def snapshot(self) -> list[dict[str, Any]]:
        return [item.as_dict() for item in self._items]
