"""The model configuration the engine supports, parsed from a Hugging Face `config.json`.

Every size field is type-checked and, for validation, bounded (`ConfigLimits`) before anything
proportional to it is built: a config is a few bytes that can ask for terabytes."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM",)
GIB = 1 << 30


class CheckpointError(Exception):
    """A checkpoint the engine cannot serve; `reason` says why in one line."""

    def __init__(self, reason: str, *, field: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.field = field


@dataclass(frozen=True)
class ConfigLimits:
    """Upper bounds a checkpoint must respect before validation builds anything from it.

    The defaults cover every public Llama-family model (Llama 3.1 405B: hidden 16384,
    intermediate 53248, 126 layers, 128 heads, vocab 128256); `max_validation_bytes` is what
    one validation may hold in memory (float32 weights, fused copies, one transient tensor)."""

    max_vocab_size: int = 1 << 20
    max_hidden_size: int = 65_536
    max_intermediate_size: int = 262_144
    max_hidden_layers: int = 512
    max_attention_heads: int = 1024
    max_head_dim: int = 1024
    max_position_embeddings: int = 131_072
    max_eos_tokens: int = 64
    max_validation_bytes: int = 2 * GIB
    max_config_bytes: int = 1 << 20
    max_tokenizer_bytes: int = 64 << 20
    max_header_bytes: int = 16 << 20
    max_tensors: int = 16_384


def human_bytes(size: int | float) -> str:
    """1536 -> '1.5 KiB' (messages a tenant reads)."""
    value = float(size)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(value) < 1024 or unit == "PiB":
            return f"{int(value)} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


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

    def largest_tensor_elements(self) -> int:
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        q = self.num_attention_heads * self.head_dim
        return max(v * h, i * h, q * h)

    def validation_bytes(self) -> int:
        """Peak memory a validation of this model needs, estimated from the config alone: the
        weights in float32, the fused q/k/v and gate/up copies LlamaModel makes, and one
        tensor in flight at float32 (loading and the NaN check go tensor by tensor)."""
        h, i = self.hidden_size, self.intermediate_size
        qkv = (self.num_attention_heads + 2 * self.num_key_value_heads) * self.head_dim * h
        fused = self.num_hidden_layers * (qkv + 2 * i * h)
        return 4 * (self.parameter_count() + fused + self.largest_tensor_elements())


def _require(raw: dict[str, Any], name: str, kind: type) -> Any:
    if name not in raw:
        raise CheckpointError(f"config.json: missing field {name!r}", field=name)
    return _typed(raw, name, kind)


def _typed(raw: dict[str, Any], name: str, kind: type, default: Any = None) -> Any:
    """raw[name] (or `default` when absent or null) checked for type; bool is not an int, and
    numbers must be positive and finite."""
    value: Any = raw.get(name)
    if value is None:
        return default
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        try:
            value = float(value)
        except OverflowError:
            value = math.inf
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise CheckpointError(
            f"config.json: {name!r} must be {kind.__name__}, got {_short(value)}", field=name
        )
    number: Any = value
    if kind is float and not math.isfinite(number):
        raise CheckpointError(f"config.json: {name!r} must be finite, got {value!r}", field=name)
    if kind in (int, float) and number <= 0:
        raise CheckpointError(
            f"config.json: {name!r} must be positive, got {_short(value)}", field=name
        )
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _bounded(name: str, value: int, limit: int | None) -> int:
    if limit is not None and value > limit:
        raise CheckpointError(
            f"config.json: {name} = {_short(value)} exceeds the limit {limit}", field=name
        )
    return value


def _token_id(raw: dict[str, Any], name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise CheckpointError(
            f"config.json: {name!r} must hold non-negative integer token ids, got {_short(value)}",
            field=name,
        )
    return value


def parse_config(raw: dict[str, Any], *, limits: ConfigLimits | None = None) -> LlamaConfig:
    """Validate a Hugging Face Llama config; raise CheckpointError naming the field.

    With `limits` (validation), every size is bounded and so is the memory a validation would
    need, all before anything is built; without (loading an already validated version), only
    the types and the structure are checked."""
    if not isinstance(raw, dict):
        raise CheckpointError("config.json must hold a JSON object", field="config.json")
    architectures = raw.get("architectures") or []
    if not isinstance(architectures, list) or not architectures:
        raise CheckpointError("config.json: 'architectures' is missing", field="architectures")
    architecture = architectures[0]
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise CheckpointError(
            f"unsupported architecture {_short(architecture)} (supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)})",
            field="architectures",
        )
    if raw.get("rope_scaling") not in (None, {}):
        raise CheckpointError(
            f"config.json: rope_scaling {_short(raw['rope_scaling'])} is not supported",
            field="rope_scaling",
        )
    if raw.get("hidden_act", "silu") != "silu":
        raise CheckpointError(
            f"config.json: hidden_act {_short(raw['hidden_act'])} is not supported (silu only)",
            field="hidden_act",
        )
    lim = limits

    def cap(name: str) -> int | None:
        return None if lim is None else int(getattr(lim, name))

    hidden = _bounded("hidden_size", _require(raw, "hidden_size", int), cap("max_hidden_size"))
    heads = _bounded(
        "num_attention_heads",
        _require(raw, "num_attention_heads", int),
        cap("max_attention_heads"),
    )
    kv_heads = _typed(raw, "num_key_value_heads", int, heads)
    if heads % kv_heads:
        raise CheckpointError(
            f"config.json: num_key_value_heads {kv_heads} must divide num_attention_heads {heads}",
            field="num_key_value_heads",
        )
    if "head_dim" not in raw or raw["head_dim"] is None:
        if hidden % heads:
            raise CheckpointError(
                f"config.json: hidden_size {hidden} is not a multiple of num_attention_heads "
                f"{heads} (and no head_dim is given)",
                field="num_attention_heads",
            )
        head_dim = hidden // heads
    else:
        head_dim = _typed(raw, "head_dim", int)
    if head_dim % 2:
        raise CheckpointError(
            f"config.json: head_dim {head_dim} must be an even integer", field="head_dim"
        )
    _bounded("head_dim", head_dim, cap("max_head_dim"))
    vocab = _bounded("vocab_size", _require(raw, "vocab_size", int), cap("max_vocab_size"))
    intermediate = _bounded(
        "intermediate_size",
        _require(raw, "intermediate_size", int),
        cap("max_intermediate_size"),
    )
    layers = _bounded(
        "num_hidden_layers",
        _require(raw, "num_hidden_layers", int),
        cap("max_hidden_layers"),
    )
    positions = _bounded(
        "max_position_embeddings",
        _typed(raw, "max_position_embeddings", int, 2048),
        cap("max_position_embeddings"),
    )
    tie = _typed(raw, "tie_word_embeddings", bool, False)
    bos_raw = raw.get("bos_token_id")
    bos = None if bos_raw is None else _token_id(raw, "bos_token_id", bos_raw)
    if bos is not None and bos >= vocab:
        raise CheckpointError(
            f"config.json: bos_token_id {bos} is outside the vocabulary ({vocab} tokens)",
            field="bos_token_id",
        )
    eos = raw.get("eos_token_id")
    eos_list = eos if isinstance(eos, list) else ([] if eos is None else [eos])
    if lim is not None and len(eos_list) > lim.max_eos_tokens:
        raise CheckpointError(
            f"config.json: eos_token_id lists {len(eos_list)} ids, the limit is "
            f"{lim.max_eos_tokens}",
            field="eos_token_id",
        )
    eos_ids = tuple(_token_id(raw, "eos_token_id", e) for e in eos_list)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=positions,
        rms_norm_eps=_typed(raw, "rms_norm_eps", float, 1e-6),
        rope_theta=_typed(raw, "rope_theta", float, 10000.0),
        tie_word_embeddings=tie,
        bos_token_id=bos,
        eos_token_ids=eos_ids,
        architecture=architecture,
    )
    if config.rms_norm_eps >= 1:
        raise CheckpointError(
            f"config.json: rms_norm_eps {config.rms_norm_eps} must be below 1",
            field="rms_norm_eps",
        )
    if lim is not None and config.validation_bytes() > lim.max_validation_bytes:
        raise CheckpointError(
            f"config.json: {config.parameter_count():,} parameters need about "
            f"{human_bytes(config.validation_bytes())} to validate, over the limit of "
            f"{human_bytes(lim.max_validation_bytes)}",
            field="parameters",
        )
    return config


def read_config(directory: Path, *, limits: ConfigLimits | None = None) -> LlamaConfig:
    return parse_config(read_raw_config(directory, limits=limits), limits=limits)


def raw_summary(raw: dict[str, Any]) -> dict[str, Any]:
    """What the registry shows of any architecture's config.json (numbers and names only)."""
    keys = (
        "model_type",
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
        "torch_dtype",
    )
    archs = raw.get("architectures")
    out: dict[str, Any] = {
        "architecture": str(archs[0])[:100] if isinstance(archs, list) and archs else ""
    }
    for key in keys:
        value = raw.get(key)
        if isinstance(value, int | float | str) and not isinstance(value, bool):
            out[key] = value if not isinstance(value, str) else value[:100]
    return out


def read_raw_config(directory: Path, *, limits: ConfigLimits | None = None) -> dict[str, Any]:
    """config.json as a dict, under the size limit (CheckpointError names config.json)."""
    path = directory / "config.json"
    if not path.is_file():
        raise CheckpointError("config.json is missing", field="config.json")
    size = path.stat().st_size
    if limits is not None and size > limits.max_config_bytes:
        raise CheckpointError(
            f"config.json is {human_bytes(size)}, over the limit of "
            f"{human_bytes(limits.max_config_bytes)}",
            field="config.json",
        )
    try:
        raw = json.loads(path.read_text())
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, bad UTF-8, >4300 digits
        raise CheckpointError(f"config.json does not parse: {exc}", field="config.json") from exc
    if not isinstance(raw, dict):
        raise CheckpointError("config.json must hold an object", field="config.json")
    return raw
