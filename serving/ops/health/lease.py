"""The health tick's shards and their leases: deployment `pk % shards == shard` belongs to shard
`shard`, and one Redis lock per shard lets one worker tick it at a time. The lock is a lease:
it lives LEASE_S and a keeper thread renews it while its tick runs, so a worker that dies (a
SIGKILL, a lost node, Celery's hard time limit) hands its shard over LEASE_S later to whichever
worker picks up that shard's next tick; a live tick is never overtaken however long it takes."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

LEASE_S = 10.0  # a dead holder's shard is free this long after its last renewal
RENEW_EVERY = 1 / 3  # of LEASE_S: two renewals can fail before the lease runs out

# Extend the lease only while this holder's token is still in it.
RENEW_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""


def shard_label(shard: int, shards: int) -> str:
    return f"{shard}/{shards}"


def shard_lock_key(lock_key: str, shard: int, shards: int) -> str:
    """The lease of one shard. A single shard keeps the unsharded tick's key, so a tick run
    by hand (`tick()`) and the beat's excludes each other as before."""
    if not 0 <= shard < shards:
        raise ValueError(f"shard {shard} is not one of {shards}")
    return lock_key if shards == 1 else f"{lock_key}:shard:{shard_label(shard, shards)}"


def in_shard(deployment_id: int, shard: int, shards: int) -> bool:
    return shards <= 1 or deployment_id % shards == shard


@dataclass
class Lease:
    """A held shard lock; `keep()` starts renewing it, `stop()` ends the renewals (the tick's
    finish checks and releases the lock in its own round trip)."""

    r: Any
    key: str
    token: str
    lease_s: float = LEASE_S
    lost: bool = False  # a renewal found another holder (this process stalled past the lease)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @classmethod
    def acquire(cls, r: Any, key: str, token: str, lease_s: float | None = None) -> Lease | None:
        lease_s = LEASE_S if lease_s is None else lease_s
        if not r.set(key, token, nx=True, px=int(lease_s * 1000)):
            return None
        return cls(r=r, key=key, token=token, lease_s=lease_s)

    def renew(self) -> bool:
        held = bool(self.r.eval(RENEW_SCRIPT, 1, self.key, self.token, int(self.lease_s * 1000)))
        self.lost = self.lost or not held
        return held

    def held(self) -> bool:
        """Still this holder's? Renews it once, now (the tick asks before it writes). Redis
        unreachable: as far as known (the writes that follow fail on their own)."""
        if self.lost:
            return False
        try:
            return self.renew()
        except Exception:
            return not self.lost

    def keep(self) -> Lease:
        def run() -> None:
            while not self._stop.wait(self.lease_s * RENEW_EVERY):
                try:
                    if not self.renew():
                        return
                except Exception:  # noqa: S112 (Redis away: the next try, or the expiry)
                    continue

        self._thread = threading.Thread(target=run, name=f"lease {self.key}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
