"""A key's priority class from the compiled config to the engine: the router reads it from
user_config (`batch_key_hashes`, absent in older configs: realtime), passes it in the payload,
the version slot submits at it; vLLM's priority value ages by deadline."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

from ray.serve.schema import ServeDeploySchema
from starlette.requests import Request

from serving.control.compile import DeploymentSpec, SlotSpec, compile_config, restart_free
from serving.dataplane.app import Router
from serving.dataplane.keys import hash_key, key_priority, request_priority
from serving.engine.priority import BATCH, REALTIME, vllm_priority
from serving.engine.testing import write_tiny_checkpoint


def test_the_router_reads_a_keys_class_and_old_configs_mean_realtime() -> None:
    old = {"key_hashes": [hash_key("a"), hash_key("b")]}  # from before priority classes
    assert key_priority("b", old) == REALTIME
    new = {**old, "batch_key_hashes": [hash_key("b")]}
    assert (key_priority("a", new), key_priority("b", new)) == (REALTIME, BATCH)
    assert key_priority(None, new) == key_priority("", new) == REALTIME
    # What a slot runs a routed request at: only the router's two words; anything else
    # (an older router's payload, a garbled one) is realtime, never an error.
    assert request_priority({"priority": "batch"}) == BATCH
    assert request_priority({}) == request_priority({"priority": "urgent!"}) == REALTIME


def _spec(**changes: object) -> DeploymentSpec:
    base = DeploymentSpec(tenant_id="7", tenant_slug="acme", name="chat", revision=1,
                          stable=SlotSpec("v1", "/artifacts/a", "sha-a", "arch-1"),
                          key_hashes=("h2", "h1"), cache_salt_hex="ab" * 32)  # fmt: skip
    return dataclasses.replace(base, **changes)


def _router_config(config: dict[str, Any]) -> dict[str, Any]:
    return dict(config["applications"][0]["deployments"][0]["user_config"])


def test_batch_keys_compile_into_user_config_without_a_restart() -> None:
    plain = compile_config([_spec()])
    assert "batch_key_hashes" not in _router_config(plain)  # unchanged for realtime-only
    batch = compile_config([_spec(batch_key_hashes=("h2",))])
    ServeDeploySchema.model_validate(batch)
    assert _router_config(batch)["batch_key_hashes"] == ["h2"]
    assert _router_config(batch)["key_hashes"] == ["h1", "h2"]  # still every live key
    assert restart_free(plain, batch)


def test_the_routers_payload_carries_the_keys_class_to_the_engine(tmp_path: Path) -> None:
    router = Router.func_or_class(local={"app": "acme.chat", "engine": {"num_blocks": 32}})
    local = {"version": "v1", "artifact": str(write_tiny_checkpoint(tmp_path / "tiny")),
             "tenants": {"7": {"salt": "ab" * 32}}}  # fmt: skip
    config = {"tenant": "7", "deployment": "chat", "key_hashes": [hash_key("rt"), hash_key("bt")],
              "batch_key_hashes": [hash_key("bt")],
              "groups": {"stable": {"app": "acme.chat", "version": "v1", "local": True}},
              "local": local}  # fmt: skip
    seen: list[tuple[str, str]] = []

    async def call(key: str, priority: str | None = None) -> int:
        body: dict[str, Any] = {"prompt": "hi", "max_tokens": 2}
        if priority is not None:
            body["priority"] = priority  # a client's own word: ignored
        raw = json.dumps(body).encode()

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": raw, "more_body": False}

        scope = {"type": "http", "method": "POST", "path": "/v1/completions", "root_path": "",
                 "headers": [(b"authorization", f"Bearer {key}".encode()),
                             (b"x-priority", b"realtime")],
                 "query_string": b""}  # fmt: skip
        return int((await router(Request(scope, receive))).status_code)

    async def scenario() -> None:
        await router.reconfigure(config)
        engine = router.local.engine.engine
        add_request = engine.add_request

        def spying(*args: Any, **kwargs: Any) -> Any:
            seq = add_request(*args, **kwargs)
            seen.append((seq.tenant, seq.priority))
            return seq

        engine.add_request = spying
        assert await call("rt") == 200
        assert await call("bt") == 200
        assert await call("bt", priority="realtime") == 200
        await router.reconfigure({k: v for k, v in config.items() if k != "batch_key_hashes"})
        assert await call("bt") == 200  # an older config: every key realtime

    try:
        asyncio.run(scenario())
    finally:
        router.local.chaos.close()
        router.local.engine.stop()
    assert seen == [("7", REALTIME), ("7", BATCH), ("7", BATCH), ("7", REALTIME)]


def test_vllm_priority_ages_batch_by_deadline() -> None:
    def value(priority: str, at: float) -> int:
        return vllm_priority(priority, now=at, epoch=100.0, bound_s=10.0)

    assert value(REALTIME, 100.5) == 500 and value(BATCH, 100.5) == 10_500
    # vLLM serves lower values first: a batch request that came at t yields to realtime
    # requests that came before t + 10 s, and goes before those that came after.
    assert value(REALTIME, 110.0) < value(BATCH, 100.5) < value(REALTIME, 111.0)
