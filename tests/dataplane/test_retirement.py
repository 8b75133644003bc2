"""A request routed to the canary when a promote or rollback retires it: Serve's handle would
queue it for ever (the canary's replicas are gone and none will come); the router cancels the
call and the stable slot answers (a real router and in-process stable slot, no Ray: the
canary's handle is the Ray edge, a call that never answers)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from serving.dataplane.app import Router
from serving.dataplane.breaker import BreakerConfig, CircuitBreaker
from serving.dataplane.handles import Retired, Retirements
from serving.dataplane.keys import hash_key
from serving.engine.testing import write_tiny_checkpoint

CANARY = "acme.chat.canary"


class _Stuck:
    """A DeploymentResponse (and its stream) to an application with no replica left."""

    def __init__(self) -> None:
        self.calls = 0
        self.cancelled = 0
        self.complete = self.generate = self

    def options(self, **_: Any) -> _Stuck:
        return self

    def remote(self, payload: dict[str, Any]) -> _Stuck:
        self.calls += 1
        self._never: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        return self

    def __await__(self) -> Any:
        return self._never.__await__()

    async def __anext__(self) -> Any:
        return await self._never

    def cancel(self) -> None:
        self.cancelled += 1


def _config(tmp_path: Path) -> dict[str, Any]:
    local = {"version": "v1", "artifact": str(write_tiny_checkpoint(tmp_path / "tiny")),
             "tenants": {"7": {"salt": "ab" * 32}}}  # fmt: skip
    return {"tenant": "7", "deployment": "chat", "key_hashes": [hash_key("k")],
            "groups": {"stable": {"app": "acme.chat", "version": "v1", "local": True}},
            "local": local, "canary_percent": 0}  # fmt: skip


def _with_canary(router: Any, handle: _Stuck) -> None:
    """What reconfigure() does for a canary group (without Serve to give a real handle)."""
    router.config = {**router.config, "canary_percent": 100}
    router.groups["canary"] = {"app": CANARY, "version": "v2"}
    router.handles["canary"] = (CANARY, handle)
    router.breakers[f"{CANARY}@v2"] = CircuitBreaker(BreakerConfig())
    router.retirements.keep([CANARY])


async def _post(router: Any, stream: bool) -> Any:
    from starlette.requests import Request

    body = json.dumps({"prompt": "hi", "max_tokens": 2, "stream": stream}).encode()

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "root_path": "",
             "headers": [(b"authorization", b"Bearer k")], "query_string": b""}  # fmt: skip
    return await router(Request(scope, receive))


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_waiting_on_a_retired_canary_is_answered_by_the_stable_slot(
    tmp_path: Path, stream: bool
) -> None:
    router = Router.func_or_class(local={"app": "acme.chat", "engine": {"num_blocks": 16}})
    canary = _Stuck()
    config = _config(tmp_path)

    async def scenario() -> None:
        await router.reconfigure(config)
        _with_canary(router, canary)
        call = asyncio.create_task(_post(router, stream))
        while canary.calls == 0:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        assert not call.done()  # stuck on the canary, as Serve's handle would be
        await router.reconfigure(config)  # promoted or rolled back: no canary any more
        response = await asyncio.wait_for(call, timeout=10)
        assert response.status_code == 200
        assert response.headers["x-ab-group"] == "stable"
        assert response.headers["x-model-version"] == "v1"
        if stream:
            chunks = [chunk async for chunk in response.body_iterator]
            assert chunks[-1] == b"data: [DONE]\n\n"
        else:
            assert json.loads(response.body)["choices"][0]["text"] is not None
        assert canary.cancelled == 1  # Serve forgets the queued call
        assert router.breakers["acme.chat@v1"].snapshot()["failure_rate"] == 0

    try:
        asyncio.run(scenario())
    finally:
        router.local.chaos.close()
        router.local.engine.stop()


def test_a_call_answers_unless_its_application_is_retired_first() -> None:
    async def scenario() -> None:
        retirements = Retirements()
        retirements.keep(["a", "b"])
        done = asyncio.get_running_loop().create_future()
        done.set_result("answer")
        stuck = _Stuck()
        stuck.remote({})
        assert await retirements.first("a", stuck, done) == "answer"
        waiting = asyncio.create_task(retirements.first("b", stuck, stuck))
        await asyncio.sleep(0.01)
        retirements.keep(["a"])  # b is retired: its waiting call ends now
        with pytest.raises(Retired):
            await asyncio.wait_for(waiting, timeout=5)
        with pytest.raises(Retired):  # and a new call to it never starts waiting
            await retirements.first("b", stuck, stuck)
        assert stuck.cancelled == 2

    asyncio.run(scenario())
