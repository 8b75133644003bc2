"""What identifies a replica's process across pid namespaces (containers, KubeRay pods).

A replica's `os.getpid()` is its pid in its own pid namespace; NVML, and an agent outside the
container, see another number for the same process. What does not change with the observer:
the pid namespace itself (`/proc/<pid>/ns/pid` names it by inode, the same from anywhere) and
the process's pid inside it (the last field of `NSpid` in `/proc/<pid>/status`). A replica
publishes its namespace with its pid (serving.dataplane.sli), and the GPU agent maps each NVML
process to (namespace, innermost pid) when it can read the host's /proc
(serving.telemetry.agent.attribution). The GPUs a replica uses (their UUIDs) are published too:
an agent that cannot read the process's /proc still attributes a device used by one replica.
"""

from __future__ import annotations

import os
from typing import Any


def pid_namespace(pid: int | str = "self") -> str | None:
    """`pid:[<inode>]` of the process's pid namespace; None when it cannot be read."""
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def innermost_pid(pid: int) -> int | None:
    """The pid the process has in its own pid namespace (what its os.getpid() says)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def gpu_uuid(raw: Any) -> str:
    """A GPU UUID as NVML writes it (`GPU-` and lower-case hex), from torch's or NVML's form."""
    text = str(raw).strip().lower()
    text = text.removeprefix("gpu-")
    return f"GPU-{text}" if text else ""


def visible_gpus() -> list[str]:
    """UUIDs of the GPUs this process was given (none without CUDA, or before torch loads)."""
    import sys

    torch = sys.modules.get("torch")  # never imported just for this: a router has no GPU
    if torch is None or not torch.cuda.is_available():
        return []
    try:
        count = torch.cuda.device_count()
        return [gpu_uuid(torch.cuda.get_device_properties(i).uuid) for i in range(count)]
    except Exception:  # an old torch without `uuid`, a device that went away
        return []


def process_identity() -> dict[str, Any]:
    return {"pidns": pid_namespace(), "gpus": visible_gpus()}
