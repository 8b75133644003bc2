"""Checkpoint validation: each broken artifact fails with a reason that says what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serving.engine.checkpoint import directory_sha256, validate_checkpoint
from serving.engine.config import CheckpointError
from serving.engine.testing import write_tiny_checkpoint


def test_a_good_checkpoint_passes_every_step(tmp_path: Path) -> None:
    directory = write_tiny_checkpoint(tmp_path / "ok")
    seen: list[str] = []
    report = validate_checkpoint(
        directory, expected_sha256=directory_sha256(directory), progress=seen.append
    )
    assert seen == ["checksum", "config", "weights", "tokenizer", "forward"]
    assert [s["step"] for s in report.steps] == seen
    assert report.summary()["architecture"] == "LlamaForCausalLM"
    assert report.summary()["num_key_value_heads"] == 2
    assert report.size_bytes > 0


def _broken(tmp_path: Path, how: str) -> tuple[Path, str | None]:
    directory = write_tiny_checkpoint(tmp_path / how)
    expected = None
    weights = directory / "model.safetensors"
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text())
    if how == "checksum":
        expected = "0" * 64
    elif how == "truncated":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif how == "architecture":
        config_path.write_text(json.dumps({**config, "architectures": ["GPT2LMHeadModel"]}))
    elif how == "shape":
        config_path.write_text(json.dumps({**config, "intermediate_size": 96}))
    elif how == "config":
        config_path.write_text("{not json")
    elif how == "missing-field":
        del config["hidden_size"]
        config_path.write_text(json.dumps(config))
    elif how == "tokenizer":
        (directory / "tokenizer.json").unlink()
    elif how == "no-weights":
        weights.unlink()
    elif how == "symlink":
        (directory / "extra.bin").symlink_to("/etc/hostname")
    return directory, expected


@pytest.mark.parametrize(
    ("how", "reason"),
    [
        ("checksum", "checksum mismatch"),
        ("truncated", "does not load"),
        ("architecture", "unsupported architecture 'GPT2LMHeadModel'"),
        ("shape", "mlp.gate_proj.weight has shape (128, 64), config says (96, 64)"),
        ("config", "config.json does not parse"),
        ("missing-field", "missing field 'hidden_size'"),
        ("tokenizer", "tokenizer.json is missing"),
        ("no-weights", "no *.safetensors"),
        ("symlink", "extra.bin is a symlink"),
    ],
)
def test_broken_checkpoints_fail_with_a_reason(tmp_path: Path, how: str, reason: str) -> None:
    directory, expected = _broken(tmp_path, how)
    with pytest.raises(CheckpointError) as caught:
        validate_checkpoint(directory, expected_sha256=expected)
    assert reason in caught.value.reason
