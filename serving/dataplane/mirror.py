"""A suspect canary's clients on the stable, copies of their calls on the canary.

The canary's breaker needs a few bad calls before it opens (one failure is no evidence against
a clean stable), and until then its clients keep getting its answers. So a canary call that
fails makes the canary suspect (`CanaryBreaker.suspect`): from then on the router answers the
canary's share of the clients from the stable slot and sends each of their requests to the
canary as well, in the background (traffic mirroring, as Istio and Argo Rollouts' mirror
routes do). A mirrored call's answer goes nowhere but to the canary's breaker: the canary's
replicas still serve (and count in their SLIs) its share of the traffic, the health tick
still sees its failures, and the breaker decides by the same test on the mirrors' evidence.
The clients come back once the canary has answered `mirror_clean` mirrored calls for each of
its failures (a clean canary's rare failure costs its clients nothing); a failing canary's
copies keep it suspect, open its breaker, and the portal rolls it back.

The cost is bounded: at most MIRRORS_IN_FLIGHT mirrored calls per router replica at once, and
in a shared pool a mirror takes one of the tenant's pool slots only when one is free (past
either, a diverted request is answered by the stable and not mirrored); only the tenant's own
canary is ever called."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from serving.dataplane.answers import unwrap_refused
from serving.dataplane.breaker import CanaryBreaker
from serving.dataplane.handles import PoolSlot, Retired

if TYPE_CHECKING:
    from serving.dataplane.router import Router

MIRRORS_IN_FLIGHT = 4


class Mirrors:
    def __init__(self, router: Router) -> None:
        self.router = router
        self.tasks: set[asyncio.Task[None]] = set()

    def divert(self, group: str, payload: dict[str, Any]) -> str:
        """The group that answers the client: the stable for a suspect canary's call, whose
        copy goes to the canary when a mirror may run; else `group`."""
        router = self.router
        if group != "canary" or "stable" not in router.groups:
            return group
        breaker = router._breaker(group)
        if not isinstance(breaker, CanaryBreaker) or not breaker.suspect():
            return group
        breaker.mirrored += 1
        handle = router.handles.get(group, (None, None))[1]
        gate = router._pool_gate if handle is not None else None
        if len(self.tasks) < MIRRORS_IN_FLIGHT and not (gate is not None and gate.locked()):
            task = asyncio.get_running_loop().create_task(self._mirror(breaker, payload, gate))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        return "stable"

    async def _mirror(
        self, breaker: CanaryBreaker, payload: dict[str, Any], gate: asyncio.Semaphore | None
    ) -> None:
        if gate is not None and gate.locked():
            return  # the client's own call took the tenant's last free slot: no copy, no queue
        slot = await PoolSlot.take(gate)  # free: taken at once
        started = time.monotonic()
        try:
            await self.router._execute("canary", dict(payload), False)
        except Retired:
            return  # the canary left the config meanwhile: nothing to hold against it
        except Exception as exc:
            if unwrap_refused(exc) is None:  # its own refusal is the client's, not a failure
                breaker.record(False)
            return
        finally:
            slot.release()
        breaker.record(True, time.monotonic() - started)
