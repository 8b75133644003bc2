"""A hostile tenant against its GPU memory cap per replica: it cannot raise the cap (API, service,
a deployment setting), and it cannot make a replica grow past it: huge max_tokens or prompts are
refused with a clear 4xx before any memory is taken, and a flood of requests that each fit is
queued inside its cap while the neighbour on the same shared pool replica keeps being served
(a real VersionCore on the tiny checkpoint, no Ray)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from django.urls import reverse

from portal.exceptions import PermissionDeniedError
from serving.dataplane.app import VersionCore
from serving.dataplane.guard import Refused
from serving.deployments.specs import compiled_config
from serving.engine.memory import CAP_FIELD
from serving.engine.testing import write_tiny_checkpoint
from serving.registry import services as registry
from tenants import services as tenant_services
from tenants.actors import Actor
from tenants.models import Quota
from tests.conftest import TenantWorld
from tests.serving.test_deployments import TARGET

SALTS = {"a": "aa" * 32, "b": "bb" * 32}


@pytest.mark.django_db
def test_a_tenant_cannot_raise_its_own_cap(world_a: TenantWorld) -> None:
    registry.version_validate(tenant=world_a.tenant, version_id=world_a.version.pk)
    quota = Quota.objects.get(tenant=world_a.tenant)
    cap = quota.max_gpu_memory_mb_per_replica
    for who in ("token", "owner"):  # the owner's all-scopes token, and the owner's session
        response = world_a.client(who).patch(
            reverse("quota-detail", kwargs={"pk": quota.pk}), {CAP_FIELD: 10**6}, format="json"
        )
        assert response.status_code == 403, response.content
    with pytest.raises(PermissionDeniedError):
        tenant_services.quota_update(
            tenant=world_a.tenant, actor=Actor(user=world_a.owner), changes={CAP_FIELD: 10**6}
        )
    # Nor through a deployment's settings: the cap its replicas are told is the quota's.
    response = world_a.client().post(
        "/api/v1/deployments/",
        {"name": "sly", "version": world_a.version.pk, "gpu_memory_mb": 10**6,
         CAP_FIELD: 10**6, "user_config": {"gpu_memory_mb": {"1": 10**6}}},
        format="json",
    )  # fmt: skip
    assert response.status_code in (201, 400), response.content
    quota.refresh_from_db()
    assert quota.max_gpu_memory_mb_per_replica == cap
    config, _ = compiled_config(TARGET)
    told = [
        d["user_config"]["local"]["gpu_memory_mb"]
        for app in config["applications"]
        for d in app["deployments"]
        if app["name"].startswith(f"{world_a.tenant.slug}.") and "local" in d["user_config"]
    ]
    assert told and all(caps == {str(world_a.tenant.pk): cap} for caps in told)


async def _until(condition: Any, timeout: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError("condition never held")
        await asyncio.sleep(0.002)


def _request(tenant: str, request_id: str, prompt: str, tokens: int, **guard: Any) -> Any:
    sampling = {"max_tokens": tokens, "temperature": 0.0, "top_p": 1.0, "stream": False}
    return {"request_id": request_id, "tenant": tenant, "prompt": prompt,
            "sampling": sampling, "guard": guard}  # fmt: skip


def test_a_capped_tenant_cannot_grow_a_shared_replica_past_its_cap(tmp_path: Path) -> None:
    core = VersionCore(
        app="platform.tiny.pool", group="pool", engine={"num_blocks": 512, "max_num_seqs": 16}
    )
    config = {
        "version": "p1", "artifact": str(write_tiny_checkpoint(tmp_path / "tiny")),
        "fingerprint": "fp-p", "kv_mode": "shared", "faults": {},
        "tenants": {t: {"salt": salt, "quota_blocks": 256, "max_running": 8}
                    for t, salt in SALTS.items()},
    }  # fmt: skip

    async def scenario() -> None:
        await core.reconfigure(config)
        guard = core.engine.engine.memory
        pool = core.engine.engine.pool
        # The smallest cap (MiB) that leaves the hostile tenant "a" room for KV blocks beside a
        # step's activations, and the one just below it, which leaves none.
        cap_mb = next(mb for mb in range(1, 512) if _blocks(guard, mb) > 0)
        await core.reconfigure({**config, "gpu_memory_mb": {"a": cap_mb - 1}})
        assert guard.cap_blocks("a") == 0 and pool.quota("a") == 0 and pool.quota("b") == 256

        # Huge asks, and any ask past the cap: refused with a clear 4xx, nothing allocated.
        attempts = [
            _request("a", "huge-max", "x", 10**6),  # the guard's max_tokens
            _request("a", "huge-prompt", "word " * 5000, 8, max_prompt_tokens=1 << 20),
            _request("a", "huge-in-context", "x", 1000, max_tokens=1 << 16),
            _request("a", "past-cap", "x", 8),
        ]
        for attempt in attempts:
            with pytest.raises(Refused) as refused:
                await core.complete(attempt)
            assert 400 <= refused.value.status < 500, refused.value.message
        assert refused.value.code == "gpu_memory_cap_exceeded"
        assert CAP_FIELD in refused.value.message
        assert pool.stats.get("a") is None or pool.stats["a"].blocks_used == 0

        await core.reconfigure({**config, "gpu_memory_mb": {"a": cap_mb}})
        cap_blocks = guard.cap_blocks("a")
        assert cap_blocks is not None and 0 < cap_blocks < 256
        assert pool.quota("a") == cap_blocks and pool.quota("b") == 256

        # A flood of requests that each fit: served inside the cap; the neighbour is served.
        most = {"a": 0}
        stop = asyncio.Event()

        async def watch() -> None:
            while not stop.is_set():
                used = pool.stats["a"].blocks_used if "a" in pool.stats else 0
                most["a"] = max(most["a"], used)
                await asyncio.sleep(0.001)

        watcher = asyncio.create_task(watch())
        flood = [core.complete(_request("a", f"f{i}", f"flood {i} " * 20, 160)) for i in range(24)]
        neighbour = [core.complete(_request("b", f"n{i}", f"steady {i}", 16)) for i in range(4)]
        results = await asyncio.gather(*flood, *neighbour, return_exceptions=True)
        stop.set()
        await watcher
        errors = [r for r in results if isinstance(r, BaseException)]
        assert not [e for e in errors if not (isinstance(e, Refused) and e.status < 500)]
        assert all(not isinstance(r, BaseException) for r in results[-4:])  # the neighbour
        assert 0 < most["a"] <= cap_blocks

    try:
        asyncio.run(scenario())
    finally:
        core.chaos.close()
        if core.engine is not None:
            core.engine.stop()


def _blocks(guard: Any, mb: int) -> int:
    guard.set_caps({"a": mb}, charge_weights=False)
    return int(guard.cap_blocks("a") or 0)
