"""Config drift graded (serving.control.drift), without a cluster: the canonical form, the hash,
the differing fields and their grades. The Ray tests (test_config_drift_ray.py) PUT real configs
behind the portal's back."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from serving.control import drift

APP: dict[str, Any] = {
    "name": "acme.assistant",
    "route_prefix": "/acme/assistant",
    "import_path": "serving.dataplane.app:build_router",
    "args": {"local": {"arch_key": "68f9", "engine": {"num_blocks": 256, "gpu": False}}},
    "runtime_env": {"env_vars": {"A": "0"}},
    "deployments": [
        {
            "name": "router",
            "num_replicas": 1,
            "health_check_period_s": 2,
            "ray_actor_options": {"num_cpus": 0.25, "num_gpus": 0.0},
            "user_config": {
                "revision": 3,
                "canary_percent": 0,
                "key_hashes": ["a", "b"],
                "guard": {"max_tokens": 64},
                "groups": {"stable": {"app": "acme.assistant", "version": "m:v1"}},
                "local": {
                    "version": "m:v1",
                    "artifact": "/data/m/v1",
                    "fingerprint": "4d18",
                    "faults": {},
                    "tenants": {"1": {"salt": "87fa", "quota_blocks": None}},
                    "telemetry": {"prefix": "p", "redis_url": "redis://127.0.0.1:6379/0"},
                },
            },
        },
        {"name": "version", "num_replicas": 1},
    ],
}


def changed(**paths: Any) -> dict[str, Any]:
    """APP with `a__b__0__c=value` paths set (0: a list index)."""
    app = copy.deepcopy(APP)
    for path, value in paths.items():
        *parents, last = path.split("__")
        node: Any = app
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node[last] = value
    return app


def test_what_serve_reports_for_the_applied_config_is_no_drift() -> None:
    reported = changed(deployments__0__health_check_period_s=2.0)  # Serve's floats
    assert drift.config_hash(reported) == drift.config_hash(APP)
    assert drift.compare_app("acme.assistant", APP, reported) is None


def test_the_order_of_named_lists_is_cosmetic() -> None:
    reported = changed(deployments=list(reversed(APP["deployments"])))
    found = drift.compare_app("acme.assistant", APP, reported)
    assert found is not None and found.grade == drift.P2 and found.fields == ("(order)",)
    assert found.applied_hash == found.reported_hash  # the same config, in another order


@pytest.mark.parametrize(
    ("paths", "grade", "field"),
    [
        (
            {"deployments__0__user_config__canary_percent": 50},
            "P0",
            "deployments[router].user_config.canary_percent",
        ),
        (
            {"deployments__0__user_config__local__version": "m:v0"},
            "P0",
            "deployments[router].user_config.local.version",
        ),
        (
            {"deployments__0__user_config__local__artifact": "/x"},
            "P0",
            "deployments[router].user_config.local.artifact",
        ),
        (
            {"deployments__0__user_config__local__faults": {"latency_spike": {"ms": 9}}},
            "P0",
            "deployments[router].user_config.local.faults.latency_spike.ms",
        ),
        (
            {"deployments__0__user_config__local__tenants__1__salt": "0000"},
            "P0",
            "deployments[router].user_config.local.tenants.1.salt",
        ),
        (
            {"deployments__0__user_config__key_hashes": ["a", "b", "c"]},
            "P0",
            "deployments[router].user_config.key_hashes",
        ),
        ({"route_prefix": "/elsewhere"}, "P0", "route_prefix"),
        ({"deployments__0__num_replicas": 3}, "P1", "deployments[router].num_replicas"),
        (
            {"deployments__0__ray_actor_options__num_gpus": 1},
            "P1",
            "deployments[router].ray_actor_options.num_gpus",
        ),
        (
            {"deployments__0__user_config__guard__max_tokens": 4096},
            "P1",
            "deployments[router].user_config.guard.max_tokens",
        ),
        (
            {"deployments__0__user_config__local__tenants__1__quota_blocks": 8},
            "P1",
            "deployments[router].user_config.local.tenants.1.quota_blocks",
        ),
        ({"args__local__engine__num_blocks": 512}, "P1", "args.local.engine.num_blocks"),
        (
            {"deployments__0__logging_config": {"log_level": "DEBUG"}},
            "P2",
            "deployments[router].logging_config.log_level",
        ),
        ({"deployments__0__unknown_option": 1}, "P1", "deployments[router].unknown_option"),
    ],
)
def test_each_difference_is_graded(paths: dict[str, Any], grade: str, field: str) -> None:
    found = drift.compare_app("acme.assistant", APP, changed(**paths))
    assert found is not None
    # A leaf that appears also differs at its empty parent ({} before): the same grade.
    assert found.grade == grade and field in found.fields, found.fields
    assert {drift.grade(f) for f in found.fields} == {grade}
    assert found.applied_hash != found.reported_hash


def test_the_worst_field_grades_the_app_and_comes_first() -> None:
    reported = changed(
        deployments__0__logging_config={"log_level": "DEBUG"},
        deployments__0__num_replicas=2,
        deployments__0__user_config__canary_percent=30,
    )
    found = drift.compare_app("acme.assistant", APP, reported)
    assert found is not None and found.grade == "P0"
    assert [drift.grade(f) for f in found.fields] == ["P0", "P1", "P2"]


def test_missing_or_extra_applications_and_deployments_are_p0() -> None:
    [missing] = drift.compare({"acme.assistant": APP}, {})
    assert missing.grade == "P0" and missing.fields == (drift.MISSING_APP,)
    [extra] = drift.compare({}, {"acme.other": APP})
    assert extra.grade == "P0" and extra.fields == (drift.EXTRA_APP,)
    one = changed(deployments=APP["deployments"][:1])
    found = drift.compare_app("acme.assistant", APP, one)
    assert found is not None and found.grade == "P0" and "deployments[version]" in found.fields


def test_a_finding_is_bounded_and_shows_no_values() -> None:
    reported = changed(
        deployments__0__user_config__guard={f"k{i}": i for i in range(100)},
        deployments__0__user_config__local__telemetry={"redis_url": "redis://secret:6379/9"},
    )
    found = drift.compare_app("acme.assistant", APP, reported)
    assert found is not None and len(found.fields) == drift.MAX_FIELDS
    assert "secret" not in str(found.as_json())  # values go to the operator's log only
    assert all(
        len(v["reported"] or "") <= drift.MAX_VALUE_CHARS + 3 for v in found.details.values()
    )


@pytest.mark.django_db
def test_overlapping_refreshes_tell_a_drift_once(
    world_a: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two status refreshes that both read the state before either wrote it: one tells."""
    from datetime import UTC, datetime

    from django.conf import settings

    from serving.deployments import drift as recorded
    from serving.deployments.controlplane import redis_client
    from tests.serving.test_ops_loop import _ready

    deployment = _ready(world_a)
    told: list[str] = []
    monkeypatch.setattr(recorded, "_listeners", [lambda f: told.append(f.signature)])
    app = drift.AppDrift("acme.assistant", drift.P0, ("x",), "a" * 8, "b" * 8)
    finding = recorded.DriftFinding("u", deployment, (app,), datetime.now(UTC))
    client = redis_client(settings.REDIS_URL)
    key = recorded.STATE_KEY.format(prefix=settings.SLI_KEY_PREFIX)
    client.delete(key, recorded._claim_key(key, deployment.pk, finding.signature))
    real = client.hgetall(key)  # what both refreshes read: no state yet
    monkeypatch.setattr(type(client), "hgetall", lambda self, k: dict(real))
    recorded._record([finding], finding.detected_at)
    recorded._record([finding], finding.detected_at)
    assert told == [finding.signature]
    monkeypatch.undo()
    recorded._record([], finding.detected_at)  # repaired: a later return is told again
    monkeypatch.setattr(recorded, "_listeners", [lambda f: told.append(f.signature)])
    recorded._record([finding], finding.detected_at)
    assert len(told) == 2
    client.delete(key, recorded._claim_key(key, deployment.pk, finding.signature))
