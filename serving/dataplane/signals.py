"""What a replica adds to its SLI snapshot beyond the windows: failures by reason, the engine's
queue wait, its limits (Serve's max_ongoing_requests, the engine's batch size) and the weights
it serves (the loaded checkpoint's fingerprint), so the health tick can measure errors by
reason, queue wait, saturation and the divergence of a slot's replicas (serving.slo.signals)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from serving.dataplane.guard import Refused

# A refusal's code -> the reason it counts under; other 5xx refusals count as "other",
# other 4xx ones are the client's and not failures at all.
_REFUSAL_REASONS = {
    "kv_quota_exceeded": "kv_quota",
    "circuit_open": "circuit_open",
    "upstream_error": "upstream",
}


def failure_reason(code: str | None, status: int | None, exc: BaseException | None) -> str | None:
    """The reason a request failed (serving.slo.signals.ERROR_REASONS), None when it did not
    fail by the service's side or its quota (a client's 4xx other than a KV quota)."""
    if code is not None:
        if code in _REFUSAL_REASONS:
            return _REFUSAL_REASONS[code]
        return "other" if status is not None and status >= 500 else None
    if exc is None:
        return None
    if isinstance(exc, MemoryError) or "OutOfMemory" in type(exc).__name__:
        return "out_of_memory"
    if isinstance(exc, TimeoutError):
        return "timeout"
    return "other"


def request_failure(exc: BaseException | None, client_error: bool) -> str | None:
    """Why a request that did not complete failed: `exc` is what ended it (None: unknown)."""
    if isinstance(exc, Refused):
        return failure_reason(exc.code, exc.status, None)
    if client_error:  # the client went away
        return None
    return failure_reason(None, None, exc or RuntimeError("unknown failure"))


@dataclass
class ReplicaSignals:
    """Cumulative since the replica started (like the SLI totals): failures by reason and the
    engine's queue wait (submitted until first scheduled)."""

    errors: dict[str, int] = field(default_factory=dict)
    queue_sum_s: float = 0.0
    queue_count: int = 0

    def ended(self, *, queued_s: float | None, reason: str | None) -> None:
        if queued_s is not None:
            self.queue_sum_s += max(0.0, float(queued_s))
            self.queue_count += 1
        if reason is not None:
            self.errors[reason] = self.errors.get(reason, 0) + 1

    def as_dict(self, loaded: dict[str, Any], engine: dict[str, Any]) -> dict[str, Any]:
        """`loaded`: the weights the replica serves; `engine`: its engine options."""
        return {
            "errors": dict(self.errors),
            "queue": {"sum_s": round(self.queue_sum_s, 6), "count": self.queue_count},
            "max_ongoing": max_ongoing(),
            "max_num_seqs": int(engine.get("max_num_seqs", 32)),
            "version": str(loaded.get("version", "")),
            "fingerprint": str(loaded.get("fingerprint") or ""),
        }


def max_ongoing() -> int | None:
    """Serve's max_ongoing_requests of this replica's deployment; None outside a replica."""
    try:
        from ray import serve

        config = serve.get_replica_context()._deployment_config
        return int(config.max_ongoing_requests)
    except Exception:  # outside a replica (unit tests) or an older Serve
        return None
