"""The model configuration the engine supports, parsed from a Hugging Face `config.json`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM",)


class CheckpointError(Exception):
    """A checkpoint the engine cannot serve; `reason` says why in one line."""

    def __init__(self, reason: str, *, field: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.field = field


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    architecture: str

    def summary(self) -> dict[str, Any]:
        """What the registry shows about a version."""
        return {
            "architecture": self.architecture,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "parameters": self.parameter_count(),
        }

    def parameter_count(self) -> int:
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        q = self.num_attention_heads * self.head_dim
        kv = self.num_key_value_heads * self.head_dim
        per_layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h
        head = 0 if self.tie_word_embeddings else v * h
        return v * h + self.num_hidden_layers * per_layer + h + head


def _require(raw: dict[str, Any], name: str, kind: type) -> Any:
    if name not in raw:
        raise CheckpointError(f"config.json: missing field {name!r}", field=name)
    value: Any = raw[name]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    wrong_type = not isinstance(value, kind) or isinstance(value, bool) and kind is not bool
    if wrong_type:
        raise CheckpointError(
            f"config.json: {name!r} must be {kind.__name__}, got {value!r}", field=name
        )
    if kind in (int, float) and value <= 0:
        raise CheckpointError(f"config.json: {name!r} must be positive, got {value!r}", field=name)
    return value


def parse_config(raw: dict[str, Any]) -> LlamaConfig:
    """Validate a Hugging Face Llama config; raise CheckpointError naming the field."""
    if not isinstance(raw, dict):
        raise CheckpointError("config.json must hold a JSON object")
    architectures = raw.get("architectures") or []
    if not isinstance(architectures, list) or not architectures:
        raise CheckpointError("config.json: 'architectures' is missing", field="architectures")
    architecture = str(architectures[0])
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise CheckpointError(
            f"unsupported architecture {architecture!r} (supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)})",
            field="architectures",
        )
    if raw.get("rope_scaling") not in (None, {}):
        raise CheckpointError(
            f"config.json: rope_scaling {raw['rope_scaling']!r} is not supported",
            field="rope_scaling",
        )
    if raw.get("hidden_act", "silu") != "silu":
        raise CheckpointError(
            f"config.json: hidden_act {raw['hidden_act']!r} is not supported (silu only)",
            field="hidden_act",
        )
    hidden = _require(raw, "hidden_size", int)
    heads = _require(raw, "num_attention_heads", int)
    kv_heads = raw.get("num_key_value_heads", heads)
    if not isinstance(kv_heads, int) or kv_heads <= 0 or heads % kv_heads:
        raise CheckpointError(
            f"config.json: num_key_value_heads {kv_heads!r} must divide num_attention_heads "
            f"{heads}",
            field="num_key_value_heads",
        )
    head_dim = raw.get("head_dim") or hidden // heads
    if not isinstance(head_dim, int) or head_dim % 2 or ("head_dim" not in raw and hidden % heads):
        raise CheckpointError(
            f"config.json: head_dim {head_dim!r} must be an even integer", field="head_dim"
        )
    eos = raw.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if isinstance(eos, int) else ())
    return LlamaConfig(
        vocab_size=_require(raw, "vocab_size", int),
        hidden_size=hidden,
        intermediate_size=_require(raw, "intermediate_size", int),
        num_hidden_layers=_require(raw, "num_hidden_layers", int),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_theta=float(raw.get("rope_theta", 10000.0)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        bos_token_id=raw.get("bos_token_id") if isinstance(raw.get("bos_token_id"), int) else None,
        eos_token_ids=eos_ids,
        architecture=architecture,
    )


def read_config(directory: Path) -> LlamaConfig:
    path = directory / "config.json"
    if not path.is_file():
        raise CheckpointError("config.json is missing", field="config.json")
    try:
        raw = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"config.json does not parse: {exc}", field="config.json") from exc
    return parse_config(raw)
