"""Made-up GPUs for machines without one, labelled so nobody takes them for real hardware."""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass

from serving.telemetry.providers.base import DeviceSample, GpuProcess
from serving.telemetry.providers.fragmentation import SOURCE_SIMULATED, fragmentation

GIB = 1024**3
SIMULATED_NAME = "Simulated GPU (no NVML)"
MEM_TOTAL = 80 * GIB
# Memory the simulated driver and stray contexts hold, apart from attached processes.
BACKGROUND_MIN = GIB // 2
BACKGROUND_MAX = 8 * GIB
POWER_MIN_W, POWER_MAX_W = 60.0, 700.0
SM_CLOCK_MIN_MHZ, SM_CLOCK_MAX_MHZ = 1000.0, 1980.0
TEMPERATURE_MIN_C, TEMPERATURE_MAX_C = 25.0, 90.0
# Utilisation each device drifts towards: busy while something is attached, nearly idle if not.
BUSY_TARGET, IDLE_TARGET = 65.0, 5.0
# Fragmentation (1 - largest free block / total free) drifts towards: a caching allocator that
# serves batches of varying size splits its segments (the seed's 0.63 is a bad case); an idle
# device's free memory is nearly one block. A change in attached memory (a replica growing or
# shrinking) splits some more.
FRAG_BUSY_TARGET, FRAG_IDLE_TARGET, FRAG_MAX = 0.3, 0.03, 0.9


def _clamp(value: float, low: float, high: float) -> float:
    return min(high, max(low, value))


@dataclass
class _DeviceState:
    gpu_util: float
    background: float
    temperature_c: float
    fragmentation: float = 0.0
    attached: int = 0


class SimulatedProvider:
    """`devices` fake GPUs with uuids SIM-GPU-<i>. Each devices() call advances every device one
    step: utilisation is a mean-reverting random walk in 0-100 (pulled up while processes are
    attached), memory used is a slow walk plus the attached processes' memory, temperature lags
    behind utilisation, power and SM clock follow it. The sequence depends only on `seed` and the
    calls made, not on wall time, so a seeded run repeats exactly. No XID errors ever.
    """

    simulated: bool = True
    name: str = "simulated"

    def __init__(self, *, devices: int = 2, seed: int | None = None) -> None:
        if devices < 1:
            raise ValueError("a simulated provider needs at least one device")
        # Not security-relevant: the stream only shapes demo metrics.
        self._rng = random.Random(seed)  # noqa: S311
        # A stream of its own: the other metrics' sequence for a seed stays what it was.
        self._frag_rng = random.Random(None if seed is None else seed + 7919)  # noqa: S311
        self._lock = threading.Lock()
        self._closed = False
        self._states = [
            _DeviceState(
                gpu_util=self._rng.uniform(0.0, 10.0),
                background=self._rng.uniform(BACKGROUND_MIN, 2 * GIB),
                temperature_c=self._rng.uniform(30.0, 36.0),
            )
            for _ in range(devices)
        ]
        # (pid, device index) -> bytes
        self._attached: dict[tuple[int, int], int] = {}

    def attach(self, pid: int, device_index: int, used_memory: int) -> None:
        """Shows `pid` as a compute process on `device_index` holding `used_memory` bytes
        (replacing an earlier attach of the same pid to the same device)."""
        if not 0 <= device_index < len(self._states):
            raise ValueError(f"device_index {device_index} out of range 0-{len(self._states) - 1}")
        if used_memory < 0:
            raise ValueError("used_memory must be >= 0")
        with self._lock:
            self._attached[(pid, device_index)] = used_memory

    def detach(self, pid: int) -> None:
        """Removes `pid` from every device; a pid never attached is ignored."""
        with self._lock:
            for key in [key for key in self._attached if key[0] == pid]:
                del self._attached[key]

    def devices(self) -> list[DeviceSample]:
        with self._lock:
            self._check_open()
            return [self._step(index, state) for index, state in enumerate(self._states)]

    def _step(self, index: int, state: _DeviceState) -> DeviceSample:
        rng = self._rng
        attached = sum(mem for (_, device), mem in self._attached.items() if device == index)
        target = BUSY_TARGET if attached else IDLE_TARGET
        state.gpu_util = _clamp(
            state.gpu_util + 0.15 * (target - state.gpu_util) + rng.gauss(0.0, 4.0), 0.0, 100.0
        )
        state.background = _clamp(
            state.background + rng.gauss(0.0, 0.02 * GIB), BACKGROUND_MIN, BACKGROUND_MAX
        )
        heat_target = 30.0 + 0.55 * state.gpu_util
        state.temperature_c = _clamp(
            state.temperature_c + 0.2 * (heat_target - state.temperature_c) + rng.gauss(0.0, 0.3),
            TEMPERATURE_MIN_C,
            TEMPERATURE_MAX_C,
        )
        load = state.gpu_util / 100.0
        mem_util = _clamp(0.6 * state.gpu_util + rng.gauss(0.0, 2.0), 0.0, 100.0)
        power = _clamp(
            POWER_MIN_W + (POWER_MAX_W - POWER_MIN_W) * load + rng.gauss(0.0, 8.0),
            POWER_MIN_W,
            POWER_MAX_W,
        )
        sm_clock = _clamp(
            SM_CLOCK_MIN_MHZ
            + (SM_CLOCK_MAX_MHZ - SM_CLOCK_MIN_MHZ) * min(1.0, 2.0 * load)
            + rng.gauss(0.0, 15.0),
            SM_CLOCK_MIN_MHZ,
            SM_CLOCK_MAX_MHZ,
        )
        used = min(MEM_TOTAL, int(state.background) + attached)
        largest = self._step_fragmentation(state, attached, MEM_TOTAL - used)
        return DeviceSample(
            index=index,
            uuid=f"SIM-GPU-{index}",
            name=SIMULATED_NAME,
            gpu_util=round(state.gpu_util, 1),
            mem_util=round(mem_util, 1),
            mem_used=used,
            mem_free=MEM_TOTAL - used,
            mem_total=MEM_TOTAL,
            temperature_c=round(state.temperature_c, 1),
            power_w=round(power, 1),
            sm_clock_mhz=float(round(sm_clock)),
            xid_errors=0,
            mem_largest_free=largest,
            fragmentation=fragmentation(largest, MEM_TOTAL - used),
            fragmentation_source=SOURCE_SIMULATED,
        )

    def _step_fragmentation(self, state: _DeviceState, attached: int, free: int) -> int:
        """One step of the device's fragmentation walk; the largest free block it implies."""
        rng = self._frag_rng
        target = FRAG_BUSY_TARGET if attached else FRAG_IDLE_TARGET
        churn = min(0.2, abs(attached - state.attached) / (8 * GIB))
        state.attached = attached
        state.fragmentation = _clamp(
            state.fragmentation
            + 0.1 * (target - state.fragmentation)
            + churn
            + rng.gauss(0.0, 0.01),
            0.0,
            FRAG_MAX,
        )
        return int(free * (1.0 - state.fragmentation))

    def processes(self) -> list[GpuProcess]:
        with self._lock:
            self._check_open()
            return [
                GpuProcess(
                    pid=pid,
                    device_index=device,
                    device_uuid=f"SIM-GPU-{device}",
                    used_memory=memory,
                )
                for (pid, device), memory in sorted(self._attached.items())
            ]

    def close(self) -> None:
        with self._lock:
            self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("SimulatedProvider is closed")
