"""Golden prompts: validation records a version's greedy answers to the default prompts (equal
to a greedy decode through the model's reference forward pass, a path that shares no batching
or cache code with the engine); a tenant adds bounded prompts of its own, recorded from the
validated checkpoint only while its files still match the checksum."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from serving.deployments.models import Deployment
from serving.engine.checkpoint import load_tensors, load_tokenizer
from serving.engine.config import read_config
from serving.engine.model import LlamaModel
from serving.engine.testing import write_tiny_checkpoint
from serving.registry import artifacts, golden, services
from serving.registry.models import ModelVersion
from serving.registry.services import golden as golden_services
from tenants.actors import Actor
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db


def _served_version(world: TenantWorld) -> ModelVersion:
    deployment = Deployment.objects.get(tenant=world.tenant, name="assistant")
    return deployment.current_revision.stable_version


def _reference_greedy(directory: Path, prompt: str, n: int) -> list[int]:
    config = read_config(directory)
    tokenizer = load_tokenizer(directory)
    model = LlamaModel(config, load_tensors(directory, config))
    ids = tokenizer.encode(prompt).ids
    out: list[int] = []
    with torch.inference_mode():
        for _ in range(n):
            logits = model.reference_logits(torch.tensor(ids + out, dtype=torch.long))
            token = int(torch.argmax(logits[-1]))
            out.append(token)
            if token in config.eos_token_ids:
                break
    return out


def test_validation_records_the_greedy_answers_of_the_default_prompts(
    world_a: TenantWorld,
) -> None:
    version = _served_version(world_a)
    document = version.golden
    assert [p["prompt"] for p in document["prompts"]] == list(golden.DEFAULT_PROMPTS)
    assert document["max_tokens"] == golden.GOLDEN_MAX_TOKENS
    assert "golden answers" in [s["step"] for s in version.validation_steps]
    directory = artifacts.local_directory(version.artifact_uri)
    for entry in document["prompts"]:
        expected = _reference_greedy(directory, entry["prompt"], golden.GOLDEN_MAX_TOKENS)
        assert entry["tokens"] == expected, entry
        assert entry["answer"] == load_tokenizer(directory).decode(expected)


def test_a_tenant_adds_bounded_prompts_of_its_own(
    world_a: TenantWorld, django_capture_on_commit_callbacks: Any
) -> None:
    version = _served_version(world_a)
    url = f"/api/v1/models/{version.model_id}/versions/{version.pk}/golden/"
    client = world_a.client("operator")
    mine = ["Refund policy: customers may", "The quick brown fox"]  # the second is a default
    with django_capture_on_commit_callbacks(execute=True):
        response = client.put(url, {"prompts": mine}, format="json")
    assert response.status_code == 202, response.content
    version.refresh_from_db()
    prompts = version.golden["prompts"]
    assert len(prompts) == len(golden.DEFAULT_PROMPTS) + 1
    assert prompts[-1]["prompt"] == mine[0] and prompts[-1]["source"] == "tenant"
    assert version.golden["tenant_prompts"] == [mine[0]]

    for body, field in [
        ({"prompts": ["x"] * 5}, "prompts"),
        ({"prompts": ["y" * 201]}, "prompts[0]"),
        ({"prompts": ["   "]}, "prompts[0]"),
        ({"prompts": ["a", "a"]}, "prompts"),
    ]:
        bad = client.put(url, body, format="json")
        assert bad.status_code == 400 and field in bad.json()["error"]["fields"], bad.json()
    assert world_a.client("viewer").put(url, {"prompts": []}, format="json").status_code == 403
    registered = world_a.version
    url = f"/api/v1/models/{registered.model_id}/versions/{registered.pk}/golden/"
    response = client.put(url, {"prompts": []}, format="json")
    assert response.status_code == 409 and "version" in response.json()["error"]["fields"]


def test_golden_requests_are_throttled_and_tenant_scoped(
    world_a: TenantWorld, world_b: TenantWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(golden_services, "GOLDEN_REQUESTS_PER_HOUR", 1)
    version = _served_version(world_a)
    url = f"/api/v1/models/{version.model_id}/versions/{version.pk}/golden/"
    client = world_a.client("operator")
    assert client.put(url, {"prompts": []}, format="json").status_code == 202
    assert client.put(url, {"prompts": []}, format="json").status_code == 429
    assert world_b.client("operator").put(url, {"prompts": []}, format="json").status_code == 404


def test_a_checkpoint_changed_since_validation_records_nothing(
    world_a: TenantWorld, tmp_path: Path
) -> None:
    directory = write_tiny_checkpoint(tmp_path / "v9", seed=9)
    model = _served_version(world_a).model
    version = services.version_register_path(
        tenant=world_a.tenant,
        actor=Actor(user=world_a.owner),
        model=model,
        label="v9",
        path=str(directory),
    )
    version = services.version_validate(tenant=world_a.tenant, version_id=version.pk)
    recorded = version.golden
    other = write_tiny_checkpoint(tmp_path / "other", seed=10)
    (directory / "model.safetensors").write_bytes((other / "model.safetensors").read_bytes())
    version = golden_services.version_golden_record(version_id=version.pk, prompts=["Hi there"])
    version.refresh_from_db()
    assert version.golden == recorded  # the tampered weights' answers were never recorded


def test_golden_answers_are_read_under_the_configured_limits(tmp_path: Path) -> None:
    """Raised limits: a checkpoint validation accepts records its answers; lowered ones bound
    the golden step too (never an unbounded load)."""
    from django.test import override_settings

    from serving.engine.checkpoint import CheckpointError

    directory = write_tiny_checkpoint(tmp_path / "ckpt", max_position_embeddings=200_000)
    with override_settings(ENGINE_MAX_POSITION_EMBEDDINGS=262_144):
        assert len(golden.record(directory)["prompts"]) == len(golden.DEFAULT_PROMPTS)
    raised = override_settings(ENGINE_MAX_POSITION_EMBEDDINGS=262_144)
    lowered = override_settings(ENGINE_MAX_TOKENIZER_BYTES=16)
    with raised, lowered, pytest.raises(CheckpointError) as err:
        golden.record(directory)
    assert err.value.field == "tokenizer"
