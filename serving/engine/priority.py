"""Priority classes of the engine's scheduler: an inference key's `realtime` or `batch`.

The rules `Scheduler` (serving.engine.scheduler) applies: the order waiting sequences are
admitted in, which running batch sequence makes room for a realtime one, and the starvation
bound (aging) of batch sequences; see that module's docstring for the policy as a whole.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from serving.engine.scheduler import Sequence

REALTIME, BATCH = "realtime", "batch"
PRIORITIES = (REALTIME, BATCH)


def check_priority(priority: str) -> str:
    """`priority` if it is a known class; ValueError naming the field otherwise."""
    if priority not in PRIORITIES:
        raise ValueError(f"priority must be one of {', '.join(PRIORITIES)}, not {priority!r}")
    return priority


class PriorityRules:
    """The priority half of `Scheduler`: it owns `waiting`, `running` and `_preempt`."""

    waiting: deque[Sequence]
    running: list[Sequence]
    # The starvation bound of batch sequences: whichever comes first.
    batch_max_wait_steps: int = 64
    batch_max_wait_s: float = 10.0
    priority_counts: dict[str, dict[str, int]]  # tenant -> batch_aged, priority_preemptions
    promoted_at: dict[str, float]  # tenant -> when it last had a batch sequence aged

    def _preempt(self, seq: Sequence) -> None:
        raise NotImplementedError

    def _admit(self, seq: Sequence) -> bool:
        raise NotImplementedError

    def _count(self, tenant: str, name: str) -> None:
        counts = self.priority_counts.setdefault(tenant, {})
        counts[name] = counts.get(name, 0) + 1

    def priority_metrics(self, tenant: str) -> dict[str, int]:
        """What priority did to `tenant`: its batch sequences waiting, those that aged past
        the starvation bound, its sequences preempted to make room for realtime ones."""
        counts = self.priority_counts.get(tenant, {})
        return {
            "waiting_batch": sum(1 for s in self.waiting if s.tenant == tenant and s.rank),
            "batch_aged": counts.get("batch_aged", 0),
            "priority_preemptions": counts.get("priority_preemptions", 0),
        }

    def _age_waiting(self) -> None:
        """One more scheduling step for the oldest waiting batch sequence of each tenant that
        has none promoted and still waiting; past the bound it ages (is promoted)."""
        now = time.monotonic()
        promoted = {s.tenant for s in self.waiting if s.aged}
        for seq in self.waiting:  # queue order: the first batch one of a tenant is its oldest
            if not seq.rank or seq.tenant in promoted:
                continue
            promoted.add(seq.tenant)  # only this one counts, this step
            seq.waited_steps += 1
            since = max(seq.arrival, self.promoted_at.get(seq.tenant, 0.0))
            if (
                seq.waited_steps >= self.batch_max_wait_steps
                or now - since >= self.batch_max_wait_s
            ):
                seq.aged = True
                self.promoted_at[seq.tenant] = now
                self._count(seq.tenant, "batch_aged")

    def _room_victim(
        self, seq: Sequence, running: dict[str, int], *, own_only: bool
    ) -> Sequence | None:
        """A running batch sequence whose place the waiting realtime `seq` may take: its own
        tenant's newest first; unless `own_only`, then the newest of a tenant that runs more
        sequences than `seq`'s. None for a batch `seq`, and never a sequence that aged."""
        if seq.rank:
            return None
        mine = running.get(seq.tenant, 0)
        best: Sequence | None = None
        for other in self.running:
            if not other.rank:
                continue
            own = other.tenant == seq.tenant
            if not own and (own_only or running.get(other.tenant, 0) <= mine):
                continue
            if best is None or (own, other.arrival) > (best.tenant == seq.tenant, best.arrival):
                best = other
        return best

    def _preempt_for_priority(self, victim: Sequence, running: dict[str, int]) -> None:
        self._preempt(victim)
        running[victim.tenant] -= 1
        self._count(victim.tenant, "priority_preemptions")

    def _admit_preempting(self, seq: Sequence, running: dict[str, int]) -> bool:
        """Admit `seq`; a realtime one short of blocks frees its own tenant's batch ones."""
        while not self._admit(seq):
            victim = self._room_victim(seq, running, own_only=True)
            if victim is None:
                return False
            self._preempt_for_priority(victim, running)
        return True

    @staticmethod
    def _by_priority(seqs: deque[Sequence]) -> list[Sequence]:
        """Realtime (and aged batch) first, each class in queue order (the sort is stable)."""
        return sorted(seqs, key=lambda s: s.rank)

    def _running_counts(self) -> dict[str, int]:
        running: dict[str, int] = {}
        for seq in self.running:
            running[seq.tenant] = running.get(seq.tenant, 0) + 1
        return running


def vllm_priority(priority: str, *, now: float, epoch: float, bound_s: float) -> int:
    """vLLM's `priority` for a request (its "priority" scheduling policy: lower first, ties by
    arrival; when blocks run out it preempts the highest value first). Aging by deadline: the
    value is the request's arrival in milliseconds since `epoch`, plus `bound_s` for batch. A
    batch request therefore yields only to realtime ones that arrived less than `bound_s`
    after it, and vLLM never has to re-rank a queued request (it cannot)."""
    value = int((now - epoch) * 1000)
    return value + int(bound_s * 1000) if check_priority(priority) == BATCH else value
