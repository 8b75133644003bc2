"""The naming scheme is injective over every tenant slug, deployment name, pool name and slot:
no two things a tenant (or the platform) can name ever share a Serve application, a route, an
SLI key, a metric label or a GPU owner. Property-tested over generated names."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.control import names
from serving.control.compile import DeploymentSpec, SlotSpec, compile_config
from serving.dataplane.sli import sli_key
from serving.deployments.models import DEPLOYMENT_NAME_RE

# What the models accept: a Django SlugField (tenant slug, pool name) and the deployment name.
SLUG = st.from_regex(r"[-a-zA-Z0-9_]{1,50}", fullmatch=True)
DEPLOYMENT = st.from_regex(DEPLOYMENT_NAME_RE, fullmatch=True)
SLOT = st.sampled_from(["stable", "canary"])


def _things(slug: str, name: str, pool: str) -> dict[tuple[str, ...], str]:
    """Every name made from one (slug, deployment, pool) choice, keyed by what it names."""
    out: dict[tuple[str, ...], str] = {}
    for kind, build in (
        (("app", slug, name), lambda: names.deployment_app(slug, name)),
        (("canary", slug, name), lambda: names.slot_app(slug, name, "canary")),
        (("pool", pool), lambda: names.pool_app(pool)),
        (("route", slug, name), lambda: names.route_prefix(slug, name)),
    ):
        try:
            out[kind] = build()
        except names.BadName:
            continue
    return out


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(SLUG, DEPLOYMENT, SLUG), min_size=2, max_size=6))
def test_names_never_collide(choices: list[tuple[str, str, str]]) -> None:
    apps: dict[str, tuple[str, ...]] = {names.GPU_NODES_APP: ("sampler",)}
    routes: dict[str, tuple[str, ...]] = {}
    for slug, name, pool in choices:
        for what, made in _things(slug, name, pool).items():
            table = routes if what[0] == "route" else apps
            assert table.setdefault(made, what) == what, f"{what} and {table[made]} -> {made}"
    for app, what in apps.items():
        parsed = names.parse_app(app)
        kind = {"app": "deployment", "canary": "slot"}.get(what[0], what[0])
        assert parsed[0] == kind
        assert parsed[1:3] == what[1:3] or kind in ("pool", "sampler")
    # Keys in Redis and metric labels are built from the app name and the slot: injective too.
    keys = {sli_key("p", app, slot) for app in apps for slot in ("stable", "canary")}
    assert len(keys) == 2 * len(apps)


@given(SLUG, DEPLOYMENT)
def test_a_name_is_refused_only_when_it_could_be_ambiguous(slug: str, name: str) -> None:
    try:
        app = names.deployment_app(slug, name)
    except names.BadName as exc:
        assert not slug[0].isalnum() or len(slug) > 80
        assert "tenant slug" in str(exc)
        return
    assert names.parse_app(app) == ("deployment", slug, name)
    assert names.is_portal_app(app) and not names.is_portal_app(f"{app}.x.y")
    assert names.route_prefix(slug, name) == f"/{slug}/{name}"
    assert not names.route_prefix(slug, name).startswith("/-/")  # Serve's own routes


@pytest.mark.parametrize(
    "bad", ["a.b", "a/b", "a:b", "", "-a", "_a", "a b", "a\nb", "x" * 81, "gpu-nodes.portal"]
)
def test_separators_are_refused_in_every_component(bad: str) -> None:
    with pytest.raises(names.BadName):
        names.deployment_app(bad, "chat")
    with pytest.raises(names.BadName):
        names.deployment_app("acme", bad)
    with pytest.raises(names.BadName):
        names.pool_app(bad)
    with pytest.raises(names.BadName):
        names.slot_app("acme", "chat", bad or "pool")


def _slot(version: str) -> SlotSpec:
    return SlotSpec(version=version, artifact="/m", fingerprint="f", arch_key="a")


def test_chat_canary_beside_chat_with_a_canary_compiles_to_a_config_serve_accepts() -> None:
    """The collision that stalled every tenant: `chat--canary` next to `chat` + canary."""
    from ray.serve.schema import ServeDeploySchema

    specs = [
        DeploymentSpec(tenant_id="1", tenant_slug="acme", name="chat", revision=1,
                       stable=_slot("v1"), canary=_slot("v2"), canary_percent=10),
        DeploymentSpec(tenant_id="1", tenant_slug="acme", name="chat--canary", revision=1,
                       stable=_slot("v1")),
        # The tenant-slug / name seam: `a--b` + `c` and `a` + `b--c` were one app too.
        DeploymentSpec(tenant_id="2", tenant_slug="a--b", name="c", revision=1, stable=_slot("v")),
        DeploymentSpec(tenant_id="3", tenant_slug="a", name="b--c", revision=1, stable=_slot("v")),
        # A tenant whose slug is "platform" cannot take a platform application's name.
        DeploymentSpec(tenant_id="4", tenant_slug="platform", name="gpu-nodes", revision=1,
                       stable=_slot("v"), canary=_slot("w"), canary_percent=5),
    ]  # fmt: skip
    config = compile_config(specs)
    app_names = [app["name"] for app in config["applications"]]
    assert len(app_names) == len(set(app_names)) == 7
    routes = [app["route_prefix"] for app in config["applications"] if app["route_prefix"]]
    assert len(routes) == len(set(routes)) == 5
    ServeDeploySchema.model_validate(config)  # Serve's own check of the whole config
