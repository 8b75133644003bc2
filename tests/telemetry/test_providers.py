"""GPU metrics providers: NvmlProvider against a fake of pynvml (these machines have no GPU),
the simulated provider, and how open_provider chooses between them."""

from __future__ import annotations

import ast
import logging
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pynvml
import pytest

from serving.telemetry.providers.base import (
    DeviceSample,
    GpuProcess,
    NoGpu,
    Provider,
    open_provider,
)
from serving.telemetry.providers.nvml import NvmlProvider
from serving.telemetry.providers.simulated import MEM_TOTAL, SIMULATED_NAME, SimulatedProvider

GIB = 1024**3
FIRST_UUID = "GPU-11111111-2222-3333-4444-555555555555"
NOT_AVAILABLE = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value


@dataclass
class FakeGpu:
    """One fake device as the fake NVML sees it. `unsupported` names the readings that raise
    NVMLError_NotSupported; `failing` maps a reading to another NVML error code it raises."""

    uuid: bytes | str = b"GPU-11111111-2222-3333-4444-555555555555"
    name: bytes | str = b"NVIDIA H200"
    gpu_util: int = 37
    mem_util: int = 12
    mem_used: int = 30 * GIB
    mem_free: int = 110 * GIB
    mem_total: int = 140 * GIB
    temperature_c: int = 51
    power_mw: int = 312_456
    sm_clock_mhz: int = 1755
    xid_supported: bool = True
    pending_xids: list[int] = field(default_factory=list)
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    unsupported: set[str] = field(default_factory=set)
    failing: dict[str, int] = field(default_factory=dict)


@dataclass
class FakeEventSet:
    gpu: FakeGpu | None = None
    freed: bool = False


class FakeNvml:
    """A FAKE of the pynvml functions NvmlProvider calls, installed on the real pynvml module.
    Errors are pynvml's own exception classes, built the way pynvml builds them."""

    def __init__(
        self,
        gpus: list[FakeGpu] | None = None,
        *,
        init_error: int | None = None,
        v3_missing: bool = False,
    ) -> None:
        self.gpus = gpus if gpus is not None else [FakeGpu()]
        self.init_error = init_error
        self.v3_missing = v3_missing
        self.init_calls = 0
        self.shutdown_calls = 0
        self.event_sets: list[FakeEventSet] = []
        self.process_calls: list[str] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
        for name in (
            "nvmlInit",
            "nvmlShutdown",
            "nvmlDeviceGetCount",
            "nvmlDeviceGetHandleByIndex",
            "nvmlDeviceGetUUID",
            "nvmlDeviceGetName",
            "nvmlDeviceGetUtilizationRates",
            "nvmlDeviceGetMemoryInfo",
            "nvmlDeviceGetTemperature",
            "nvmlDeviceGetPowerUsage",
            "nvmlDeviceGetClockInfo",
            "nvmlEventSetCreate",
            "nvmlDeviceRegisterEvents",
            "nvmlEventSetWait_v2",
            "nvmlEventSetFree",
            "nvmlSystemGetDriverVersion",
            "nvmlDeviceGetComputeRunningProcesses_v3",
            "nvmlDeviceGetComputeRunningProcesses_v2",
            "nvmlDeviceGetComputeRunningProcesses",
        ):
            monkeypatch.setattr(pynvml, name, getattr(self, name))
        return self

    @staticmethod
    def _read(gpu: FakeGpu, reading: str) -> None:
        if reading in gpu.unsupported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if reading in gpu.failing:
            raise pynvml.NVMLError(gpu.failing[reading])

    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return "570.86.15"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, gpu: FakeGpu) -> bytes | str:
        return gpu.uuid

    def nvmlDeviceGetName(self, gpu: FakeGpu) -> bytes | str:
        return gpu.name

    def nvmlDeviceGetUtilizationRates(self, gpu: FakeGpu) -> SimpleNamespace:
        self._read(gpu, "utilization")
        return SimpleNamespace(gpu=gpu.gpu_util, memory=gpu.mem_util)

    def nvmlDeviceGetMemoryInfo(self, gpu: FakeGpu) -> SimpleNamespace:
        self._read(gpu, "memory")
        return SimpleNamespace(used=gpu.mem_used, free=gpu.mem_free, total=gpu.mem_total)

    def nvmlDeviceGetTemperature(self, gpu: FakeGpu, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        self._read(gpu, "temperature")
        return gpu.temperature_c

    def nvmlDeviceGetPowerUsage(self, gpu: FakeGpu) -> int:
        self._read(gpu, "power")
        return gpu.power_mw

    def nvmlDeviceGetClockInfo(self, gpu: FakeGpu, clock: int) -> int:
        assert clock == pynvml.NVML_CLOCK_SM
        self._read(gpu, "sm_clock")
        return gpu.sm_clock_mhz

    def nvmlEventSetCreate(self) -> FakeEventSet:
        event_set = FakeEventSet()
        self.event_sets.append(event_set)
        return event_set

    def nvmlDeviceRegisterEvents(self, gpu: FakeGpu, types: int, event_set: FakeEventSet) -> None:
        assert types == pynvml.nvmlEventTypeXidCriticalError
        if not gpu.xid_supported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        event_set.gpu = gpu

    def nvmlEventSetWait_v2(self, event_set: FakeEventSet, timeout_ms: int) -> SimpleNamespace:
        assert timeout_ms == 0, "the provider must poll, never block"
        assert event_set.gpu is not None and not event_set.freed
        if not event_set.gpu.pending_xids:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        return SimpleNamespace(
            device=event_set.gpu,
            eventType=pynvml.nvmlEventTypeXidCriticalError,
            eventData=event_set.gpu.pending_xids.pop(0),
            gpuInstanceId=0,
            computeInstanceId=0,
        )

    def nvmlEventSetFree(self, event_set: FakeEventSet) -> None:
        assert not event_set.freed, "event set freed twice"
        event_set.freed = True

    def _processes(self, version: str, gpu: FakeGpu) -> list[SimpleNamespace]:
        self.process_calls.append(version)
        self._read(gpu, "processes")
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in gpu.processes]

    def nvmlDeviceGetComputeRunningProcesses_v3(self, gpu: FakeGpu) -> list[SimpleNamespace]:
        if self.v3_missing:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return self._processes("v3", gpu)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, gpu: FakeGpu) -> list[SimpleNamespace]:
        return self._processes("v2", gpu)

    def nvmlDeviceGetComputeRunningProcesses(self, gpu: FakeGpu) -> list[SimpleNamespace]:
        return self._processes("plain", gpu)


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    return FakeNvml([FakeGpu(), FakeGpu(uuid=b"GPU-2", name="NVIDIA H100")]).install(monkeypatch)


# --- NvmlProvider ------------------------------------------------------------------------------


def test_nvml_reads_and_converts_device_metrics(fake_nvml: FakeNvml) -> None:
    provider = NvmlProvider()
    first, second = provider.devices()

    assert (provider.name, provider.simulated, provider.device_count) == ("nvml", False, 2)
    assert first == DeviceSample(
        index=0,
        uuid=FIRST_UUID,  # bytes decoded
        name="NVIDIA H200",
        gpu_util=37.0,
        mem_util=12.0,
        mem_used=30 * GIB,
        mem_free=110 * GIB,
        mem_total=140 * GIB,
        temperature_c=51.0,
        power_w=312.456,  # milliwatts -> watts
        sm_clock_mhz=1755.0,
        xid_errors=0,
    )
    assert (second.index, second.uuid, second.name) == (1, "GPU-2", "NVIDIA H100")  # str kept
    assert first.to_dict()["power_w"] == 312.456
    assert provider.driver_version() == "570.86.15"


def test_nvml_unsupported_metrics_read_zero_and_none(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu(
        unsupported={"utilization", "memory", "temperature", "power", "sm_clock"},
        xid_supported=False,
    )
    FakeNvml([gpu]).install(monkeypatch)

    (sample,) = NvmlProvider().devices()

    assert (sample.gpu_util, sample.mem_util) == (0.0, 0.0)
    assert (sample.mem_used, sample.mem_free, sample.mem_total) == (0, 0, 0)
    assert (sample.temperature_c, sample.power_w, sample.sm_clock_mhz) == (0.0, 0.0, 0.0)
    assert sample.xid_errors is None
    assert sample.name == "NVIDIA H200"


def test_nvml_one_unsupported_metric_leaves_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml([FakeGpu(unsupported={"power"})]).install(monkeypatch)

    (sample,) = NvmlProvider().devices()

    assert sample.power_w == 0.0
    assert (sample.gpu_util, sample.temperature_c, sample.xid_errors) == (37.0, 51.0, 0)


def test_nvml_other_errors_propagate(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml([FakeGpu(failing={"temperature": pynvml.NVML_ERROR_GPU_IS_LOST})]).install(monkeypatch)
    provider = NvmlProvider()

    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        provider.devices()


def test_nvml_counts_xid_events_cumulatively_per_device(fake_nvml: FakeNvml) -> None:
    provider = NvmlProvider()
    first, second = fake_nvml.gpus
    first.pending_xids.extend([79, 48])

    assert [d.xid_errors for d in provider.devices()] == [2, 0]
    assert [d.xid_errors for d in provider.devices()] == [2, 0]  # nothing new, count kept

    first.pending_xids.append(13)
    second.pending_xids.append(94)
    assert [d.xid_errors for d in provider.devices()] == [3, 1]


def test_nvml_compute_processes_with_unavailable_memory_read_zero(fake_nvml: FakeNvml) -> None:
    fake_nvml.gpus[0].processes = [(101, 2 * GIB), (102, None)]
    fake_nvml.gpus[1].processes = [(103, NOT_AVAILABLE)]

    processes = NvmlProvider().processes()

    assert processes == [
        GpuProcess(pid=101, device_index=0, device_uuid=FIRST_UUID, used_memory=2 * GIB),
        GpuProcess(pid=102, device_index=0, device_uuid=FIRST_UUID, used_memory=0),
        GpuProcess(pid=103, device_index=1, device_uuid="GPU-2", used_memory=0),
    ]
    assert fake_nvml.process_calls == ["v3", "v3"]  # the newest versioned call
    assert processes[0].to_dict()["pid"] == 101


def test_nvml_processes_fall_back_when_the_driver_lacks_v3(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml([FakeGpu(processes=[(7, GIB)])], v3_missing=True).install(monkeypatch)
    provider = NvmlProvider()

    assert [p.pid for p in provider.processes()] == [7]
    assert [p.pid for p in provider.processes()] == [7]
    assert fake.process_calls == ["v2", "v2"]


def test_nvml_processes_unsupported_list_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml([FakeGpu(processes=[(7, GIB)], unsupported={"processes"})]).install(monkeypatch)

    assert NvmlProvider().processes() == []


@pytest.mark.parametrize(
    ("code", "message"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVML library not found"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "driver not loaded"),
    ],
)
def test_nvml_missing_library_or_driver_is_no_gpu(
    monkeypatch: pytest.MonkeyPatch, code: int, message: str
) -> None:
    fake = FakeNvml(init_error=code).install(monkeypatch)

    with pytest.raises(NoGpu, match=message):
        NvmlProvider()
    assert fake.shutdown_calls == 0  # init failed: nothing to shut down


def test_nvml_other_init_errors_are_not_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml(init_error=pynvml.NVML_ERROR_NO_PERMISSION).install(monkeypatch)

    with pytest.raises(pynvml.NVMLError_NoPermission):
        NvmlProvider()


def test_nvml_driver_without_devices_is_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml([]).install(monkeypatch)

    with pytest.raises(NoGpu, match="lists no GPU"):
        NvmlProvider()
    assert fake.shutdown_calls == 1


def test_nvml_close_is_idempotent(fake_nvml: FakeNvml) -> None:
    fake_nvml.gpus[1].xid_supported = False
    provider = NvmlProvider()

    provider.close()
    provider.close()

    assert fake_nvml.shutdown_calls == 1
    assert len(fake_nvml.event_sets) == 2
    assert all(event_set.freed for event_set in fake_nvml.event_sets)
    with pytest.raises(RuntimeError, match="closed"):
        provider.devices()
    with pytest.raises(RuntimeError, match="closed"):
        provider.processes()


# --- open_provider -----------------------------------------------------------------------------


def test_open_provider_simulates_when_nvml_is_missing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    FakeNvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND).install(monkeypatch)

    with caplog.at_level(logging.WARNING, logger="serving.telemetry"):
        provider = open_provider(simulate=True, simulated_devices=3, seed=1)

    assert isinstance(provider, SimulatedProvider)
    assert (provider.name, provider.simulated) == ("simulated", True)
    assert [d.uuid for d in provider.devices()] == ["SIM-GPU-0", "SIM-GPU-1", "SIM-GPU-2"]
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert "no GPU" in record.getMessage()
    assert "simulated provider in use" in record.getMessage()


def test_open_provider_without_simulation_raises_no_gpu(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    FakeNvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND).install(monkeypatch)

    with (
        caplog.at_level(logging.WARNING, logger="serving.telemetry"),
        pytest.raises(NoGpu, match="NVML library not found"),
    ):
        open_provider(simulate=False)
    assert "NVML library not found" in caplog.text


def test_open_provider_prefers_a_real_gpu_over_simulation(fake_nvml: FakeNvml) -> None:
    provider = open_provider(simulate=True)

    assert isinstance(provider, NvmlProvider)
    assert provider.simulated is False
    assert provider.devices()[0].name == "NVIDIA H200"


# --- SimulatedProvider -------------------------------------------------------------------------


def test_simulated_values_stay_in_range_and_move_smoothly() -> None:
    provider = SimulatedProvider(devices=2, seed=7)
    provider.attach(pid=4242, device_index=1, used_memory=20 * GIB)
    previous: list[DeviceSample] | None = None
    for _ in range(3000):
        samples = provider.devices()
        for sample in samples:
            assert sample.name == SIMULATED_NAME
            assert sample.uuid == f"SIM-GPU-{sample.index}"
            assert 0.0 <= sample.gpu_util <= 100.0
            assert 0.0 <= sample.mem_util <= 100.0
            assert sample.mem_total == MEM_TOTAL == 80 * GIB
            assert 0 <= sample.mem_used <= sample.mem_total
            assert sample.mem_used + sample.mem_free == sample.mem_total
            assert 25.0 <= sample.temperature_c <= 90.0
            assert 60.0 <= sample.power_w <= 700.0
            assert 1000.0 <= sample.sm_clock_mhz <= 1980.0
            assert sample.xid_errors == 0
        if previous is not None:
            for before, after in zip(previous, samples, strict=True):
                assert abs(after.gpu_util - before.gpu_util) < 30.0
                assert abs(after.temperature_c - before.temperature_c) < 10.0
        previous = samples


def test_simulated_is_deterministic_with_a_seed() -> None:
    def run(seed: int) -> list[list[DeviceSample]]:
        provider = SimulatedProvider(seed=seed)
        return [provider.devices() for _ in range(50)]

    assert run(3) == run(3)
    assert run(3) != run(4)


def test_simulated_attach_and_detach() -> None:
    provider = SimulatedProvider(devices=2, seed=11)
    idle = provider.devices()[1].mem_used

    provider.attach(pid=4242, device_index=1, used_memory=30 * GIB)
    provider.attach(pid=4343, device_index=0, used_memory=GIB)
    assert provider.processes() == [
        GpuProcess(pid=4242, device_index=1, device_uuid="SIM-GPU-1", used_memory=30 * GIB),
        GpuProcess(pid=4343, device_index=0, device_uuid="SIM-GPU-0", used_memory=GIB),
    ]
    busy = provider.devices()[1]
    assert busy.mem_used >= 30 * GIB > idle

    provider.detach(4242)
    provider.detach(4242)  # already gone: nothing happens
    assert [p.pid for p in provider.processes()] == [4343]
    assert provider.devices()[1].mem_used < 30 * GIB

    with pytest.raises(ValueError, match="out of range"):
        provider.attach(pid=1, device_index=2, used_memory=GIB)
    with pytest.raises(ValueError, match=">= 0"):
        provider.attach(pid=1, device_index=0, used_memory=-1)


def test_simulated_devices_with_attached_processes_are_busier() -> None:
    provider = SimulatedProvider(devices=2, seed=5)
    provider.attach(pid=4242, device_index=0, used_memory=GIB)
    samples = [provider.devices() for _ in range(400)][100:]  # past the warm-up

    busy = sum(s[0].gpu_util for s in samples) / len(samples)
    idle = sum(s[1].gpu_util for s in samples) / len(samples)
    assert busy > 40.0 > 20.0 > idle


def test_simulated_close_is_idempotent() -> None:
    provider = SimulatedProvider(seed=1)
    provider.close()
    provider.close()

    with pytest.raises(RuntimeError, match="closed"):
        provider.devices()


# --- the room's rules --------------------------------------------------------------------------


def test_telemetry_imports_nothing_from_django_or_other_apps() -> None:
    forbidden = {"django", "rest_framework", "channels", "celery", "portal", "tenants", "incidents"}
    room = Path(__file__).resolve().parents[2] / "serving" / "telemetry" / "providers"
    for path in room.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            modules: list[str] = []
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                modules = [node.module]
            for module in modules:
                assert module.split(".")[0] not in forbidden, f"{path.name} imports {module}"
                if module.startswith("serving."):
                    assert module.startswith("serving.telemetry"), f"{path.name} imports {module}"


def test_both_providers_fit_the_protocol(fake_nvml: FakeNvml) -> None:
    # The annotation is the check (mypy); at run time each is used through the protocol alone.
    providers: list[Provider] = [NvmlProvider(), SimulatedProvider(seed=1)]
    for provider in providers:
        assert isinstance(provider.name, str)
        assert isinstance(provider.simulated, bool)
        assert len(provider.devices()) >= 1
        assert isinstance(provider.processes(), list)
        provider.close()
