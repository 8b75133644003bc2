"""Symptoms from what Serve and the replicas said (out of memory, tokenizer errors, load
failures): classified by pattern, shown as evidence on the incident's page and API, matched by
the seeded causes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from incidents import services
from incidents.rca.symptoms import MAX_TEXT_CHARS, classify
from serving.deployments.models import Deployment, DeploymentRevision
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.incidents.factories import breach
from tests.incidents.learning_support import OOM, api, incident_of, page, serve_says

CASES = [
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "out_of_memory"),
    ("ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.", "out_of_memory"),
    ("Worker exited: oom-kill (memory limit 8Gi)", "out_of_memory"),
    ("OSError: Can't load tokenizer for '/models/llama'. tokenizer.json is missing", "tokenizer_error"),
    ("ValueError: vocab size 32000 does not match the embedding (32001)", "tokenizer_error"),
    ("safetensors_rust.SafetensorError: Error while deserializing header: incomplete metadata", "load_failure"),
    ("RuntimeError: Error(s) in loading state_dict for LlamaForCausalLM", "load_failure"),
    ("FileNotFoundError: [Errno 2] No such file or directory: '/models/x/config.json'", "load_failure"),
    ("The deployment failed to start 3 times in a row. This may be due to a problem with its constructor", "load_failure"),
    ("RuntimeError: CUDA error: device-side assert triggered", "cuda_error"),
    ("Ray cannot place 1 replica(s) asking for 3 CPU each", "unplaceable"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "symptom"), CASES, ids=[c[1] + str(i) for i, c in enumerate(CASES)]
)
def test_messages_are_classified(text: str, symptom: str) -> None:
    assert [name for name, _ in classify(f"Serve says:\n{text}\n")] == [symptom]
    assert classify(text)[0][1] == text.strip()


def test_healthy_messages_and_huge_ones() -> None:
    assert classify("1 replica healthy\nRUNNING") == []
    assert classify("") == []
    flood = "fine\n" * (MAX_TEXT_CHARS // 5) + "CUDA out of memory"
    assert classify(flood) == []  # past the bound: not read
    both = classify("OutOfMemoryError: CUDA out of memory\nCan't load tokenizer")
    assert [name for name, _ in both] == ["out_of_memory", "tokenizer_error"]


@pytest.mark.django_db
def test_serve_messages_become_evidence_and_hints(world_a: TenantWorld) -> None:
    deployment = serve_says(world_a, OOM)
    revision = deployment.current_revision
    DeploymentRevision.objects.filter(pk=revision.pk).update(
        serve_status="FAILED",
        serve_message="OSError: Can't load tokenizer for '/models/assistant'",
    )
    incident = incident_of(world_a)
    hints = world_a.client("viewer").get(api("incident-hints", pk=incident.pk)).json()
    found = {(s["symptom"], s["source"].split(" (")[0]) for s in hints["symptoms"]}
    assert found == {
        ("out_of_memory", "deployment status"),
        ("tokenizer_error", f"revision r{revision.number}"),
    }
    assert hints["signals"]["serve_out_of_memory"] == 1.0
    assert hints["signals"]["serve_tokenizer_error"] == 1.0
    causes = [h["cause"] for h in hints["hints"]]
    assert {"Out of GPU memory", "Tokenizer mismatch"} <= set(causes)
    html = world_a.client("viewer").get(page(world_a, "incident-detail", pk=incident.pk))
    body = html.content.decode()
    assert 'data-symptom="out_of_memory"' in body and "CUDA out of memory" in body
    assert 'data-symptom="tokenizer_error"' in body


@pytest.mark.django_db
def test_a_failed_hot_reload_is_a_replicas_own_report(world_a: TenantWorld) -> None:
    _, incident, _ = breach(
        world_a,
        objective="reload-failed:stable:r1:1",
        kind="reload",
        severity="ticket",
        action="notify",
        detail="hot reload of v2 on the stable slot failed (replica r1)",
        observed={"replica": "r1", "error": "safetensors: header too large"},
    )
    hints = world_a.client("viewer").get(api("incident-hints", pk=incident.pk)).json()
    assert [(s["symptom"], s["source"]) for s in hints["symptoms"]] == [
        ("load_failure", "replica r1 (hot reload)")
    ]
    assert hints["hints"][0]["cause"] == "Model fails to load"


@pytest.mark.django_db
def test_an_old_status_message_is_not_this_incidents(world_a: TenantWorld) -> None:
    incident = incident_of(world_a)
    deployment = serve_says(world_a, OOM)
    Deployment.objects.filter(pk=deployment.pk).update(
        status_at=timezone.now() + timedelta(hours=2)
    )
    services.incident_resolve(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner), incident=incident
    )
    hints = world_a.client("viewer").get(api("incident-hints", pk=incident.pk)).json()
    assert hints["symptoms"] == []  # said after the incident was over
