"""The trained demo model (serving.engine.tiny_trained) answers in readable English through the
engine, on the load path the data plane uses; a random checkpoint does not."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from serving.engine.checkpoint import load_tokenizer, validate_checkpoint
from serving.engine.config import read_config
from serving.engine.engine import Engine, SamplingParams
from serving.engine.testing import write_tiny_checkpoint
from serving.engine.tiny_trained import (
    FRIENDLY,
    PLAIN,
    TrainResult,
    corpus_words,
    train,
    training_forward,
)
from tests.engine.conftest import load_model

PROMPTS = ["A canary", "Rollbacks", "An SLA contract", "Hello"]  # "Hello": the demo's prompt
WORDS = corpus_words()
PRINTABLE = set(string.ascii_letters + " .,:;!?'")


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[int, TrainResult]:
    root = tmp_path_factory.mktemp("trained")
    return {v: train(root / f"v{v}", variant=v, seed=0, seconds=120.0) for v in (1, 2)}


def _answer(directory: Path, prompt: str, max_tokens: int = 12) -> tuple[str, str | None]:
    """Greedy answer and finish reason, loaded and run as the data plane does."""
    model = load_model(directory, fingerprint=str(directory))
    tokenizer = load_tokenizer(directory)
    engine = Engine(model, num_blocks=64)
    seq = engine.generate([tokenizer.encode(prompt).ids], SamplingParams(max_tokens=max_tokens))[0]
    return tokenizer.decode(seq.output_ids), seq.finish_reason


def _readable(text: str, finish_reason: str | None) -> bool:
    """At least three words, every one a word of the text (the last may be cut by max_tokens),
    and nothing but letters, spaces and punctuation."""
    words = [w.strip(".,:;!?'\"").lower() for w in text.split()]
    if len(words) < 3 or any(c not in PRINTABLE for c in text):
        return False
    *whole, last = words
    cut = finish_reason == "length" and any(w.startswith(last) for w in WORDS)
    return all(w in WORDS for w in whole if w) and (last in WORDS or cut)


def _sentence(prompt: str, sentences: list[str]) -> str:
    (sentence,) = [s for s in sentences if s.startswith(prompt)]
    return sentence


def test_the_checkpoint_validates_and_the_engine_computes_what_was_trained(
    trained: dict[int, TrainResult],
) -> None:
    for result in trained.values():
        assert result.converged, f"{result.steps} steps, {result.seconds:.1f} s"
        assert result.size_bytes < 4 << 20
        report = validate_checkpoint(result.directory)
        config = read_config(result.directory)
        tokenizer = load_tokenizer(result.directory)
        ids = tokenizer.encode(PLAIN[3]).ids
        served = load_model(result.directory).reference_logits(torch.tensor(ids))
        tensors = load_file(str(result.directory / "model.safetensors"))
        with torch.no_grad():
            trained_logits = training_forward(config, tensors, torch.tensor([ids]))
        assert report.config == config
        assert torch.allclose(served, trained_logits[0], atol=1e-4)


def test_v1_continues_each_prompt_with_its_sentence(trained: dict[int, TrainResult]) -> None:
    for prompt in PROMPTS:
        text, reason = _answer(trained[1].directory, prompt)
        assert _readable(text, reason), f"{prompt!r} -> {text!r}"
        assert _sentence(prompt, PLAIN).startswith(prompt + text), f"{prompt!r} -> {text!r}"


def test_v2_answers_the_same_prompts_in_its_own_words(trained: dict[int, TrainResult]) -> None:
    for prompt in PROMPTS:
        v1, _ = _answer(trained[1].directory, prompt)
        text, reason = _answer(trained[2].directory, prompt)
        assert _readable(text, reason), f"{prompt!r} -> {text!r}"
        assert _sentence(prompt, FRIENDLY).startswith(prompt + text), f"{prompt!r} -> {text!r}"
        assert text != v1


def test_an_unknown_prompt_still_gets_words_of_the_text(trained: dict[int, TrainResult]) -> None:
    text, reason = _answer(trained[1].directory, "Explain SLA", max_tokens=16)
    assert _readable(text, reason), text


def test_a_random_checkpoint_is_not_readable(tmp_path: Path) -> None:
    directory = write_tiny_checkpoint(tmp_path / "random", seed=0)
    for prompt in PROMPTS:
        text, reason = _answer(directory, prompt)
        assert not _readable(text, reason), f"{prompt!r} -> {text!r}"


def test_a_seed_gives_the_same_weights_every_run(tmp_path: Path) -> None:
    a = train(tmp_path / "a", seed=7, max_steps=3)
    b = train(tmp_path / "b", seed=7, max_steps=3)
    c = train(tmp_path / "c", seed=8, max_steps=3)
    weights = [(r.directory / "model.safetensors").read_bytes() for r in (a, b, c)]
    assert weights[0] == weights[1] != weights[2]
    assert (a.directory / "tokenizer.json").read_bytes() == (
        c.directory / "tokenizer.json"
    ).read_bytes()
