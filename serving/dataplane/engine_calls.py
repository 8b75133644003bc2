"""What the version slot asks of its engine beyond generating: giving a departed tenant's
cached blocks back, and the client's answer for what the engine refuses."""

from __future__ import annotations

from typing import Any

from serving.dataplane.guard import Refused


def forget_tenant(engine: Any, tenant: str) -> bool:
    """Give back every cached KV block of `tenant` (its quota set to 0, each allocation
    recycles one of its own cached blocks, which is then released as free), then drop its
    counters once it holds no block. True when nothing of it is left."""
    # Under the engine thread's lock: the pool is only ever touched between two steps.
    with engine._lock:
        pool = engine.engine.pool
        if tenant not in pool.stats:
            return True
        pool.quotas[tenant] = 0
        while (block := pool.allocate(tenant)) is not None:
            pool.release([block])
        if pool.stats[tenant].blocks_used > 0:  # its last requests still run
            return False
        del pool.stats[tenant]
        pool.quotas.pop(tenant, None)
        return True


def engine_refusal(exc: Exception) -> Refused | None:
    """The client's answer for what the engine refuses; None: the version's own failure."""
    from serving.engine.engine import DuplicateRequest, EngineFull
    from serving.engine.memory import MemoryRefused

    if isinstance(exc, MemoryRefused):  # 413: never fits under the tenant's cap; 503: not now
        return Refused(exc.status, exc.code, exc.message)
    if isinstance(exc, EngineFull):
        return Refused(429, "kv_quota_exceeded", str(exc))
    if isinstance(exc, DuplicateRequest):
        return Refused(409, "duplicate_request_id", f"{exc}: choose another x-request-id")
    if isinstance(exc, ValueError):
        return Refused(400, "context_length_exceeded", str(exc))
    return None
