"""The GPU agent of one node: samples its GPUs (NVML, or the labelled simulated provider) at
5 Hz, maps NVML's compute processes to Ray Serve replicas (the pid each replica publishes with
its SLI window) and so to deployments and tenants, and fans every sample out:

- Channels groups `tenant-<id>.gpu` (the devices the tenant's replicas use, its own processes
  and the KV cache of its deployments, never another tenant's process details) and
  `node-<name>.gpu` (everything, for platform operators);
- a short log per group (a Redis stream, 5 minutes) that a reconnecting browser resumes from;
- the node's newest snapshot (for /metrics) and its status (simulated, no GPU, alive);
- 1 s and 1 min rows in PostgreSQL for history (one insert batch a second).

Process lists are read at most every 5 s (NVML takes milliseconds per call). Runs as its own
process (`manage.py gpu_agent`, one per GPU node), or as the relay of every Ray node's sampler
(`manage.py gpu_agent --relay`, GPU_AGENT_MODE=ray).
"""

from __future__ import annotations

from serving.telemetry.agent.agent import (
    AgentConfig,
    GpuAgent,
    agents_status,
    latest_snapshots,
)
from serving.telemetry.agent.attribution import (
    Owner,
    attribute,
    kv_of,
    owners_map,
    replicas_by_pid,
    views,
)
from serving.telemetry.agent.downsample import Downsampler
from serving.telemetry.agent.log import LOG_SECONDS, RedisLog, sample_log, seq_key
from serving.telemetry.keys import EVENT, gpu_keys, node_group, tenant_group

__all__ = [
    "EVENT",
    "LOG_SECONDS",
    "AgentConfig",
    "Downsampler",
    "GpuAgent",
    "Owner",
    "RedisLog",
    "agents_status",
    "attribute",
    "gpu_keys",
    "kv_of",
    "latest_snapshots",
    "node_group",
    "owners_map",
    "replicas_by_pid",
    "sample_log",
    "seq_key",
    "tenant_group",
    "views",
]
