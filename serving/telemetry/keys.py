"""GPU telemetry's names: the Channels groups (`tenant-<id>.gpu`, `node-<name>.gpu`), the
event type their consumers handle, and the Redis layout (`<prefix>:gpu:*`)."""

from __future__ import annotations

from django.conf import settings

EVENT = "gpu.sample"  # handled by GpuConsumer.gpu_sample


def tenant_group(tenant_id: int) -> str:
    return f"tenant-{tenant_id}.gpu"


def node_group(node: str) -> str:
    # Channels group names allow ASCII letters, digits, hyphens, underscores and periods.
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in node)[:80]
    return f"node-{safe}.gpu"


def gpu_keys() -> dict[str, str]:
    prefix = settings.SLI_KEY_PREFIX
    return {
        "log": f"{prefix}:gpu:log:",  # + group name
        "latest": f"{prefix}:gpu:latest",  # hash node -> newest snapshot (JSON)
        "status": f"{prefix}:gpu:agents",  # hash node -> agent status (JSON)
        "sli": f"{prefix}:sli:",
    }
