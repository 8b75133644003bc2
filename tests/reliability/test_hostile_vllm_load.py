"""The vLLM load check of a version: an engine process that dies under the load (an upstream
crash on a busy CPU machine) gets one more load before the version is refused, and the refusal
carries the engine's own reason. Hostile: a tenant's checkpoint built to crash vLLM's engine
buys at most two loads (each under the check's timeout), never a loop of them. The child
process is stood in for: no vLLM runs here."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from serving.engine.config import CheckpointError
from serving.engine.vllm import validate

DIED = {
    "supported": True,
    "registry_s": 0.1,
    "error": "EngineCore encountered an issue. See stack trace (above) for the root cause.",
    "engine_died": True,
}
LOADED = {"supported": True, "registry_s": 0.1, "seconds": 2.0, "tokens": [4, 5]}
ENGINE_SAID = "(EngineCore pid=12) RuntimeError: could not allocate the KV cache"


@pytest.fixture
def checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr("serving.engine.vllm.available", lambda: True)
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 64)
    return tmp_path


def _children(monkeypatch: pytest.MonkeyPatch, reports: list[dict[str, Any]]) -> list[int]:
    runs: list[int] = []

    def run(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        report = reports[len(runs)]
        runs.append(1)
        stderr = f"Traceback (most recent call last):\n{ENGINE_SAID}\n"
        return subprocess.CompletedProcess(args, 0, json.dumps(report) + "\n", stderr)

    monkeypatch.setattr(validate.subprocess, "run", run)
    return runs


def _check(directory: Path) -> dict[str, Any]:
    raw = {"architectures": ["LlamaForCausalLM"]}
    return validate.validate_for_vllm(directory, raw, step=lambda name: 0.0,
                                      done=lambda name, began: None)  # fmt: skip


def test_an_engine_that_died_once_gets_one_more_load(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = _children(monkeypatch, [DIED, LOADED])
    assert _check(checkpoint)["tokens"] == [4, 5]
    assert len(runs) == 2


def test_an_engine_that_dies_twice_refuses_the_version_with_its_reason(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = _children(monkeypatch, [DIED, DIED, LOADED])
    with pytest.raises(CheckpointError) as caught:
        _check(checkpoint)
    assert caught.value.field == "engines"
    assert "could not allocate the KV cache" in str(caught.value)
    assert len(runs) == 2  # no third load


def test_a_load_error_of_the_checkpoint_is_not_tried_again(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = {"supported": True, "registry_s": 0.1, "error": "size mismatch for lm_head.weight"}
    runs = _children(monkeypatch, [bad, LOADED])
    with pytest.raises(CheckpointError, match="size mismatch"):
        _check(checkpoint)
    assert len(runs) == 1
