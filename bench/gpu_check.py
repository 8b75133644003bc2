"""GPU check: reads this machine's real GPUs through NvmlProvider, as the telemetry agent will.

    python -m bench gpu_check [--quick] [--simulated] [--seconds 10] [--hz 5]
                              [--alloc-mb N] [--load]

Prints the devices, then samples devices() and processes() at --hz for --seconds and reports:
the cost of each call (p50/p99 ms); the share of consecutive samples whose utilisation pair
(gpu, memory) is identical, since NVML refreshes utilisation on its own window (1/6 s to 1 s by
product) and sampling faster only repeats values; and every value outside its plausible range.
With --load (torch with CUDA only) a background matmul loop keeps the first CUDA device busy
while sampling, so the repeat share is measured on moving values rather than an idle 0.
With --alloc-mb N (torch with CUDA only) allocates N MB on the first CUDA device and checks
that processes() lists this process's pid there with at least N MB.

--quick samples for 2 s; on a machine without a GPU it runs the same checks against the labelled
simulated provider (serving.telemetry.providers.simulated) and says so (`"simulated": true` in
the results), so the code path stays exercised; --simulated forces that provider.

Needs no Django. Exits 2 with the reason when there is no GPU (and neither --quick nor
--simulated), 1 when a check fails, else 0. Writes bench/results/gpu_check.json (gitignored).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
import threading
import time
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.harness.report import results_path, write_results  # noqa: E402
from bench.harness.stats import percentile  # noqa: E402
from serving.telemetry.providers.base import DeviceSample, GpuProcess, NoGpu  # noqa: E402

MB = 1024**2
# Plausible bounds for any current NVIDIA data-centre or desktop GPU; 0 means "not supported".
RANGES: dict[str, tuple[float, float]] = {
    "gpu_util": (0.0, 100.0),
    "mem_util": (0.0, 100.0),
    "temperature_c": (0.0, 120.0),
    "power_w": (0.0, 1500.0),
    "sm_clock_mhz": (0.0, 4000.0),
}
MAX_VIOLATIONS_KEPT = 50


def sample_violations(sample: DeviceSample) -> list[str]:
    found = [
        f"GPU {sample.index} {metric}={getattr(sample, metric)} outside {low}-{high}"
        for metric, (low, high) in RANGES.items()
        if not low <= getattr(sample, metric) <= high
    ]
    if sample.mem_total <= 0:
        found.append(f"GPU {sample.index} mem_total={sample.mem_total} not positive")
    for metric in ("mem_used", "mem_free"):
        value = getattr(sample, metric)
        if not 0 <= value <= sample.mem_total:
            found.append(f"GPU {sample.index} {metric}={value} outside 0-{sample.mem_total}")
    if sample.xid_errors is not None and sample.xid_errors < 0:
        found.append(f"GPU {sample.index} xid_errors={sample.xid_errors} negative")
    return found


def process_violations(process: GpuProcess, device_count: int) -> list[str]:
    found = []
    if process.pid <= 0:
        found.append(f"process pid={process.pid} not positive")
    if not 0 <= process.device_index < device_count:
        found.append(f"process {process.pid} device_index={process.device_index} unknown")
    if process.used_memory < 0:
        found.append(f"process {process.pid} used_memory={process.used_memory} negative")
    return found


def repeat_report(series: list[list[DeviceSample]]) -> list[dict[str, Any]]:
    """Per device: share of consecutive samples with the same (gpu_util, mem_util)."""
    report = []
    for index in range(len(series[0])):
        pairs = [(samples[index].gpu_util, samples[index].mem_util) for samples in series]
        same = sum(1 for before, after in zip(pairs, pairs[1:], strict=False) if before == after)
        report.append(
            {
                "index": index,
                "consecutive_pairs": len(pairs) - 1,
                "identical_share": round(same / (len(pairs) - 1), 3) if len(pairs) > 1 else None,
                "distinct_values": len(set(pairs)),
                "idle": all(gpu == 0.0 and mem == 0.0 for gpu, mem in pairs),
            }
        )
    return report


def always_zero(series: list[list[DeviceSample]]) -> list[str]:
    """Metrics that read 0 in every sample: unsupported on that device (or truly idle)."""
    metrics = ("temperature_c", "power_w", "sm_clock_mhz", "mem_total")
    return [
        f"GPU {index} {metric}"
        for index in range(len(series[0]))
        for metric in metrics
        if all(getattr(samples[index], metric) == 0 for samples in series)
    ]


def cuda_torch() -> tuple[Any, str | None]:
    """torch when it can use a CUDA device, else (None, why not)."""
    try:
        import torch
    except ImportError:
        return None, "torch is not importable"
    if not torch.cuda.is_available():
        return None, f"torch {torch.__version__} has no usable CUDA device"
    return torch, None


def nvml_index_of_first_cuda_device(torch: Any, devices: list[DeviceSample]) -> int | None:
    """NVML index of torch's cuda:0 (CUDA_VISIBLE_DEVICES may reorder), matched by UUID."""
    uuid = getattr(torch.cuda.get_device_properties(0), "uuid", None)
    if uuid is None:
        return None
    wanted = str(uuid).lower().removeprefix("gpu-")
    for device in devices:
        if device.uuid.lower().removeprefix("gpu-") == wanted:
            return device.index
    return None


def start_load(torch: Any) -> tuple[threading.Event, threading.Thread]:
    stop = threading.Event()

    def spin() -> None:
        a = torch.randn(4096, 4096, device="cuda:0")
        b = torch.randn(4096, 4096, device="cuda:0")
        while not stop.is_set():
            for _ in range(20):
                a = torch.tanh(a @ b)
            torch.cuda.synchronize()

    thread = threading.Thread(target=spin, name="gpu-check-load", daemon=True)
    thread.start()
    return stop, thread


def alloc_check(
    provider: Any, devices: list[DeviceSample], torch: Any, megabytes: int
) -> dict[str, Any]:
    pid = os.getpid()
    index = nvml_index_of_first_cuda_device(torch, devices)
    block = torch.empty(megabytes * MB, dtype=torch.uint8, device="cuda:0")
    block.fill_(1)
    torch.cuda.synchronize()
    mine: list[GpuProcess] = []
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        mine = [p for p in provider.processes() if p.pid == pid]
        if any(p.used_memory >= megabytes * MB for p in mine):
            break
        time.sleep(0.2)
    del block
    torch.cuda.empty_cache()
    on_device = [p for p in mine if index is None or p.device_index == index]
    used = max((p.used_memory for p in on_device), default=0)
    result: dict[str, Any] = {
        "pid": pid,
        "megabytes": megabytes,
        "nvml_index": index,
        "found": bool(on_device),
        "used_mb": round(used / MB, 1),
        "ok": used >= megabytes * MB,
    }
    if not mine:
        result["note"] = (
            "this pid is not in NVML's process list: NVML reports host pids, so a container "
            "with its own PID namespace sees other numbers"
        )
    elif not result["ok"] and used == 0:
        result["note"] = "NVML lists the pid but cannot report its memory (reads 0)"
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--hz", type=float, default=5.0)
    parser.add_argument("--alloc-mb", type=int, default=0, help="allocate N MB (torch CUDA)")
    parser.add_argument("--load", action="store_true", help="keep cuda:0 busy while sampling")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="--seconds 2; the simulated provider (labelled) where there is no GPU",
    )
    parser.add_argument(
        "--simulated", action="store_true", help="the simulated provider, GPU or not"
    )
    parser.add_argument("--output", type=Path, default=results_path("gpu_check"))
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds = 2.0
    if args.hz <= 0 or args.seconds <= 0 or args.alloc_mb < 0:
        parser.error("--hz and --seconds must be positive, --alloc-mb >= 0")

    args.no_gpu = None
    provider: Any
    if args.simulated:
        provider = simulated_provider()
        args.no_gpu = "--simulated"
    else:
        try:
            from serving.telemetry.providers.nvml import NvmlProvider

            provider = NvmlProvider()
        except (NoGpu, ImportError) as exc:
            if not args.quick:
                print(f"gpu_check: no GPU: {exc}", file=sys.stderr)
                return 2
            print(f"gpu_check: no GPU ({exc}): SIMULATED provider, not real hardware")
            provider = simulated_provider()
            args.no_gpu = str(exc)

    try:
        return run(provider, args)
    finally:
        provider.close()


def simulated_provider() -> Any:
    from serving.telemetry.providers.simulated import SimulatedProvider

    provider = SimulatedProvider(devices=2, seed=3)
    provider.attach(os.getpid(), 0, 512 * MB)  # a process on the first device, as a replica
    return provider


def run(provider: Any, args: argparse.Namespace) -> int:
    simulated = args.no_gpu is not None
    driver = "simulated" if simulated else provider.driver_version()
    first = provider.devices()
    label = "SIMULATED provider (no real GPU)" if simulated else f"NVML driver {driver}"
    print(f"{label}, {len(first)} GPU(s):")
    for device in first:
        print(
            f"  [{device.index}] {device.name}  {device.uuid}  "
            f"{device.mem_total / 1024**3:.1f} GiB  xid={device.xid_errors}"
        )

    torch, no_torch = cuda_torch() if args.load or args.alloc_mb else (None, None)
    load = start_load(torch) if args.load and torch is not None else None
    if load is not None:
        time.sleep(1.0)  # let utilisation reach NVML's window before sampling

    provider.processes()  # warm-up: the first call may pick the process API version
    series: list[list[DeviceSample]] = []
    devices_ms: list[float] = []
    processes_ms: list[float] = []
    violations: list[str] = []
    pids: set[int] = set()
    interval = 1.0 / args.hz
    ticks = max(2, round(args.seconds * args.hz))
    next_tick = time.monotonic()
    for _ in range(ticks):
        started = time.perf_counter()
        samples = provider.devices()
        middle = time.perf_counter()
        processes = provider.processes()
        devices_ms.append((middle - started) * 1000.0)
        processes_ms.append((time.perf_counter() - middle) * 1000.0)
        series.append(samples)
        pids.update(p.pid for p in processes)
        for sample in samples:
            violations.extend(sample_violations(sample))
        for process in processes:
            violations.extend(process_violations(process, len(samples)))
        next_tick += interval
        time.sleep(max(0.0, next_tick - time.monotonic()))

    if load is not None:
        load[0].set()
        load[1].join(timeout=10.0)

    timings = {
        name: {
            "calls": len(values),
            "p50_ms": round(percentile(values, 0.50), 3),
            "p99_ms": round(percentile(values, 0.99), 3),
            "max_ms": round(max(values), 3),
        }
        for name, values in (("devices", devices_ms), ("processes", processes_ms))
    }
    repeats = repeat_report(series)
    alloc: dict[str, Any] | None = None
    if args.alloc_mb:
        if torch is None:
            alloc = {"skipped": no_torch}
        else:
            alloc = alloc_check(provider, first, torch, args.alloc_mb)

    print(f"\n  {ticks} samples at {args.hz:g} Hz over {args.seconds:g} s")
    for name, row in timings.items():
        print(f"  {name + '()':<12} p50 {row['p50_ms']:.3f} ms  p99 {row['p99_ms']:.3f} ms")
    for row in repeats:
        idle = "  (idle: all 0, repeats say nothing)" if row["idle"] else ""
        print(
            f"  GPU {row['index']}: {row['identical_share']:.0%} of consecutive utilisation "
            f"samples identical, {row['distinct_values']} distinct{idle}"
        )
    zeros = always_zero(series)
    if zeros:
        print(f"  always 0 (unsupported?): {', '.join(zeros)}")
    print(f"  processes seen: {len(pids)} pid(s)")
    print(f"  values out of range: {len(violations)}")
    for line in violations[:10]:
        print(f"    {line}")
    if alloc is not None:
        print(f"  alloc check: {alloc}")

    ok = not violations and (alloc is None or alloc.get("ok", True))
    nvml_version = None
    with contextlib.suppress(metadata.PackageNotFoundError):
        nvml_version = metadata.version("nvidia-ml-py")
    report = {
        "benchmark": "gpu_check",
        "quick": args.quick,
        "simulated": simulated,
        "provider": "simulated" if simulated else "nvml",
        "no_gpu": args.no_gpu,
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "nvidia_ml_py": nvml_version,
        "driver": driver,
        "seconds": args.seconds,
        "hz": args.hz,
        "load": load is not None,
        "devices": [device.to_dict() for device in first],
        "last_sample": [device.to_dict() for device in series[-1]],
        "timings": timings,
        "utilisation_repeats": repeats,
        "always_zero": zeros,
        "pids_seen": sorted(pids),
        "violations": violations[:MAX_VIOLATIONS_KEPT],
        "violation_count": len(violations),
        "alloc": alloc,
        "ok": ok,
    }
    verdict = "OK" if ok else "CHECK FAILED"
    print(f"\n  {verdict}{' (SIMULATED provider: not real hardware)' if simulated else ''}")
    write_results("gpu_check", report, args.output)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
