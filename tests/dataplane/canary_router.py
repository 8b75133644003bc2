"""A router whose stable slot runs in-process on the tiny checkpoint and whose canary is a
stand-in handle (`StandInCanary`): what the canary's calls do is the test's to choose."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from serving.dataplane.breaker import CanaryBreaker


class StandInCanary:
    """The canary's handle: each call fails (`fail`), answers, or waits on `release`."""

    def __init__(self, fail: bool = True) -> None:
        self.fail, self.calls, self.in_flight, self.most_in_flight = fail, 0, 0, 0
        self.release: asyncio.Event | None = None
        self.complete = self.generate = self

    def options(self, **_: Any) -> StandInCanary:
        return self

    def remote(self, payload: dict[str, Any]) -> Any:
        self.calls += 1
        return self._answer()

    async def _answer(self) -> dict[str, Any]:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if self.release is not None:
                await self.release.wait()
            if self.fail:
                raise RuntimeError("deployment acme.chat.canary is unavailable")
            usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
            return {"text": "ok", "finish_reason": "length", "usage": usage, "version": "v2"}
        finally:
            self.in_flight -= 1


@contextmanager
def canary_router(tmp_path: Path, **breaker: Any) -> Iterator[tuple[Any, Any, dict[str, Any]]]:
    """(the router, post(): one completion through it, its config with the canary at 100%)."""
    from starlette.requests import Request

    from serving.dataplane.app import Router
    from serving.dataplane.keys import hash_key
    from serving.engine.testing import write_tiny_checkpoint

    router = Router.func_or_class(local={"app": "acme.chat", "engine": {"num_blocks": 16}})
    local = {"version": "v1", "artifact": str(write_tiny_checkpoint(tmp_path / "tiny")),
             "tenants": {"7": {"salt": "ab" * 32}}}  # fmt: skip
    groups = {"stable": {"app": "acme.chat", "version": "v1", "local": True},
              "canary": {"app": "acme.chat.canary", "version": "v2"}}  # fmt: skip
    config = {"tenant": "7", "deployment": "chat", "key_hashes": [hash_key("k")],
              "groups": groups, "local": local, "canary_percent": 100, "breaker": breaker}  # fmt: skip

    async def post() -> Any:
        body = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        scope = {"type": "http", "method": "POST", "path": "/v1/completions", "root_path": "",
                 "headers": [(b"authorization", b"Bearer k")], "query_string": b""}  # fmt: skip
        return await router(Request(scope, receive))

    try:
        yield router, post, config
    finally:
        router.local.chaos.close()
        router.local.engine.stop()


async def ready(router: Any, canary: StandInCanary, config: dict[str, Any]) -> CanaryBreaker:
    """The router configured with `canary` as its canary, which has answered and warmed up
    beside a stable with a clean history; the canary's breaker."""
    router.handles["canary"] = ("acme.chat.canary", canary)  # reconfigure keeps it
    await router.reconfigure(config)
    breaker = router._breaker("canary")
    assert isinstance(breaker, CanaryBreaker)
    breaker.first_answer_at, breaker.answers = 0.0, 100  # it has answered, warm
    for _ in range(50):  # beside a stable with a clean history
        breaker.baseline.record(True, 0.01)
    return breaker


def run_ready(tmp_path: Path, canary: StandInCanary, scenario: Any) -> None:
    """scenario(router, post, the canary's breaker) on a router whose canary has answered."""

    async def main(router: Any, post: Any, config: dict[str, Any]) -> None:
        await scenario(router, post, await ready(router, canary, config))

    with canary_router(tmp_path) as (router, post, config):
        asyncio.run(main(router, post, config))


async def settle(router: Any) -> None:
    """Until the router's mirrored calls are all done."""
    while router.mirrors.tasks:
        await asyncio.gather(*list(router.mirrors.tasks))
