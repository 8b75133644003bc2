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
    assert seen == ["checksum", "config", "weights", "tokenizer", "chat template", "forward"]
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


# --- config types and bounds ---------------------------------------------------------------


def _with_config(tmp_path: Path, text: str | None = None, **changes: object) -> Path:
    directory = write_tiny_checkpoint(tmp_path / "c")
    path = directory / "config.json"
    if text is None:
        text = json.dumps({**json.loads(path.read_text()), **changes})
    path.write_text(text)
    return directory


@pytest.mark.parametrize(
    ("changes", "field", "reason"),
    [
        ({"num_hidden_layers": True}, "num_hidden_layers", "'num_hidden_layers' must be int"),
        ({"max_position_embeddings": 4096.0}, "max_position_embeddings", "must be int"),
        ({"max_position_embeddings": "4096"}, "max_position_embeddings", "must be int"),
        ({"vocab_size": -5}, "vocab_size", "'vocab_size' must be positive, got -5"),
        ({"hidden_size": 0}, "hidden_size", "'hidden_size' must be positive"),
        ({"num_key_value_heads": 3}, "num_key_value_heads", "must divide num_attention_heads"),
        ({"num_key_value_heads": True}, "num_key_value_heads", "must be int, got True"),
        ({"head_dim": 7}, "head_dim", "head_dim 7 must be an even integer"),
        ({"hidden_size": 66}, "num_attention_heads", "66 is not a multiple of"),
        ({"rope_theta": 1e400}, "rope_theta", "'rope_theta' must be finite"),
        ({"rope_theta": -1.0}, "rope_theta", "'rope_theta' must be positive"),
        ({"rms_norm_eps": 2}, "rms_norm_eps", "rms_norm_eps 2.0 must be below 1"),
        ({"tie_word_embeddings": "false"}, "tie_word_embeddings", "must be bool"),
        ({"eos_token_id": ["</s>"]}, "eos_token_id", "non-negative integer token ids"),
        ({"eos_token_id": list(range(100))}, "eos_token_id", "lists 100 ids, the limit is 64"),
        ({"bos_token_id": 10**6}, "bos_token_id", "outside the vocabulary (320 tokens)"),
    ],
)
def test_config_fields_are_type_checked(
    tmp_path: Path, changes: dict[str, object], field: str, reason: str
) -> None:
    with pytest.raises(CheckpointError) as caught:
        validate_checkpoint(_with_config(tmp_path, **changes))
    assert reason in caught.value.reason
    assert caught.value.field == field


def test_a_number_too_long_to_parse_and_a_huge_config_are_refused(tmp_path: Path) -> None:
    digits = "1" + "0" * 5000  # json.loads refuses ints past 4300 digits with a ValueError
    directory = _with_config(tmp_path, text=f'{{"max_position_embeddings": {digits}}}')
    with pytest.raises(CheckpointError, match="config.json does not parse"):
        validate_checkpoint(directory)
    (directory / "config.json").write_text(" " * (2 << 20) + "{}")
    with pytest.raises(CheckpointError, match=r"config.json is 2.0 MiB, over the limit of 1.0"):
        validate_checkpoint(directory)


def test_without_limits_only_the_structure_is_checked(tmp_path: Path) -> None:
    """Loading an already validated version (the data plane) applies no size bounds: a
    portal may have raised them above the engine's defaults."""
    from serving.engine.config import ConfigLimits, read_config

    directory = _with_config(tmp_path, max_position_embeddings=10**7)
    assert read_config(directory).max_position_embeddings == 10**7
    with pytest.raises(CheckpointError, match="exceeds the limit 131072"):
        read_config(directory, limits=ConfigLimits())


# --- safetensors headers, checked before any tensor is loaded ------------------------------


def _write_safetensors(path: Path, header: dict[str, object], data: bytes) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data)


@pytest.fixture
def no_tensor_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    import serving.engine.checkpoint as checkpoint_module

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a tensor was loaded before the headers were checked")

    monkeypatch.setattr(checkpoint_module, "safe_open", refuse)


@pytest.mark.parametrize(
    ("how", "reason"),
    [
        ("huge-tensor", "declares shape (1000000, 1000000) (3.6 TiB of F32) but the file holds"),
        ("offsets-lie", "declares shape (320, 64) (80.0 KiB of F32) but the file holds"),
        ("huge-header-length", "its header is 4096.0 PiB, over the limit of 16.0 MiB"),
        ("header-past-the-end", "the header declares 1000 bytes, the file is 18"),
        ("not-json", "the header is not JSON"),
        ("int-tensor", "model.embed_tokens.weight is not a floating-point tensor (dtype 'I32'"),
        ("bool-shape", "tensor model.embed_tokens.weight has no usable shape"),
        ("trailing", "16 bytes of data belong to no tensor"),
        ("shape", "mlp.gate_proj.weight has shape (128, 64), config says (96, 64)"),
    ],
)
@pytest.mark.usefixtures("no_tensor_loads")
def test_lying_headers_are_refused_before_loading(tmp_path: Path, how: str, reason: str) -> None:
    directory = write_tiny_checkpoint(tmp_path / "c")
    weights = directory / "model.safetensors"
    embed = "model.embed_tokens.weight"
    if how == "huge-tensor":
        header = {embed: {"dtype": "F32", "shape": [10**6, 10**6], "data_offsets": [0, 4 * 10**12]}}
        _write_safetensors(weights, header, b"\0" * 64)
    elif how == "offsets-lie":
        _write_safetensors(
            weights, {embed: {"dtype": "F32", "shape": [320, 64], "data_offsets": [0, 81920]}}, b""
        )
    elif how == "huge-header-length":
        weights.write_bytes((1 << 62).to_bytes(8, "little") + b"{}")
    elif how == "header-past-the-end":
        weights.write_bytes((1000).to_bytes(8, "little") + b"{}" + b"\0" * 8)
    elif how == "not-json":
        weights.write_bytes((5).to_bytes(8, "little") + b"{{{{{")
    elif how == "int-tensor":
        _write_safetensors(
            weights, {embed: {"dtype": "I32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8
        )
    elif how == "bool-shape":
        _write_safetensors(
            weights, {embed: {"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}}, b"\0" * 4
        )
    elif how == "trailing":
        weights.write_bytes(weights.read_bytes() + b"\0" * 16)
    elif how == "shape":
        config = json.loads((directory / "config.json").read_text())
        (directory / "config.json").write_text(json.dumps({**config, "intermediate_size": 96}))
    with pytest.raises(CheckpointError) as caught:
        validate_checkpoint(directory)
    assert reason in caught.value.reason
    assert caught.value.field == "weights"


def test_header_size_and_tensor_count_are_bounded(tmp_path: Path) -> None:
    from serving.engine.config import ConfigLimits

    directory = write_tiny_checkpoint(tmp_path / "c")
    with pytest.raises(CheckpointError, match="its header is .* over the limit of 512 bytes"):
        validate_checkpoint(directory, limits=ConfigLimits(max_header_bytes=512))
    with pytest.raises(CheckpointError, match="declares 21 tensors, the limit is 5"):
        validate_checkpoint(directory, limits=ConfigLimits(max_tensors=5))


def test_a_tokenizer_file_over_its_limit_is_not_parsed(tmp_path: Path) -> None:
    from serving.engine.config import ConfigLimits

    directory = write_tiny_checkpoint(tmp_path / "c")
    size = (directory / "tokenizer.json").stat().st_size
    with pytest.raises(CheckpointError, match="tokenizer.json is .* over the limit") as caught:
        validate_checkpoint(directory, limits=ConfigLimits(max_tokenizer_bytes=size - 1))
    assert caught.value.field == "tokenizer"


# --- RoPE tables grow with use, not with max_position_embeddings ---------------------------


def test_rope_tables_are_built_lazily_and_match_eager_ones(tmp_path: Path) -> None:
    import torch

    from serving.engine.checkpoint import load_tensors
    from serving.engine.config import read_config
    from serving.engine.model import ROPE_MIN_POSITIONS, LlamaModel, Segment, build_batch

    short = write_tiny_checkpoint(tmp_path / "short", max_position_embeddings=64)
    long = write_tiny_checkpoint(tmp_path / "long", max_position_embeddings=131072)
    models = []
    for directory in (short, long):
        config = read_config(directory)
        models.append(LlamaModel(config, load_tensors(directory, config)))
    short_model, long_model = models
    assert short_model.cos.shape[0] == long_model.cos.shape[0] == 0
    ids = torch.tensor([5, 6, 7, 8])
    assert torch.allclose(
        short_model.reference_logits(ids), long_model.reference_logits(ids), atol=1e-6
    )
    assert short_model.cos.shape[0] == 64  # capped by the config
    assert long_model.cos.shape[0] == ROPE_MIN_POSITIONS
    # A sequence reaching further grows the tables (doubling), never past the config.
    from serving.engine.model import KVCache

    start = ROPE_MIN_POSITIONS + 10
    blocks = start // 16 + 2
    cache = KVCache(long_model.config, blocks, 16)
    seg = Segment([5], start, list(range(blocks)))
    long_model.forward(build_batch([seg], 16, long_model.device), cache)
    assert long_model.cos.shape[0] == 2 * ROPE_MIN_POSITIONS
    seg = Segment([5], 64, list(range(5)))
    with pytest.raises(ValueError, match="beyond max_position_embeddings"):
        short_model.forward(
            build_batch([seg], 16, short_model.device), KVCache(short_model.config, 5, 16)
        )
