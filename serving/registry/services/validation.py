"""Validation of a registered version: registered -> validating -> ready | failed.

Runs the engine's checks (checksum, config, architecture, weights and shapes, tokenizer, one
forward pass) under the checkpoint bounds of `config_limits()`, records each step in the row as
it goes, and fails a version whose validation keeps killing its worker.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.conf import settings
from django.db import transaction

from serving.engine.config import ConfigLimits
from serving.registry import artifacts, golden
from serving.registry.checks import since
from serving.registry.models import ArtifactSource, ModelVersion, VersionStatus
from serving.registry.services.versions import FILES_DELETED, set_status
from tenants.actors import Actor
from tenants.models import Tenant

logger = logging.getLogger(__name__)

VALIDATOR = Actor(system="version_validate")
DEFAULT_VALIDATION_MAX_ATTEMPTS = 3
# ConfigLimits field -> the setting that overrides its default.
LIMIT_SETTINGS = {
    "max_vocab_size": "ENGINE_MAX_VOCAB_SIZE",
    "max_hidden_size": "ENGINE_MAX_HIDDEN_SIZE",
    "max_intermediate_size": "ENGINE_MAX_INTERMEDIATE_SIZE",
    "max_hidden_layers": "ENGINE_MAX_HIDDEN_LAYERS",
    "max_attention_heads": "ENGINE_MAX_ATTENTION_HEADS",
    "max_head_dim": "ENGINE_MAX_HEAD_DIM",
    "max_position_embeddings": "ENGINE_MAX_POSITION_EMBEDDINGS",
    "max_validation_bytes": "ENGINE_VALIDATION_MAX_BYTES",
    "max_tokenizer_bytes": "ENGINE_MAX_TOKENIZER_BYTES",
    "max_header_bytes": "ENGINE_MAX_SAFETENSORS_HEADER_BYTES",
    "max_tensors": "ENGINE_MAX_TENSORS",
}


class _Progress:
    """Records each validation step in the row as it starts and ends (the pages poll it)."""

    def __init__(self, version_id: int) -> None:
        self.version_id = version_id
        self.steps: list[dict[str, Any]] = []
        self.started = time.perf_counter()

    def _close_running(self, state: str) -> None:
        if self.steps and self.steps[-1]["state"] == "running":
            self.steps[-1].update(state=state, seconds=since(self.started))

    def _write(self) -> None:
        ModelVersion.objects.filter(pk=self.version_id, status=VersionStatus.VALIDATING).update(
            validation_steps=self.steps
        )

    def __call__(self, step: str) -> None:
        self._close_running("ok")
        self.started = time.perf_counter()
        self.steps.append({"step": step, "state": "running", "seconds": None})
        self._write()

    def finish(self, *, ok: bool) -> list[dict[str, Any]]:
        self._close_running("ok" if ok else "failed")
        return self.steps


def _failure_reason(exc: BaseException) -> str:
    from celery.exceptions import SoftTimeLimitExceeded

    if isinstance(exc, SoftTimeLimitExceeded):
        return "validation took longer than its time limit"
    return f"validation error: {type(exc).__name__}: {exc}"[:500]


def version_validate(*, tenant: Tenant, version_id: int) -> ModelVersion | None:
    """Validate a registered version: registered -> validating -> ready | failed.

    Runs the checks of each engine the version is registered for (the built-in one: checksum,
    config, architecture, weights and shapes, tokenizer, one forward pass; vLLM: its
    architecture registry and one load in vLLM), recording each step as it goes. Returns
    None if the version is gone; a version already ready or failed is left as it is."""
    from serving.engine.checkpoint import validate_checkpoint
    from serving.engine.config import CheckpointError

    max_attempts = int(
        getattr(settings, "MODEL_VALIDATION_MAX_ATTEMPTS", DEFAULT_VALIDATION_MAX_ATTEMPTS)
    )
    with transaction.atomic():
        version = (
            ModelVersion.objects.select_for_update()
            .select_related("tenant", "model")
            .filter(pk=version_id, tenant=tenant)
            .first()
        )
        if version is None or version.is_final:
            return version
        if version.validation_attempts >= max_attempts:
            # Each earlier run was cut off (the worker died: out of memory, killed) and the
            # task came back (acks_late): running it again would only kill the next worker.
            _fail_version(
                version,
                reason=f"validation was interrupted {version.validation_attempts} times (the "
                "worker died); the checkpoint is refused",
                steps=[
                    {**step, "state": "failed"} if step.get("state") == "running" else step
                    for step in version.validation_steps
                ],
            )
            return version
        set_status(
            version=version,
            status=VersionStatus.VALIDATING,
            actor=VALIDATOR,
            steps=[],
            extra_fields={"validation_attempts": version.validation_attempts + 1},
        )
        uri, expected = version.artifact_uri, version.expected_sha256 or None
        engines = tuple(version.engines or ["builtin"])
        tenant_prompts = list((version.golden or {}).get("tenant_prompts") or [])

    progress = _Progress(version_id)
    report = None
    golden_doc: dict[str, Any] = {}
    reason = ""
    try:
        directory = artifacts.local_directory(uri)
        report = validate_checkpoint(
            directory,
            expected_sha256=expected,
            progress=progress,
            limits=config_limits(),
            engines=engines,
        )
        if report.config is not None:  # the built-in engine runs it: record its answers
            progress("golden answers")
            golden_doc = golden.record(directory, tenant_prompts)
    except (CheckpointError, artifacts.ArtifactRejected) as exc:
        reason = exc.reason
    except Exception as exc:  # a crash must still end the version as failed, with the cause
        logger.exception("validation of model version %s crashed", version_id)
        reason = _failure_reason(exc)
    steps = progress.finish(ok=report is not None)

    with transaction.atomic():
        version = (
            ModelVersion.objects.select_for_update()
            .select_related("tenant", "model")
            .filter(pk=version_id, tenant=tenant)
            .first()
        )
        if version is None or version.status != VersionStatus.VALIDATING:
            return version
        if report is None:
            _fail_version(version, reason=reason, steps=steps)
        else:
            fields = {
                "sha256": report.sha256,
                "size_bytes": report.size_bytes,
                "format": report.format,
                "config_summary": report.summary(),
                "golden": golden_doc,
            }
            set_status(
                version=version,
                status=VersionStatus.READY,
                actor=VALIDATOR,
                steps=steps,
                extra_fields=fields,
            )
    return version


def config_limits() -> ConfigLimits:
    """The engine's checkpoint bounds, each overridable by its setting (LIMIT_SETTINGS)."""
    defaults = ConfigLimits()
    values = {
        name: int(getattr(settings, setting, getattr(defaults, name)))
        for name, setting in LIMIT_SETTINGS.items()
    }
    return ConfigLimits(**values)


def _fail_version(version: ModelVersion, *, reason: str, steps: list[dict[str, Any]]) -> None:
    """Fail a locked version; an upload's files leave the store once that commits (the
    reason says so) and stop counting against the storage quota. A registered local
    directory is the client's and is never touched."""
    uri = version.artifact_uri if version.source == ArtifactSource.UPLOAD else ""
    if uri:
        reason = f"{reason} ({FILES_DELETED})"
    set_status(
        version=version,
        status=VersionStatus.FAILED,
        actor=VALIDATOR,
        reason=reason,
        steps=steps,
        extra_fields={"stored_bytes": 0},
    )
    if uri:
        transaction.on_commit(lambda: artifacts.remove_stored(uri))
