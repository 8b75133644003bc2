"""What one replica may use of the host it shares: its memory share, from its own CPUs/GPUs.

A replica's faults (a drill's memory leak, a deployment's `faults` setting) are bounded by it,
so no tenant's replica can take the memory its neighbours on the same node run in.
"""

from __future__ import annotations

from django.conf import settings

# Without a GPU, Ray gives a replica no memory limit of its own: the share is per reserved CPU.
DEFAULT_MB_PER_CPU = 2048
DEFAULT_MB_PER_GPU = 81920  # a conservative GPU (80 GiB); H100/H200 nodes can say more
DEFAULT_LEAK_SHARE = 0.5  # a leak drill may take at most half of the replica's own share


def memory_share_mb(*, num_cpus: float, num_gpus: float) -> int:
    """The replica's own memory: device memory of its GPUs, else host memory per CPU."""
    if num_gpus > 0:
        return int(num_gpus * float(getattr(settings, "REPLICA_MB_PER_GPU", DEFAULT_MB_PER_GPU)))
    per_cpu = float(getattr(settings, "REPLICA_MB_PER_CPU", DEFAULT_MB_PER_CPU))
    # A replica reserving no CPU still runs: it counts as a tenth of one.
    return int(max(num_cpus, 0.1) * per_cpu)


def leak_cap_mb(*, num_cpus: float, num_gpus: float) -> int:
    share = float(getattr(settings, "DRILL_LEAK_MAX_SHARE", DEFAULT_LEAK_SHARE))
    return max(1, int(memory_share_mb(num_cpus=num_cpus, num_gpus=num_gpus) * share))


def leak_cap_reason(*, num_cpus: float, num_gpus: float) -> str:
    cap = leak_cap_mb(num_cpus=num_cpus, num_gpus=num_gpus)
    unit = f"{num_gpus:g} GPU(s)" if num_gpus > 0 else f"{max(num_cpus, 0.1):g} CPU(s)"
    return (
        f"at most {cap} MB: a share of the replica's own memory "
        f"({memory_share_mb(num_cpus=num_cpus, num_gpus=num_gpus)} MB for {unit})"
    )
