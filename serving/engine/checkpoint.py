"""Reading and checking a Hugging Face-layout Llama checkpoint (config.json, *.safetensors,
tokenizer.json): names and shapes against the config, a checksum, a test forward pass."""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from serving.engine.config import (
    CheckpointError,
    ConfigLimits,
    LlamaConfig,
    human_bytes,
    parse_config,
    raw_summary,
    read_config,
    read_raw_config,
)


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


# safetensors dtypes the engine loads, with their element sizes (integer, bool and float8
# tensors are not weights this engine can run).
FLOAT_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}
_HEADER_LENGTH_BYTES = 8


@dataclass(frozen=True)
class TensorEntry:
    """One tensor as a safetensors header declares it, checked against the file's size."""

    path: Path
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


def _corrupt(path: Path, why: str) -> CheckpointError:
    return CheckpointError(
        f"{path.name} does not load (truncated or corrupt): {why}", field="weights"
    )


def _shape(path: Path, name: str, raw: Any) -> tuple[int, ...]:
    if not isinstance(raw, list) or len(raw) > 8:
        raise _corrupt(path, f"tensor {name} has no usable shape")
    for dim in raw:
        if not isinstance(dim, int) or isinstance(dim, bool) or dim < 0:
            raise _corrupt(path, f"tensor {name} has no usable shape")
    return tuple(raw)


def read_safetensors_header(
    path: Path, *, limits: ConfigLimits | None = None
) -> dict[str, TensorEntry]:
    """The tensors a safetensors file declares, read from its header alone (nothing loaded).

    Every tensor's bytes (shape x dtype size) must match its data offsets, and the offsets must
    cover the file's data exactly: a header declaring huge shapes in a tiny file is refused
    here. With `limits`, the header's size and its number of tensors are bounded too."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        prefix = handle.read(_HEADER_LENGTH_BYTES)
        if len(prefix) < _HEADER_LENGTH_BYTES:
            raise _corrupt(path, "the file is shorter than a safetensors header")
        header_bytes = int.from_bytes(prefix, "little")
        if limits is not None and header_bytes > limits.max_header_bytes:
            raise CheckpointError(
                f"{path.name}: its header is {human_bytes(header_bytes)}, over the limit of "
                f"{human_bytes(limits.max_header_bytes)}",
                field="weights",
            )
        if _HEADER_LENGTH_BYTES + header_bytes > size:
            raise _corrupt(path, f"the header declares {header_bytes} bytes, the file is {size}")
        raw_header = handle.read(header_bytes)
    try:
        header = json.loads(raw_header)
    except (ValueError, RecursionError) as exc:
        raise _corrupt(path, f"the header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise _corrupt(path, "the header is not a JSON object")
    header.pop("__metadata__", None)
    if limits is not None and len(header) > limits.max_tensors:
        raise CheckpointError(
            f"{path.name} declares {len(header)} tensors, the limit is {limits.max_tensors}",
            field="weights",
        )
    data_bytes = size - _HEADER_LENGTH_BYTES - header_bytes
    entries: dict[str, TensorEntry] = {}
    spans: list[tuple[int, int, str]] = []
    for name, info in header.items():
        if not isinstance(info, dict):
            raise _corrupt(path, f"tensor {name} has no description")
        dtype = info.get("dtype")
        shape = _shape(path, name, info.get("shape"))
        offsets = info.get("data_offsets")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            raise _corrupt(path, f"tensor {name} has no usable data offsets")
        if dtype not in FLOAT_DTYPES:
            raise CheckpointError(
                f"{name} is not a floating-point tensor (dtype {str(dtype)[:20]!r}; the engine "
                f"loads {', '.join(FLOAT_DTYPES)})",
                field="weights",
            )
        nbytes = math.prod(shape) * FLOAT_DTYPES[dtype]
        if offsets[1] - offsets[0] != nbytes or offsets[1] > data_bytes:
            raise _corrupt(
                path,
                f"tensor {name} declares shape {shape} ({human_bytes(nbytes)} of {dtype}) but "
                f"the file holds {human_bytes(data_bytes)} of data",
            )
        entries[name] = TensorEntry(path=path, dtype=dtype, shape=shape, nbytes=nbytes)
        spans.append((offsets[0], offsets[1], name))
    cursor = 0
    for begin, end, name in sorted(spans):
        if begin != cursor:
            raise _corrupt(path, f"tensor {name}'s data overlaps another or leaves a gap")
        cursor = end
    if cursor != data_bytes:
        raise _corrupt(path, f"{data_bytes - cursor} bytes of data belong to no tensor")
    return entries


def read_weight_headers(
    directory: Path, config: LlamaConfig, *, limits: ConfigLimits | None = None
) -> dict[str, TensorEntry]:
    """Every weight the config needs, found in the headers and checked for shape, before any
    tensor is loaded; CheckpointError names the problem."""
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise CheckpointError("no *.safetensors file in the checkpoint", field="weights")
    declared: dict[str, TensorEntry] = {}
    for path in files:
        for name, entry in read_safetensors_header(path, limits=limits).items():
            if name in declared:
                raise CheckpointError(
                    f"{name} is in both {declared[name].path.name} and {path.name}",
                    field="weights",
                )
            declared[name] = entry
        if limits is not None and len(declared) > limits.max_tensors:
            raise CheckpointError(
                f"the checkpoint declares more than {limits.max_tensors} tensors", field="weights"
            )
    shapes = expected_shapes(config)
    missing = sorted(set(shapes) - set(declared))
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise CheckpointError(f"weights missing: {', '.join(missing[:3])}{more}", field="weights")
    for name, shape in shapes.items():
        if declared[name].shape != shape:
            raise CheckpointError(
                f"{name} has shape {declared[name].shape}, config says {shape}", field="weights"
            )
    return {name: declared[name] for name in shapes}


def load_tensors(
    directory: Path,
    config: LlamaConfig,
    *,
    dtype: torch.dtype = torch.float32,
    limits: ConfigLimits | None = None,
) -> dict[str, torch.Tensor]:
    """All weights by name, checked against the config; CheckpointError names the problem.

    Names, shapes and sizes are checked from the headers first; then the weights the model
    uses are loaded one at a time (tensors it does not use are never read)."""
    entries = read_weight_headers(directory, config, limits=limits)
    by_file: dict[Path, list[str]] = {}
    for name, entry in entries.items():
        by_file.setdefault(entry.path, []).append(name)
    tensors: dict[str, torch.Tensor] = {}
    for path, names in by_file.items():
        try:
            with safe_open(str(path), framework="pt") as handle:
                for name in names:
                    tensor = handle.get_tensor(name)
                    if not torch.isfinite(tensor).all():
                        raise CheckpointError(
                            f"{name} holds NaN or infinite values", field="weights"
                        )
                    tensors[name] = tensor.to(dtype)
        except (SafetensorError, OSError, RuntimeError, ValueError) as exc:
            raise CheckpointError(
                f"{path.name} does not load (truncated or corrupt): {exc}", field="weights"
            ) from exc
    return tensors


def load_tokenizer(directory: Path, *, limits: ConfigLimits | None = None) -> Any:
    from tokenizers import Tokenizer

    path = directory / "tokenizer.json"
    if not path.is_file():
        raise CheckpointError("tokenizer.json is missing", field="tokenizer")
    size = path.stat().st_size
    if limits is not None and size > limits.max_tokenizer_bytes:
        raise CheckpointError(
            f"tokenizer.json is {human_bytes(size)}, over the limit of "
            f"{human_bytes(limits.max_tokenizer_bytes)}",
            field="tokenizer",
        )
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception for a bad file
        raise CheckpointError(f"tokenizer.json does not load: {exc}", field="tokenizer") from exc


@dataclass
class CheckpointReport:
    """What validation found; `steps` lists each check with its duration in seconds. `config`
    is None for a version validated only for vLLM (an architecture this engine does not run):
    `raw` is then what its config.json says."""

    sha256: str
    size_bytes: int
    format: str
    config: LlamaConfig | None
    steps: list[dict[str, Any]] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        if self.config is None:
            return {**self.raw, "format": self.format}
        return {**self.config.summary(), "format": self.format}


def validate_checkpoint(
    directory: Path,
    *,
    expected_sha256: str | None = None,
    progress: Any = None,
    limits: ConfigLimits | None = None,
    engines: tuple[str, ...] = ("builtin",),
) -> CheckpointReport:
    """Run every check a version must pass to become deployable on each of `engines`. Raises
    CheckpointError.

    `progress(step_name)` is called before each step (the registry shows it live). `limits`
    (default: ConfigLimits()) bound the config, the headers and the memory validation may use,
    all checked before the tensors they size are built. The built-in engine's checks parse the
    Llama config, the weights' names and shapes, and run a forward pass; vLLM's
    (serving.engine.vllm.validate) check the architecture against vLLM's registry and load
    the checkpoint once in vLLM."""
    limits = limits or ConfigLimits()
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
    builtin = "builtin" in engines
    raw = read_raw_config(directory, limits=limits)
    config = parse_config(raw, limits=limits) if builtin else None
    done("config", t)

    tensors = None
    if config is not None:
        t = step("weights")
        tensors = load_tensors(directory, config, limits=limits)
        done("weights", t)

    t = step("tokenizer")
    tokenizer = load_tokenizer(directory, limits=limits)
    vocab = config.vocab_size if config is not None else raw.get("vocab_size")
    if isinstance(vocab, int) and tokenizer.get_vocab_size() > vocab:
        raise CheckpointError(
            f"tokenizer has {tokenizer.get_vocab_size()} tokens, the model only {vocab}",
            field="tokenizer",
        )
    done("tokenizer", t)

    t = step("chat template")
    from serving.engine import chat

    try:
        chat.check(directory)
    except chat.ChatTemplateError as exc:
        raise CheckpointError(str(exc), field="chat_template") from exc
    done("chat template", t)

    if config is not None and tensors is not None:
        t = step("forward")
        model = LlamaModel(config, tensors)
        ids = tokenizer.encode("validation forward pass").ids or [0]
        logits = model.reference_logits(torch.tensor(ids, dtype=torch.long))
        if logits.shape != (len(ids), config.vocab_size) or not torch.isfinite(logits).all():
            raise CheckpointError("the test forward pass gave non-finite logits", field="weights")
        done("forward", t)
    if "vllm" in engines:
        from serving.engine.vllm.validate import validate_for_vllm

        validate_for_vllm(
            directory, raw, step=step, done=done, max_bytes=limits.max_validation_bytes
        )
    return CheckpointReport(
        sha256=sha,
        size_bytes=size,
        format="hf-safetensors",
        config=config,
        steps=steps,
        raw=raw_summary(raw),
    )


def load_for_serving(directory: Path, *, gpu: bool, fingerprint: str) -> tuple[Any, Any, Any]:
    """(model, tokenizer, chat template or None) of a validated checkpoint, on CUDA when `gpu`
    and one is there; a test forward pass first (a replica's load and every hot reload)."""
    from serving.engine import chat
    from serving.engine.model import LlamaModel

    config = read_config(directory)
    device = "cuda" if gpu and torch.cuda.is_available() else "cpu"
    model = LlamaModel(
        config, load_tensors(directory, config), device=device, fingerprint=fingerprint
    )
    tokenizer = load_tokenizer(directory)
    logits = model.reference_logits(torch.tensor(tokenizer.encode("ready?").ids or [0]))
    if not torch.isfinite(logits).all():
        raise ValueError("test forward pass of the new weights gave non-finite logits")
    return model, tokenizer, chat.load(directory)
