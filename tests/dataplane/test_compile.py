"""The compiled Serve config: valid for Serve's own schema, deterministic, and weights-only
changes stay in user_config (so live replicas are reconfigured, never restarted)."""

from __future__ import annotations

import dataclasses

from ray.serve.schema import ServeDeploySchema

from serving.control.compile import (
    GPU_NODES_APP,
    DeploymentSpec,
    GpuNodesSpec,
    Placement,
    SlotSpec,
    compile_config,
    restart_free,
)

STABLE = SlotSpec("v1", "/artifacts/a", "sha-a", "arch-1")
CANARY = SlotSpec("v2", "/artifacts/b", "sha-b", "arch-1")


def _spec(**changes: object) -> DeploymentSpec:
    base = DeploymentSpec(
        tenant_id="7",
        tenant_slug="acme",
        name="chat",
        revision=1,
        stable=STABLE,
        canary=CANARY,
        canary_percent=20,
        key_hashes=("h2", "h1"),
        cache_salt_hex="ab" * 32,
    )
    return dataclasses.replace(base, **changes)


def test_config_is_valid_for_serve_and_deterministic() -> None:
    config = compile_config([_spec(), _spec(tenant_slug="globex", tenant_id="8")])
    ServeDeploySchema.model_validate(config)
    names = [a["name"] for a in config["applications"]]
    assert names == ["acme.chat", "acme.chat.canary", "globex.chat", "globex.chat.canary"]
    router = config["applications"][0]
    assert router["route_prefix"] == "/acme/chat"
    assert config["applications"][1]["route_prefix"] is None  # the canary: no HTTP route
    user_config = router["deployments"][0]["user_config"]
    assert user_config["key_hashes"] == ["h1", "h2"]
    # The stable slot runs in the router's replicas; only the canary is a hop away.
    assert user_config["groups"] == {
        "stable": {"app": "acme.chat", "version": "v1", "local": True},
        "canary": {"app": "acme.chat.canary", "version": "v2"},
    }
    assert user_config["local"]["artifact"] == "/artifacts/a"
    assert router["args"]["local"]["arch_key"] == "arch-1"
    assert router["deployments"][0]["ray_actor_options"] == {"num_cpus": 1.0, "num_gpus": 0.0}
    assert config["http_options"]["host"] == "127.0.0.1"
    assert compile_config([_spec()]) == compile_config([_spec()])


def test_traffic_weights_keys_and_new_weights_are_user_config_only() -> None:
    old = compile_config([_spec()])
    for change in (
        {"canary_percent": 50},
        {"canary_percent": 0, "revision": 9},
        {"key_hashes": ("h3",)},
        {"stable": SlotSpec("v3", "/artifacts/c", "sha-c", "arch-1")},  # hot reload
        {"faults": {"canary": {"error_rate": 0.5}}},
    ):
        assert restart_free(old, compile_config([_spec(**change)])), change


def test_replica_shape_and_architecture_changes_restart() -> None:
    old = compile_config([_spec()])
    for change in (
        {"num_replicas": 3},
        {"num_gpus": 1.0},
        {"kv_blocks": 512},
        {"stable": SlotSpec("v3", "/artifacts/c", "sha-c", "arch-2")},
        {"canary": None},
    ):
        assert not restart_free(old, compile_config([_spec(**change)])), change


def test_autoscaling_uses_serve_field_names() -> None:
    spec = _spec(
        num_replicas=None,
        autoscaling={"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 2},
    )
    config = compile_config([spec])
    ServeDeploySchema.model_validate(config)
    for app in config["applications"]:  # the router (with stable) and the canary
        deployment = app["deployments"][0]
        assert deployment["autoscaling_config"] == {
            "min_replicas": 1,
            "max_replicas": 4,
            "target_ongoing_requests": 2,
        }
        assert "num_replicas" not in deployment


def test_shared_pool_serves_several_tenants_with_their_own_salts_and_quotas() -> None:
    from serving.control.compile import PoolSpec, PoolTenant

    pool = PoolSpec(
        name="llama-small",
        slot=SlotSpec("p1", "/artifacts/p", "sha-p", "arch-p"),
        tenants={"7": PoolTenant("aa" * 32, 64, 8), "8": PoolTenant("bb" * 32, 32, 4)},
        max_num_seqs=32,
    )
    a = _spec(pool="llama-small", canary=None, pool_slots=16)
    b = _spec(pool="llama-small", canary=None, tenant_slug="globex", tenant_id="8", pool_slots=16)
    config = compile_config([a, b], pools=[pool])
    ServeDeploySchema.model_validate(config)
    names = [app["name"] for app in config["applications"]]
    assert names == ["platform.llama-small.pool", "acme.chat", "globex.chat"]
    tenants = config["applications"][0]["deployments"][0]["user_config"]["tenants"]
    assert tenants == {
        "7": {"salt": "aa" * 32, "quota_blocks": 64, "max_running": 8},
        "8": {"salt": "bb" * 32, "quota_blocks": 32, "max_running": 4},
    }
    assert config["applications"][0]["args"]["engine"]["max_num_seqs"] == 32
    router = config["applications"][1]
    groups = router["deployments"][0]["user_config"]["groups"]
    assert groups == {"stable": {"app": "platform.llama-small.pool", "version": "v1"}}
    # The tenant's share of the pool's request slots is held in its own router.
    assert router["deployments"][0]["user_config"]["pool_slots"] == 16
    assert router["deployments"][0]["user_config"]["pool_access_revoked"] is False
    # A thin router: no engine of its own, no CPU reserved.
    assert router["args"] == {} and "local" not in router["deployments"][0]["user_config"]
    assert router["deployments"][0]["ray_actor_options"] == {"num_cpus": 0}


def test_unknown_pool_is_an_error() -> None:
    import pytest

    with pytest.raises(ValueError, match="shared pool 'nope'"):
        compile_config([_spec(pool="nope")])


def test_fair_share_clamps_the_plan_to_the_pool_size_over_its_minimum_tenants() -> None:
    from serving.control.compile import fair_share

    big_plan = fair_share(plan_blocks=1_000_000, kv_blocks=1024, max_num_seqs=32,
                          min_tenants=4, max_ongoing_requests=64)  # fmt: skip
    assert (big_plan.quota_blocks, big_plan.max_running, big_plan.request_slots) == (256, 8, 16)
    small_plan = fair_share(plan_blocks=100, kv_blocks=1024, max_num_seqs=32,
                            min_tenants=4, max_ongoing_requests=64, num_replicas=2)  # fmt: skip
    assert (small_plan.quota_blocks, small_plan.request_slots) == (100, 32)
    # Never zero slots, whatever the knob says.
    tiny = fair_share(plan_blocks=8, kv_blocks=16, max_num_seqs=2, min_tenants=100,
                      max_ongoing_requests=2)  # fmt: skip
    assert (tiny.max_running, tiny.request_slots) == (1, 1)


def test_a_suspended_tenants_router_says_why_and_changing_it_restarts_nothing() -> None:
    active = compile_config([_spec()])
    router = active["applications"][0]["deployments"][0]["user_config"]
    assert router["suspended"] == ""
    suspended = compile_config([_spec(suspended="the platform suspended it")])
    config = suspended["applications"][0]["deployments"][0]["user_config"]
    assert config["suspended"] == "the platform suspended it"
    ServeDeploySchema.model_validate(suspended)
    assert restart_free(active, suspended)


def test_a_revoked_pool_tenants_router_is_marked_and_still_compiles() -> None:
    from serving.control.compile import PoolSpec

    pool = PoolSpec(name="p", slot=SlotSpec("p1", "/a", "sha", "arch"), tenants={})
    config = compile_config([_spec(pool="p", canary=None, pool_access=False)], pools=[pool])
    ServeDeploySchema.model_validate(config)
    router = config["applications"][1]["deployments"][0]["user_config"]
    assert router["pool_access_revoked"] is True
    assert config["applications"][0]["deployments"][0]["user_config"]["tenants"] == {}


VLLM = {"name": "vllm", "dtype": "float32", "max_num_seqs": 8, "cpu_kv_space_gib": 1.0}


def test_a_vllm_slot_runs_vllms_server_and_rolls_new_weights_out_as_new_replicas() -> None:
    spec = _spec(
        stable=dataclasses.replace(STABLE, engine=VLLM),
        canary=dataclasses.replace(CANARY, engine=VLLM),
    )
    config = compile_config([spec])
    ServeDeploySchema.model_validate(config)
    router, stable, canary = config["applications"]
    assert [a["name"] for a in (router, stable, canary)] == [
        "acme.chat", "acme.chat.stable", "acme.chat.canary"
    ]  # fmt: skip
    # The router is thin (it never restarts for new weights); vLLM runs in the slots' apps.
    assert router["args"] == {} and "local" not in router["deployments"][0]["user_config"]
    assert router["deployments"][0]["ray_actor_options"] == {"num_cpus": 0}
    groups = router["deployments"][0]["user_config"]["groups"]
    assert groups["stable"] == {"app": "acme.chat.stable", "version": "v1"}
    for app in (stable, canary):
        assert app["args"]["server"] == "serving.dataplane.vllm_version:VllmCore"
        assert app["args"]["engine"] == {**VLLM, "gpu": False}
        # A replacement starts before the replica it replaces drains and stops.
        assert app["deployments"][0]["max_surge_percent"] == 100
    # vLLM cannot hot-swap: other weights (same architecture) restart the slot's replicas, and
    # the router's do not change; a built-in slot's new weights still restart nothing.
    moved = dataclasses.replace(spec, stable=SlotSpec("v3", "/artifacts/c", "sha-c", "arch-1",
                                                      engine=VLLM))  # fmt: skip
    new = compile_config([moved])
    assert not restart_free(config, new)
    assert new["applications"][0]["args"] == router["args"]
    builtin = compile_config([_spec()])
    assert "server" not in builtin["applications"][0]["args"]["local"]
    assert "max_surge_percent" not in builtin["applications"][0]["deployments"][0]


def test_a_builtin_stable_may_have_a_vllm_canary() -> None:
    config = compile_config([_spec(canary=dataclasses.replace(CANARY, engine=VLLM))])
    router, canary = config["applications"]
    assert "server" not in router["args"]["local"]
    assert canary["args"]["server"] == "serving.dataplane.vllm_version:VllmCore"
    assert canary["args"]["engine"]["name"] == "vllm"


def test_placement_and_where_replicas_fetch_their_weights() -> None:
    source = {"via": "portal", "url": "http://portal/a.tar?sig=x", "sha256": "a" * 64, "bytes": 9}
    fetched = dataclasses.replace(STABLE, artifact="store://tenant-7/x", source=source)
    placed = Placement("EveryNode", {"portal-worker": 0.001})
    config = compile_config(
        [_spec(stable=fetched)], gpu_nodes=GpuNodesSpec(nodes=2, hz=5), placement=placed
    )
    ServeDeploySchema.model_validate(config)
    assert config["proxy_location"] == "EveryNode"
    apps = {a["name"]: a for a in config["applications"]}
    for name in ("acme.chat", "acme.chat.canary"):  # every tenant replica asks for it ...
        for deployment in apps[name]["deployments"]:
            assert deployment["ray_actor_options"]["resources"] == {"portal-worker": 0.001}
    for deployment in apps[GPU_NODES_APP]["deployments"]:  # ... the GPU samplers do not
        assert "portal-worker" not in deployment.get("ray_actor_options", {}).get("resources", {})
    local = apps["acme.chat"]["deployments"][0]["user_config"]["local"]
    assert (local["artifact"], local["source"]) == ("store://tenant-7/x", source)
    canary = apps["acme.chat.canary"]["deployments"][0]["user_config"]
    assert "source" not in canary  # read in place (ARTIFACT_DELIVERY=path)
    # A renewed URL changes user_config only: live replicas are reconfigured, none restarts.
    renewed = dataclasses.replace(fetched, source={**source, "url": "http://portal/a.tar?sig=y"})
    again = compile_config(
        [_spec(stable=renewed)], gpu_nodes=GpuNodesSpec(nodes=2, hz=5), placement=placed
    )
    assert again != config and restart_free(config, again)
    assert compile_config([_spec()])["proxy_location"] == "EveryNode"
