"""A tiny Serve app for the cluster tests: each replica reports its pid and current user_config.

Deployed by import path (`tests.serving.serve_echo_app:app`) through the REST API, so it also
proves that Ray workers import the repository's modules. It runs inside Ray; no Django here.
"""

from __future__ import annotations

import os
from typing import Any

from ray import serve
from starlette.requests import Request


@serve.deployment
class Echo:
    def __init__(self) -> None:
        self.value: Any = None
        self.reconfigured = 0

    def reconfigure(self, config: dict[str, Any]) -> None:
        # Serve calls this on live replicas when only user_config changes: no restart.
        self.value = config.get("value")
        self.reconfigured += 1

    async def __call__(self, request: Request) -> dict[str, Any]:
        return {"pid": os.getpid(), "value": self.value, "reconfigured": self.reconfigured}


app = Echo.bind()
