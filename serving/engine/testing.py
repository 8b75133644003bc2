"""Tiny random Llama checkpoints in the Hugging Face layout, built on the fly (tests, benches,
the demo). Nothing is downloaded: the tokenizer is a byte-level BPE trained on a fixed text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from serving.engine.checkpoint import expected_shapes
from serving.engine.config import parse_config

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paged attention keeps the KV cache in fixed-size blocks.",
    "A canary gets a small share of the traffic before it is promoted.",
    "Tenants must never see each other's prompts, tokens or cache blocks.",
    "Hello, world! How are you today? Fine, thanks.",
    "0 1 2 3 4 5 6 7 8 9 10 100 1000",
    "def main():\n    return 42\n",
]

TINY_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
}

# The same tiny Llama with head dim 64, which vLLM's CPU attention runs (it refuses 16 and 24).
VLLM_SHAPE: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
}


def build_tokenizer(vocab_size: int, corpus: list[str] | None = None) -> Any:
    """A byte-level BPE trained on `corpus` (default: this module's fixed text)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator((_CORPUS if corpus is None else corpus) * 4, trainer=trainer)
    return tokenizer


def write_tiny_checkpoint(
    directory: Path, *, seed: int = 0, vocab_size: int = 320, **overrides: Any
) -> Path:
    """Write config.json, model.safetensors and tokenizer.json; returns `directory`.

    `seed` picks the weights (two seeds = two different versions of one model)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    raw = {**TINY_CONFIG, "vocab_size": vocab_size, **overrides}
    config = parse_config(raw)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in expected_shapes(config).items():
        if name.endswith("layernorm.weight") or name == "model.norm.weight":
            tensors[name] = 1.0 + 0.1 * torch.randn(shape, generator=generator)
        else:
            tensors[name] = 0.08 * torch.randn(shape, generator=generator)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(raw, indent=2))
    tokenizer = build_tokenizer(vocab_size)
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory
