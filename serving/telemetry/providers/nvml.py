"""Reads real GPUs through NVML (pynvml): per-device metrics, XID events and compute processes."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import pynvml

from serving.telemetry.providers.base import DeviceSample, GpuProcess, NoGpu

logger = logging.getLogger("serving.telemetry")

T = TypeVar("T")

# NVML errors that mean "there is no GPU to read here", as opposed to a GPU in trouble.
_NO_GPU_ERRORS = {
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: (
        "no NVIDIA driver on this machine (NVML library not found)"
    ),
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: "NVIDIA driver not loaded (NVML cannot reach it)",
}

# Newest first. A pynvml newer than the driver has the _v3 wrapper but the driver lacks the
# symbol (FunctionNotFound), so the choice is made on the first call, not at import.
_COMPUTE_PROCESS_FUNCTIONS = (
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses",
)

# Upper bound on XID events drained from one device per sample; the rest wait for the next one.
_MAX_EVENTS_PER_POLL = 1000


class NvmlProvider:
    """The real GPUs of this machine, by NVML index.

    Metrics a device does not support (NVMLError_NotSupported) read as 0 instead of failing the
    sample: utilisation (both rates; e.g. MIG-enabled GPUs), memory sizes, temperature, power
    and SM clock. `xid_errors` is None where XID events cannot be registered. Each unsupported
    metric is logged once at INFO. Any other NVMLError propagates: a GPU that stops answering
    must not look idle.
    """

    simulated: bool = False
    name: str = "nvml"

    def __init__(self) -> None:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            message = _NO_GPU_ERRORS.get(getattr(exc, "value", None))
            if message is not None:
                raise NoGpu(message) from exc
            raise
        self._lock = threading.Lock()
        self._closed = False
        self._handles: list[Any] = []
        self._uuids: list[str] = []
        self._names: list[str] = []
        self._event_sets: list[Any | None] = []
        self._xid_counts: list[int] = []
        self._unsupported_logged: set[tuple[int, str]] = set()
        self._process_functions = [
            getattr(pynvml, name) for name in _COMPUTE_PROCESS_FUNCTIONS if hasattr(pynvml, name)
        ]
        try:
            self._open_devices()
        except BaseException:
            # Keep NVML's reference count balanced; the original error is the one to report.
            with contextlib.suppress(pynvml.NVMLError):
                self._release()
            raise

    def _open_devices(self) -> None:
        count = int(pynvml.nvmlDeviceGetCount())
        if count == 0:
            raise NoGpu("NVIDIA driver loaded but NVML lists no GPU")
        for index in range(count):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self._handles.append(handle)
            self._uuids.append(_text(pynvml.nvmlDeviceGetUUID(handle)))
            self._names.append(_text(pynvml.nvmlDeviceGetName(handle)))
            self._event_sets.append(self._register_xid_events(index, handle))
            self._xid_counts.append(0)

    def _register_xid_events(self, index: int, handle: Any) -> Any | None:
        """One event set per device, so every event drained from it belongs to that device."""
        event_set = pynvml.nvmlEventSetCreate()
        try:
            pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
        except pynvml.NVMLError_NotSupported:
            pynvml.nvmlEventSetFree(event_set)
            logger.info("GPU %d: XID events not supported, xid_errors reads None", index)
            return None
        except BaseException:
            pynvml.nvmlEventSetFree(event_set)
            raise
        return event_set

    @property
    def device_count(self) -> int:
        return len(self._handles)

    def driver_version(self) -> str:
        with self._lock:
            self._check_open()
            return _text(pynvml.nvmlSystemGetDriverVersion())

    def devices(self) -> list[DeviceSample]:
        with self._lock:
            self._check_open()
            return [self._sample(index, handle) for index, handle in enumerate(self._handles)]

    def _sample(self, index: int, handle: Any) -> DeviceSample:
        utilization = self._optional(
            index, "utilization", pynvml.nvmlDeviceGetUtilizationRates, handle
        )
        memory = self._optional(index, "memory", pynvml.nvmlDeviceGetMemoryInfo, handle)
        temperature = self._optional(
            index,
            "temperature",
            lambda h: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
            handle,
        )
        power_mw = self._optional(index, "power", pynvml.nvmlDeviceGetPowerUsage, handle)
        sm_clock = self._optional(
            index,
            "sm_clock",
            lambda h: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
            handle,
        )
        return DeviceSample(
            index=index,
            uuid=self._uuids[index],
            name=self._names[index],
            gpu_util=float(utilization.gpu) if utilization is not None else 0.0,
            mem_util=float(utilization.memory) if utilization is not None else 0.0,
            mem_used=int(memory.used) if memory is not None else 0,
            mem_free=int(memory.free) if memory is not None else 0,
            mem_total=int(memory.total) if memory is not None else 0,
            temperature_c=float(temperature) if temperature is not None else 0.0,
            power_w=float(power_mw) / 1000.0 if power_mw is not None else 0.0,
            sm_clock_mhz=float(sm_clock) if sm_clock is not None else 0.0,
            xid_errors=self._poll_xid(index),
        )

    def _optional(self, index: int, metric: str, read: Callable[[Any], T], handle: Any) -> T | None:
        try:
            return read(handle)
        except pynvml.NVMLError_NotSupported:
            if (index, metric) not in self._unsupported_logged:
                self._unsupported_logged.add((index, metric))
                logger.info("GPU %d: %s not supported by NVML, reads 0", index, metric)
            return None

    def _poll_xid(self, index: int) -> int | None:
        event_set = self._event_sets[index]
        if event_set is None:
            return None
        for _ in range(_MAX_EVENTS_PER_POLL):
            try:
                event = pynvml.nvmlEventSetWait_v2(event_set, 0)
            except pynvml.NVMLError_Timeout:
                break
            if int(event.eventType) & pynvml.nvmlEventTypeXidCriticalError:
                self._xid_counts[index] += 1
                logger.warning("GPU %d (%s): XID %d", index, self._uuids[index], event.eventData)
        return self._xid_counts[index]

    def processes(self) -> list[GpuProcess]:
        with self._lock:
            self._check_open()
            found: list[GpuProcess] = []
            for index, handle in enumerate(self._handles):
                infos = self._compute_processes(index, handle)
                found.extend(
                    GpuProcess(
                        pid=int(info.pid),
                        device_index=index,
                        device_uuid=self._uuids[index],
                        used_memory=_memory_or_zero(info.usedGpuMemory),
                    )
                    for info in infos
                )
            return found

    def _compute_processes(self, index: int, handle: Any) -> list[Any]:
        while self._process_functions:
            read = self._process_functions[0]
            try:
                return list(read(handle))
            except pynvml.NVMLError_FunctionNotFound:
                if len(self._process_functions) == 1:
                    raise
                logger.info("%s missing from the driver, using an older one", read.__name__)
                self._process_functions.pop(0)
            except pynvml.NVMLError_NotSupported:
                if (index, "processes") not in self._unsupported_logged:
                    self._unsupported_logged.add((index, "processes"))
                    logger.info("GPU %d: process list not supported by NVML", index)
                return []
        raise RuntimeError("this pynvml has no nvmlDeviceGetComputeRunningProcesses")

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._release()

    def _release(self) -> None:
        """Frees the event sets and shuts NVML down once (nvmlInit counts references)."""
        for event_set in self._event_sets:
            if event_set is not None:
                try:
                    pynvml.nvmlEventSetFree(event_set)
                except pynvml.NVMLError as exc:
                    logger.warning("freeing an NVML event set failed: %s", exc)
        self._event_sets = [None] * len(self._event_sets)
        pynvml.nvmlShutdown()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("NvmlProvider is closed")


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _memory_or_zero(value: int | None) -> int:
    """NVML reports "not available" as None (pynvml's translation) or as the all-ones sentinel."""
    if value is None or value == pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value:
        return 0
    return int(value)
