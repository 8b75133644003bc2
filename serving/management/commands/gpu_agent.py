"""Run this node's GPU agent (one per GPU node; `manage.py up` starts it on single-node
installs): `manage.py gpu_agent [--simulate] [--hz 5] [--node NAME]`; or, with
GPU_AGENT_MODE=ray, the relay of every Ray node's sampler: `manage.py gpu_agent --relay`."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from channels.layers import get_channel_layer
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from serving.telemetry.agent import AgentConfig, GpuAgent


class Command(BaseCommand):
    help = "Sample this node's GPUs (NVML) and stream them to the portal."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--simulate",
            action="store_true",
            default=settings.GPU_AGENT_SIMULATE,
            help="without a GPU, use the simulated provider (labelled simulated everywhere)",
        )
        parser.add_argument("--hz", type=float, default=settings.GPU_AGENT_HZ)
        parser.add_argument("--node", default=settings.GPU_AGENT_NODE or None)
        parser.add_argument(
            "--seconds", type=float, default=0, help="stop after this long (0: until signalled)"
        )
        parser.add_argument(
            "--relay",
            action="store_true",
            help="GPU_AGENT_MODE=ray: attribute, stream and store the samples of every Ray "
            "node's sampler (serving.gpu_relay) instead of sampling this machine",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        if not 0.2 <= opts["hz"] <= 20:
            raise CommandError("--hz: give 0.2 to 20 samples a second.")
        if opts["relay"]:
            asyncio.run(self.relay(opts["seconds"]))
            return
        config = AgentConfig(hz=opts["hz"], simulate=opts["simulate"])
        if opts["node"]:
            config.node = opts["node"]
        asyncio.run(self.run(config, opts["seconds"]))

    def _stop_event(self, seconds: float) -> asyncio.Event:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        if seconds:
            loop.call_later(seconds, stop.set)
        return stop

    async def relay(self, seconds: float) -> None:
        import redis.asyncio as aioredis

        from serving.telemetry.relay import Relay

        client = aioredis.Redis.from_url(settings.REDIS_URL)
        relay = Relay(layer=get_channel_layer(), redis_client=client)
        stop = self._stop_event(seconds)
        self.stdout.write("GPU relay: the samples of every Ray node's sampler")
        try:
            await relay.run(stop)
        finally:
            await client.aclose()
        self.stdout.write(
            f"GPU relay stopped after {relay.samples} samples from {len(relay.agents)} nodes"
        )

    async def run(self, config: AgentConfig, seconds: float) -> None:
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(settings.REDIS_URL)
        agent = GpuAgent(config, layer=get_channel_layer(), redis_client=client)
        stop = self._stop_event(seconds)
        self.stdout.write(f"GPU agent on {config.node} at {config.hz:g} Hz")
        try:
            await agent.run(stop)
        finally:
            await client.aclose()
        self.stdout.write(f"GPU agent stopped after {agent.samples} samples")
