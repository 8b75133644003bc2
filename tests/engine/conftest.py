"""Tiny random Llama checkpoints built on the fly, and the reference implementation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from serving.engine.checkpoint import load_tensors
from serving.engine.config import read_config
from serving.engine.model import LlamaModel
from serving.engine.testing import write_tiny_checkpoint


def load_model(directory: Path, fingerprint: str = "") -> LlamaModel:
    config = read_config(directory)
    return LlamaModel(config, load_tensors(directory, config), fingerprint=fingerprint)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "ckpt", seed=0)


@pytest.fixture(scope="session")
def tiny_model(tiny_dir: Path) -> LlamaModel:
    return load_model(tiny_dir, fingerprint="tiny-v1")


@pytest.fixture(scope="session")
def hf_model(tiny_dir: Path) -> Any:
    import transformers  # test-only dependency: the reference the engine must match

    model = transformers.LlamaForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    return model.eval()


def hf_logits(hf: Any, token_ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([token_ids])).logits[0].float()
