"""Run the ASGI app under uvicorn with the portal's log redaction on every uvicorn handler.

Access logs carry request paths (invitation links hold a secret), so they pass through the
same RedactSecretsFilter as the portal's own logs; WebSocket messages are capped at
WS_MAX_BYTES, and a message sent to many sockets is framed once per process
(portal/wsframes.py). Used by `manage.py up` and in production.
"""

from __future__ import annotations

import argparse
import copy
import os
from typing import Any

import uvicorn
from uvicorn.config import LOGGING_CONFIG


def json_logs() -> bool:
    """LOG_FORMAT=json: uvicorn's own lines as JSON objects too, and its access lines left to
    the portal's (portal.requestctx logs one per request, with its request and trace ids)."""
    return os.environ.get("LOG_FORMAT", "plain") == "json"


def log_config() -> dict[str, Any]:
    config = copy.deepcopy(LOGGING_CONFIG)
    config["filters"] = {"redact_secrets": {"()": "portal.logging.RedactSecretsFilter"}}
    for handler in config["handlers"].values():
        handler["filters"] = ["redact_secrets"]
    if json_logs():
        config["formatters"] = {
            name: {"()": "portal.logging.JsonFormatter"} for name in config["formatters"]
        }
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
        "--no-ws-deflate",
        action="store_true",
        help="do not offer permessage-deflate to WebSocket clients (frames go uncompressed)",
    )
    args = parser.parse_args(argv)
    uvicorn.run(
        "portal.asgi:application",
        host=args.host,
        port=args.port,
        workers=args.workers,
        lifespan="off",
        server_header=False,
        proxy_headers=True,
        log_config=log_config(),
        access_log=not json_logs(),
        ws_max_size=ws_max_size(),
        ws="portal.wsframes:SharedFrameProtocol",
        ws_per_message_deflate=not args.no_ws_deflate,
    )


if __name__ == "__main__":
    main()
