"""MemoryLeak: the `gpu_memory_leak` fault's background allocator, freed when the fault stops or
expires: CUDA memory where torch sees a GPU; on a replica without one, memory of a *simulated*
device (counted at the fault's rate, never allocated: a GPU-sized leak such as seed 001's
512 MB/s for 60 s would exhaust the host), labelled simulated in every report. `host` (resident
host memory) is there for callers that ask for it by name."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from serving.dataplane.faults.plan import MemoryLeakSpec
from serving.dataplane.faults.spec import MB

logger = logging.getLogger("ray.serve")
_LEAK_CHUNK = 64 * MB  # one allocation: short enough to keep a tick short


class MemoryLeak:
    """Allocates memory at a rate, never freeing it until `stop()` (or the fault expiring):
    CUDA memory where torch sees a GPU, else simulated device memory (only counted); `host`
    memory written to so it is resident when `device="host"` is asked for."""

    def __init__(
        self,
        spec: MemoryLeakSpec,
        *,
        expired: Callable[[], bool],
        clock: Callable[[], float],
        device: str | None = None,
        tick_s: float = 0.1,
    ) -> None:
        self.spec = spec
        self.expired = expired
        self.clock = clock
        self.device = device
        self.tick_s = tick_s
        self.leaked_bytes = 0
        self._blocks: list[Any] = []
        self._task: asyncio.Task[None] | None = None

    @property
    def leaked_mb(self) -> float:
        return self.leaked_bytes / MB

    @property
    def simulated(self) -> bool:
        return self.device == "simulated"

    def report(self) -> dict[str, object]:
        """What the replica publishes: the leaked MB and where (simulated says so)."""
        return {
            "mb": round(self.leaked_mb, 1),
            "device": self.device,
            "simulated": self.simulated,
        }

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        if self.device is None:
            self.device = _leak_device()
        self._task = asyncio.get_running_loop().create_task(self._run(self.clock()))

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._release()

    async def _run(self, started: float) -> None:
        try:
            while not self.expired():
                target = min(self.spec.max_mb, self.spec.mb_per_s * (self.clock() - started))
                missing = int(target * MB) - self.leaked_bytes
                while missing > 0 and not self.expired():
                    size = min(missing, _LEAK_CHUNK)
                    self._blocks.append(await asyncio.to_thread(self._allocate, size))
                    self.leaked_bytes += size
                    missing -= size
                await asyncio.sleep(self.tick_s)
            logger.warning("injected gpu_memory_leak expired: freeing %.0f MB", self.leaked_mb)
        finally:
            self._release()

    def _allocate(self, size: int) -> Any:
        if self.device is None:
            self.device = _leak_device()
        if self.device == "cuda":
            import torch

            return torch.empty(size, dtype=torch.uint8, device="cuda").fill_(0x5A)
        if self.device == "simulated":
            return None  # counted only: the simulated device's memory is a number
        import numpy

        return numpy.full(size, 0x5A, dtype=numpy.uint8)  # written: really resident

    def _release(self) -> None:
        self._blocks.clear()
        self.leaked_bytes = 0
        if self.device == "cuda":
            import torch

            torch.cuda.empty_cache()  # back to the driver, so NVML sees it go


def _leak_device() -> str:
    try:
        import torch
    except ImportError:
        return "simulated"
    return "cuda" if torch.cuda.is_available() else "simulated"
