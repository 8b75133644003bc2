"""Traffic hygiene through the real Serve proxy on the session cluster: sticky A/B by client key
(the header or the body's `user`; the same client on the same group; raising the percent only
moves clients from stable to canary; a too-long key refused), X-Model-Version and
X-Model-Fingerprint on unary and streamed answers, B3 traces continued (single and multi
headers) and answered in both forms, and the split-consistency record the routers publish."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from serving.control.compile import DeploymentSpec
from serving.dataplane.sticky import bucket_of, sticky_group
from serving.deployments import reconcile as control
from serving.deployments import services as deployments
from serving.deployments.specs import desired_state
from serving.deployments.traffic_specs import traffic_salt_hex
from serving.engine.testing import write_tiny_checkpoint
from serving.ops.split import split_consistency
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.ray_cluster import RayCluster
from tests.serving.test_serving_ray import PROMPT, _apply, _key, _ready_version, _served

pytestmark = [pytest.mark.ray, pytest.mark.django_db]

APP = "acme.assistant"
TRACE128 = "80f198ee56343ba864fe8b2a57d3eff7"
TRACE64 = "463ac35c9f6413ad"
SPAN = "e457b5a2e4d86bd1"


def _ask(http: httpx.Client, url: str, key: str, headers: dict[str, str] | None = None,
         **body: Any) -> httpx.Response:  # fmt: skip
    payload = {"prompt": PROMPT, "max_tokens": 1, "temperature": 0, **body}
    return http.post(
        url, json=payload, headers={"authorization": f"Bearer {key}", **(headers or {})}
    )


def _spec(deployment_id: int) -> DeploymentSpec:
    return next(s for s in desired_state()[0] if s.deployment_id == deployment_id)


def test_sticky_split_answer_labels_and_b3(
    world_a: TenantWorld, ray_cluster: RayCluster, tmp_path: Path
) -> None:
    actor = Actor(user=world_a.owner)
    deployment = _served(world_a)
    key = _key(world_a, deployment)
    v2 = _ready_version(world_a, write_tiny_checkpoint(tmp_path / "v2", seed=7), "v2")
    deployments.deployment_change(
        tenant=world_a.tenant, actor=actor, deployment=deployment,
        changes={"traffic": {"sticky": True}}, reason="sticky",
    )  # fmt: skip
    deployments.deployment_set_canary(
        tenant=world_a.tenant, actor=actor, deployment=deployment, version_id=v2.pk, percent=30
    )
    _apply(ray_cluster, [APP, f"{APP}.canary"])
    spec = _spec(deployment.pk)
    assert spec.canary is not None
    labels = {
        "stable": (spec.stable.version, spec.stable.fingerprint),
        "canary": (spec.canary.version, spec.canary.fingerprint),
    }
    assert labels["stable"][1] != labels["canary"][1]
    salt = bytes.fromhex(traffic_salt_hex(deployment.pk))
    clients = [f"customer-{n}" for n in range(24)]
    expected = {c: sticky_group(bucket_of(salt, c), 30) for c in clients}
    assert set(expected.values()) == {"stable", "canary"}
    url = f"{ray_cluster.serve_url}/acme/assistant/v1/completions"
    chat = f"{ray_cluster.serve_url}/acme/assistant/v1/chat/completions"

    with httpx.Client(timeout=30, trust_env=False) as http:
        # Each client, three times, by the header (once asking for the other group) or the
        # body's `user`: always its bucket's group, labelled with what answered.
        for client in clients:
            group = expected[client]
            other = "stable" if group == "canary" else "canary"
            for answer in (
                _ask(http, url, key, {"x-client-key": client}),
                _ask(http, url, key, {"x-client-key": client, "x-ab-group": other}),
                _ask(http, url, key, user=client),
            ):
                assert answer.status_code == 200, answer.text
                assert answer.headers["x-ab-group"] == group, client
                version, fingerprint = labels[group]
                assert answer.headers["x-model-version"] == version
                assert answer.headers["x-model-fingerprint"] == fingerprint
        # A stream says it too, for whichever group answers it.
        for client in (next(c for c in clients if expected[c] == g) for g in labels):
            with http.stream(
                "POST", chat,
                json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                      "stream": True},
                headers={"authorization": f"Bearer {key}", "x-client-key": client},
            ) as stream:  # fmt: skip
                assert stream.status_code == 200
                group = stream.headers["x-ab-group"]
                assert group == expected[client]
                assert stream.headers["x-model-version"] == labels[group][0]
                assert stream.headers["x-model-fingerprint"] == labels[group][1]
                lines = [line for line in stream.iter_lines() if line.startswith("data: ")]
            assert lines[-1] == "data: [DONE]"
        # A refusal after routing names the version too; one before routing (a key too long
        # for a sticky deployment) says why and names the header.
        group = expected[clients[0]]
        refused = _ask(http, url, key, {"x-client-key": clients[0]}, prompt="hello " * 3000)
        assert refused.status_code == 400, refused.text
        assert "prompt" in refused.json()["error"]["message"]
        assert refused.headers["x-ab-group"] == group
        assert refused.headers["x-model-fingerprint"] == labels[group][1]
        too_long = _ask(http, url, key, {"x-client-key": "k" * 300})
        assert too_long.status_code == 400
        assert too_long.json()["error"]["code"] == "invalid_client_key"
        assert "x-client-key" in too_long.json()["error"]["message"]

        # B3: the single header, then the multi headers, continue the same trace.
        single = _ask(http, url, key, {"b3": f"{TRACE128}-{SPAN}-1"})
        assert single.status_code == 200
        assert single.headers["traceparent"].split("-")[1] == TRACE128
        assert single.headers["b3"].split("-")[0] == TRACE128
        assert single.headers["b3"].split("-")[1] == single.headers["traceparent"].split("-")[2]
        multi = _ask(
            http, url, key, {"x-b3-traceid": TRACE64, "x-b3-spanid": SPAN, "x-b3-sampled": "1"}
        )
        assert multi.headers["x-b3-traceid"] == TRACE64
        assert multi.headers["traceparent"].split("-")[1] == "0" * 16 + TRACE64
        assert multi.headers["x-b3-spanid"] != SPAN  # the router's own span
        # Malformed B3 is ignored: a new trace.
        bad = _ask(http, url, key, {"b3": f"{TRACE128[:-1]}-{SPAN}-1"})
        assert bad.status_code == 200
        assert bad.headers["traceparent"].split("-")[1] not in (TRACE128, TRACE128[:-1])

        # The routers' record: every client always saw one group.
        deadline = time.monotonic() + 30
        split = split_consistency(deployment=deployment)
        while time.monotonic() < deadline and (split is None or split["clients"] < len(clients)):
            time.sleep(0.5)
            split = split_consistency(deployment=deployment)
        assert split is not None and split["clients"] == len(clients), split
        assert split["consistency_pct"] == 100.0 and split["flipped_total"] == 0
        assert split["sticky"] and split["percent"] == 30

        # Raising the percent (weights only): clients only move from stable to canary.
        deployments.deployment_set_traffic(
            tenant=world_a.tenant, actor=actor, deployment=deployment, percent=60
        )
        control.reconcile(target=ray_cluster.target)
        raised = {c: sticky_group(bucket_of(salt, c), 60) for c in clients}
        movers = [c for c in clients if expected[c] == "stable" and raised[c] == "canary"]
        assert movers and all(raised[c] == "canary" for c in clients if expected[c] == "canary")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            answer = _ask(http, url, key, {"x-client-key": movers[0]})
            if answer.headers["x-ab-group"] == "canary":
                break
            time.sleep(0.3)
        for client in clients:
            answer = _ask(http, url, key, {"x-client-key": client})
            assert answer.headers["x-ab-group"] == raised[client], client
