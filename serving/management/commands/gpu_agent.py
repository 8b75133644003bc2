"""Run this node's GPU agent (one per GPU node; `manage.py up` starts it on single-node
installs): `manage.py gpu_agent [--simulate] [--hz 5] [--node NAME]`."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from channels.layers import get_channel_layer
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from serving.gpu_agent import AgentConfig, GpuAgent


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

    def handle(self, *args: Any, **opts: Any) -> None:
        if not 0.2 <= opts["hz"] <= 20:
            raise CommandError("--hz: give 0.2 to 20 samples a second.")
        if not settings.REDIS_URL:
            raise CommandError(
                "the GPU agent needs Redis (REDIS_URL) to reach the portal; without it, "
                "`manage.py up` runs the agent inside the web server."
            )
        config = AgentConfig(hz=opts["hz"], simulate=opts["simulate"])
        if opts["node"]:
            config.node = opts["node"]
        asyncio.run(self.run(config, opts["seconds"]))

    async def run(self, config: AgentConfig, seconds: float) -> None:
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(settings.REDIS_URL)
        agent = GpuAgent(config, layer=get_channel_layer(), redis_client=client)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        if seconds:
            loop.call_later(seconds, stop.set)
        self.stdout.write(f"GPU agent on {config.node} at {config.hz:g} Hz")
        try:
            await agent.run(stop)
        finally:
            await client.aclose()
        self.stdout.write(f"GPU agent stopped after {agent.samples} samples")
