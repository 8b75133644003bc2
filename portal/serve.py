"""Run the ASGI app under uvicorn with the portal's log redaction on every uvicorn handler.

Access logs carry request paths (invitation links hold a secret), so they pass through the
same RedactSecretsFilter as the portal's own logs. Used by `manage.py up` and in production.
"""

from __future__ import annotations

import argparse
import copy
from typing import Any

import uvicorn
from uvicorn.config import LOGGING_CONFIG


def log_config() -> dict[str, Any]:
    config = copy.deepcopy(LOGGING_CONFIG)
    config["filters"] = {"redact_secrets": {"()": "portal.logging.RedactSecretsFilter"}}
    for handler in config["handlers"].values():
        handler["filters"] = ["redact_secrets"]
    return config


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve the portal (ASGI) with uvicorn.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=1)
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
    )


if __name__ == "__main__":
    main()
