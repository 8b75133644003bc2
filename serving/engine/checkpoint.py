"""Reading and checking a Hugging Face-layout Llama checkpoint (config.json, *.safetensors,
tokenizer.json): names and shapes against the config, a checksum, a test forward pass."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from serving.engine.config import CheckpointError, LlamaConfig, read_config


def directory_sha256(directory: Path) -> str:
    """Checksum of a checkpoint directory: every regular file, by relative path and content.

    Symlinks are refused (an artifact must not point outside itself)."""
    digest = hashlib.sha256()
    files = sorted(p for p in directory.rglob("*") if not p.is_dir())
    for path in files:
        if path.is_symlink():
            raise CheckpointError(f"{path.relative_to(directory)} is a symlink", field="artifact")
        rel = path.relative_to(directory).as_posix()
        file_digest = hashlib.sha256()
        with path.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                file_digest.update(chunk)
        digest.update(rel.encode() + b"\0" + file_digest.digest())
    return digest.hexdigest()


def expected_shapes(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    h, i, v = config.hidden_size, config.intermediate_size, config.vocab_size
    q = config.num_attention_heads * config.head_dim
    kv = config.num_key_value_heads * config.head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (v, h),
        "model.norm.weight": (h,),
    }
    for n in range(config.num_hidden_layers):
        p = f"model.layers.{n}."
        shapes |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (i, h),
            p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
        }
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (v, h)
    return shapes


def load_tensors(
    directory: Path, config: LlamaConfig, *, dtype: torch.dtype = torch.float32
) -> dict[str, torch.Tensor]:
    """All weights by name, checked against the config; CheckpointError names the problem."""
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise CheckpointError("no *.safetensors file in the checkpoint", field="weights")
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as handle:
                for name in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    tensors[name] = handle.get_tensor(name)
        except (SafetensorError, OSError, RuntimeError, ValueError) as exc:
            raise CheckpointError(
                f"{path.name} does not load (truncated or corrupt): {exc}", field="weights"
            ) from exc
    shapes = expected_shapes(config)
    missing = sorted(set(shapes) - set(tensors))
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise CheckpointError(f"weights missing: {', '.join(missing[:3])}{more}", field="weights")
    for name, shape in shapes.items():
        if tuple(tensors[name].shape) != shape:
            raise CheckpointError(
                f"{name} has shape {tuple(tensors[name].shape)}, config says {shape}",
                field="weights",
            )
    for name, tensor in tensors.items():
        if not tensor.is_floating_point():
            raise CheckpointError(f"{name} is not a floating-point tensor", field="weights")
        if not torch.isfinite(tensor).all():
            raise CheckpointError(f"{name} holds NaN or infinite values", field="weights")
    return {name: t.to(dtype) for name, t in tensors.items() if name in shapes}


def load_tokenizer(directory: Path) -> Any:
    from tokenizers import Tokenizer

    path = directory / "tokenizer.json"
    if not path.is_file():
        raise CheckpointError("tokenizer.json is missing", field="tokenizer")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception for a bad file
        raise CheckpointError(f"tokenizer.json does not load: {exc}", field="tokenizer") from exc


@dataclass
class CheckpointReport:
    """What validation found; `steps` lists each check with its duration in seconds."""

    sha256: str
    size_bytes: int
    format: str
    config: LlamaConfig
    steps: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {**self.config.summary(), "format": self.format}


def validate_checkpoint(
    directory: Path,
    *,
    expected_sha256: str | None = None,
    progress: Any = None,
) -> CheckpointReport:
    """Run every check a version must pass to become deployable. Raises CheckpointError.

    `progress(step_name)` is called before each step (the registry shows it live)."""
    from serving.engine.model import LlamaModel

    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"artifact directory {directory} does not exist", field="artifact")
    steps: list[dict[str, Any]] = []

    def step(name: str) -> float:
        if progress is not None:
            progress(name)
        return time.perf_counter()

    def done(name: str, started: float) -> None:
        steps.append({"step": name, "ok": True, "seconds": round(time.perf_counter() - started, 4)})

    t = step("checksum")
    sha = directory_sha256(directory)
    if expected_sha256 and expected_sha256.lower() != sha:
        raise CheckpointError(
            f"checksum mismatch: expected {expected_sha256.lower()}, artifact has {sha}",
            field="sha256",
        )
    size = sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
    done("checksum", t)

    t = step("config")
    config = read_config(directory)
    done("config", t)

    t = step("weights")
    tensors = load_tensors(directory, config)
    done("weights", t)

    t = step("tokenizer")
    tokenizer = load_tokenizer(directory)
    if tokenizer.get_vocab_size() > config.vocab_size:
        raise CheckpointError(
            f"tokenizer has {tokenizer.get_vocab_size()} tokens, the model only "
            f"{config.vocab_size}",
            field="tokenizer",
        )
    done("tokenizer", t)

    t = step("forward")
    model = LlamaModel(config, tensors)
    ids = tokenizer.encode("validation forward pass").ids or [0]
    logits = model.reference_logits(torch.tensor(ids, dtype=torch.long))
    if logits.shape != (len(ids), config.vocab_size) or not torch.isfinite(logits).all():
        raise CheckpointError("the test forward pass gave non-finite logits", field="weights")
    done("forward", t)
    return CheckpointReport(
        sha256=sha, size_bytes=size, format="hf-safetensors", config=config, steps=steps
    )
