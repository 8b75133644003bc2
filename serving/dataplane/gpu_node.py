"""The GPU sampler of one Ray node (`GPU_AGENT_MODE=ray`): a Serve application the portal
declares like any other (serving.control.compile, `gpu-nodes.portal`), one replica per node
(`max_replicas_per_node: 1`, `num_replicas` = the cluster's GPU nodes, or all its nodes where
none has a GPU), no route, no CPU reserved.

Each replica reads its node's GPUs through serving.telemetry (NVML, or the labelled simulation
when `simulate` is on and there is no GPU) at `hz`, the process list every `process_interval_s`,
and appends every sample to its node's Redis stream `<prefix>:gpu:node:<node>` (about five
minutes kept); `<prefix>:gpu:nodes` holds each node's last report (provider, error). The
portal's relay (`manage.py gpu_agent --relay`) attributes, fans out and stores them: this side
knows nothing of tenants and imports nothing from Django.

The node's name is its host name and the start of its Ray node id (`host-1a2b3c4d`), so two
nodes on one host (tests, a laptop) stay apart; `ray_node` is the full id, which the replicas
also publish with their pids (serving.dataplane.sli), so pids are matched on their own node.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from ray import serve

from serving.dataplane.sli import ray_node_id
from serving.telemetry.providers.base import NoGpu, Provider, open_provider
from serving.telemetry.providers.nodes import node_name, node_stream, nodes_key

logger = logging.getLogger("ray.serve")
STREAM_SECONDS = 300  # what the stream keeps (the portal's resume log is its own)
NO_GPU_RETRY_S = 30.0


class Sampler:
    """The sampling loop, in a thread of its own (NVML calls block); `stop()` ends it."""

    def __init__(
        self,
        *,
        redis_url: str,
        prefix: str,
        hz: float,
        simulate: bool,
        process_interval_s: float = 5.0,
    ) -> None:
        self.redis_url, self.prefix = redis_url, prefix
        self.hz, self.simulate, self.process_interval_s = hz, simulate, process_interval_s
        self.ray_node = ray_node_id()
        self.node = node_name(self.ray_node)
        self.samples = 0
        self.error: str | None = None
        self.failure: BaseException | None = None  # the loop died: check_health says so
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _report(self, client: Any, provider: Provider | None) -> None:
        client.hset(
            nodes_key(self.prefix),
            self.node,
            json.dumps(
                {
                    "node": self.node,
                    "ray_node": self.ray_node,
                    "at": time.time(),
                    "provider": provider.name if provider else None,
                    "simulated": bool(provider and provider.simulated),
                    "hz": self.hz,
                    "error": self.error,
                    "samples": self.samples,
                }
            ),
        )

    def _open(self, client: Any) -> Provider | None:
        try:
            return open_provider(simulate=self.simulate)
        except NoGpu as exc:
            self.error = f"no GPU on this node: {exc}; the simulated provider is off"
            logger.warning("GPU sampler on %s: %s", self.node, self.error)
            self._report(client, None)
            return None

    def _run(self) -> None:
        import redis

        client = redis.Redis.from_url(self.redis_url)
        provider: Provider | None = None
        try:
            while provider is None and not self._stop.is_set():
                provider = self._open(client)
                if provider is None:
                    self._stop.wait(NO_GPU_RETRY_S)
            period = 1.0 / self.hz
            processes: list[dict[str, Any]] = []
            processes_at = reported_at = float("-inf")
            next_at = time.monotonic()
            stream = node_stream(self.prefix, self.node)
            while provider is not None and not self._stop.is_set():
                now = time.time()
                try:
                    if now - processes_at >= self.process_interval_s:
                        processes = [p.to_dict() for p in provider.processes()]
                        processes_at = now
                    sample = {
                        "at": round(time.time(), 3),
                        "node": self.node,
                        "ray_node": self.ray_node,
                        "simulated": provider.simulated,
                        "provider": provider.name,
                        "devices": [d.to_dict() for d in provider.devices()],
                        "processes": processes,
                    }
                    pipe = client.pipeline(transaction=False)
                    pipe.xadd(
                        stream,
                        {"d": json.dumps(sample, separators=(",", ":"))},
                        maxlen=int(STREAM_SECONDS * self.hz),
                        approximate=True,
                    )
                    pipe.execute()
                    self.samples += 1
                    self.error = None
                    if time.monotonic() - reported_at >= 1.0:  # about once a second
                        self._report(client, provider)
                        reported_at = time.monotonic()
                except Exception as exc:  # an NVML hiccup, Redis away: the next period again
                    self.error = f"{type(exc).__name__}: {exc}"[:300]
                    logger.warning("GPU sampler on %s: %s", self.node, self.error)
                next_at += period
                delay = next_at - time.monotonic()
                if delay < 0:  # fell behind: skip, never burst
                    next_at, delay = time.monotonic(), 0.0
                self._stop.wait(delay)
        except BaseException as exc:
            self.failure = exc
            raise
        finally:
            if provider is not None:
                provider.close()
            client.close()


@serve.deployment(name="sampler")
class GpuNodeSampler:
    """One node's sampler; its settings are user_config (`telemetry`, `hz`, `simulate`)."""

    def __init__(self) -> None:
        self.sampler: Sampler | None = None
        self.settings: dict[str, Any] = {}

    def reconfigure(self, config: dict[str, Any]) -> None:
        telemetry = dict(config.get("telemetry") or {})
        wanted = {
            "redis_url": telemetry.get("redis_url") or "",
            "prefix": str(telemetry.get("prefix") or "portal"),
            "hz": float(config.get("hz") or 5.0),
            "simulate": bool(config.get("simulate")),
        }
        if wanted == self.settings and self.sampler is not None and self.sampler.alive:
            return
        if self.sampler is not None:
            self.sampler.stop()
            self.sampler = None
        self.settings = wanted
        if not wanted["redis_url"]:
            logger.warning("GPU sampler: no Redis configured, nothing to publish to")
            return
        self.sampler = Sampler(
            redis_url=str(wanted["redis_url"]),
            prefix=str(wanted["prefix"]),
            hz=float(wanted["hz"]),
            simulate=bool(wanted["simulate"]),
        ).start()

    def check_health(self) -> None:
        if self.sampler is not None and not self.sampler.alive:
            raise RuntimeError(f"the GPU sampler stopped: {self.sampler.failure!r}")

    async def __call__(self, request: Any) -> dict[str, Any]:  # no route; a handle may ask
        sampler = self.sampler
        return {
            "node": sampler.node if sampler else None,
            "samples": sampler.samples if sampler else 0,
            "error": sampler.error if sampler else "not configured",
        }

    def __del__(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()


def build_gpu_nodes(args: dict[str, Any]) -> Any:
    """Application builder for `serving.dataplane.gpu_node:build_gpu_nodes`."""
    return GpuNodeSampler.bind()  # type: ignore[attr-defined]
