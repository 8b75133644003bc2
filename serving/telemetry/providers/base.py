"""What a GPU metrics provider returns, and how one is chosen (real NVML, or a labelled fake)."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any, Protocol

logger = logging.getLogger("serving.telemetry")


@dataclass(frozen=True)
class DeviceSample:
    """One reading of one GPU.

    `gpu_util` and `mem_util` are NVML's utilisation rates in percent (0-100) over its last
    sample window: `mem_util` is the share of time device memory was read or written, not how
    full it is (that is `mem_used / mem_total`). Memory sizes are bytes. `xid_errors` counts the
    XID critical-error events seen since the provider opened; None where the device or driver
    cannot report them.

    `mem_largest_free` and `fragmentation` (1 - largest free block / total free; see
    serving.telemetry.providers.fragmentation) say how usable the free memory is;
    `fragmentation_source` how it was measured (`simulated`, `nvml`, `nvml+cuda_allocator`).
    NVML alone cannot see a process's caching allocator: its provider leaves them None and the
    agent fills them in from the replicas' allocator reports.
    """

    index: int
    uuid: str
    name: str
    gpu_util: float
    mem_util: float
    mem_used: int
    mem_free: int
    mem_total: int
    temperature_c: float
    power_w: float
    sm_clock_mhz: float
    xid_errors: int | None
    mem_largest_free: int | None = None
    fragmentation: float | None = None
    fragmentation_source: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class GpuProcess:
    """A process holding a compute context on a GPU; `used_memory` is 0 when NVML cannot tell
    (Windows WDDM, some vGPU and MIG set-ups)."""

    pid: int
    device_index: int
    device_uuid: str
    used_memory: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class NoGpu(Exception):
    """No NVIDIA GPU can be read on this machine (no NVML library, no driver, or no device)."""

    def __init__(
        self, message: str = "no NVIDIA driver on this machine (NVML library not found)"
    ) -> None:
        super().__init__(message)


class Provider(Protocol):
    """A source of GPU samples. `simulated` is True only for made-up data."""

    simulated: bool
    name: str

    def devices(self) -> list[DeviceSample]: ...

    def processes(self) -> list[GpuProcess]: ...

    def close(self) -> None: ...


def open_provider(
    *, simulate: bool = False, simulated_devices: int = 2, seed: int | None = None
) -> Provider:
    """The NVML provider when a GPU can be read. Otherwise a SimulatedProvider if `simulate`,
    else NoGpu is raised. A real GPU always wins over `simulate`: fake data is never shown
    where real data exists."""
    try:
        # Imported here: pynvml loads only when a provider is asked for, and a missing
        # pynvml package is the same situation as a missing driver.
        from serving.telemetry.providers.nvml import NvmlProvider
    except ImportError as exc:
        no_gpu = NoGpu(f"pynvml is not importable ({exc})")
    else:
        try:
            provider = NvmlProvider()
        except NoGpu as exc:
            no_gpu = exc
        else:
            if simulate:
                logger.info("GPU found: simulation not used, NVML provider in use")
            return provider

    if not simulate:
        logger.warning("no GPU: %s", no_gpu)
        raise no_gpu

    from serving.telemetry.providers.simulated import SimulatedProvider

    logger.warning(
        "no GPU: %s; simulated provider in use (%d fake devices)", no_gpu, simulated_devices
    )
    return SimulatedProvider(devices=simulated_devices, seed=seed)
