"""Run the ASGI app under uvicorn with the portal's log redaction on every uvicorn handler.

Access logs carry request paths (invitation links hold a secret), so they pass through the
same RedactSecretsFilter as the portal's own logs; WebSocket messages are capped at
WS_MAX_BYTES. Used by `manage.py up` and in production.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import os
from typing import Any

import uvicorn
from uvicorn.config import LOGGING_CONFIG


def log_config() -> dict[str, Any]:
    config = copy.deepcopy(LOGGING_CONFIG)
    config["filters"] = {"redact_secrets": {"()": "portal.logging.RedactSecretsFilter"}}
    for handler in config["handlers"].values():
        handler["filters"] = ["redact_secrets"]
    return config


def ws_max_size() -> int:
    """The largest WebSocket message a client may send (WS_MAX_BYTES; uvicorn's 16 MiB default
    is far more than the one-way streams need)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    from django.conf import settings

    return int(settings.WS_MAX_BYTES)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve the portal (ASGI) with uvicorn.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument(
        "--gpu-agent",
        action="store_true",
        help="run this node's GPU agent in the server's event loop (embedded mode, no Redis: "
        "the in-memory channel layer reaches only this process's browsers)",
    )
    args = parser.parse_args(argv)
    if args.gpu_agent:
        asyncio.run(serve_with_agent(args.host, args.port))
        return
    uvicorn.run(
        "portal.asgi:application",
        host=args.host,
        port=args.port,
        workers=args.workers,
        lifespan="off",
        server_header=False,
        proxy_headers=True,
        log_config=log_config(),
        ws_max_size=ws_max_size(),
    )


async def serve_with_agent(host: str, port: int) -> None:
    from channels.layers import get_channel_layer
    from django.conf import settings

    from portal.asgi import application  # sets Django up
    from serving.telemetry.agent import AgentConfig, GpuAgent

    config = uvicorn.Config(
        application,
        host=host,
        port=port,
        lifespan="off",
        server_header=False,
        proxy_headers=True,
        log_config=log_config(),
        ws_max_size=ws_max_size(),
    )
    agent_config = AgentConfig(hz=settings.GPU_AGENT_HZ, simulate=settings.GPU_AGENT_SIMULATE)
    if settings.GPU_AGENT_NODE:
        agent_config.node = settings.GPU_AGENT_NODE
    agent = GpuAgent(agent_config, layer=get_channel_layer())
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        await uvicorn.Server(config).serve()
    finally:
        stop.set()
        await task


if __name__ == "__main__":
    main()
