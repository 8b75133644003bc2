"""Golden prompts: a few prompts and the greedy answers a version gave at validation, recorded
from its own checkpoint, so a probe can later replay them through the live deployment and see
whether it still answers the same (the `output_consistency` SLI, serving.ops.consistency).

Bounded: at most MAX_TENANT_PROMPTS prompts of the tenant's own beside the defaults, each at
most MAX_PROMPT_CHARS characters, answers of GOLDEN_MAX_TOKENS tokens, greedy (temperature 0).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from portal.exceptions import ValidationFailed

DEFAULT_PROMPTS: tuple[str, ...] = (
    "The quick brown fox",
    "A canary gets a small share of",
    "Paged attention keeps the KV cache",
    "Hello, world! How are",
)
MAX_TENANT_PROMPTS = 4
MAX_PROMPT_CHARS = 200
GOLDEN_MAX_TOKENS = 8


def clean_prompts(raw: Any, field: str = "prompts") -> list[str]:
    """A tenant's own golden prompts, checked (ValidationFailed names the field)."""
    if not isinstance(raw, list):
        raise ValidationFailed("Give a list of prompts.", field=field)
    if len(raw) > MAX_TENANT_PROMPTS:
        raise ValidationFailed(
            f"At most {MAX_TENANT_PROMPTS} prompts of your own (got {len(raw)}).", field=field
        )
    prompts: list[str] = []
    for index, prompt in enumerate(raw):
        at = f"{field}[{index}]"
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValidationFailed("Give a non-empty string.", field=at)
        if len(prompt) > MAX_PROMPT_CHARS:
            raise ValidationFailed(f"At most {MAX_PROMPT_CHARS} characters.", field=at)
        if "\x00" in prompt:
            raise ValidationFailed("NUL characters are not allowed.", field=at)
        prompts.append(prompt)
    if len(set(prompts)) != len(prompts):
        raise ValidationFailed("The prompts must differ from each other.", field=field)
    return prompts


def record(
    directory: Path, tenant_prompts: list[str] | None = None, *, limits: Any = None
) -> dict[str, Any]:
    """Load the checkpoint in `directory` with the built-in engine and answer each golden
    prompt greedily, each alone (the reference); returns the `ModelVersion.golden` document.
    The checkpoint is read under the same bounds as validation (`limits`, default the
    configured `config_limits()`): one accepted under raised limits records its answers, and
    none is ever loaded unbounded."""
    import torch

    from serving.engine.checkpoint import load_tensors, load_tokenizer
    from serving.engine.config import read_config
    from serving.engine.engine import Engine, SamplingParams
    from serving.engine.model import LlamaModel

    if limits is None:
        from serving.registry.services.validation import config_limits

        limits = config_limits()
    config = read_config(directory, limits=limits)
    tokenizer = load_tokenizer(directory, limits=limits)
    model = LlamaModel(config, load_tensors(directory, config, limits=limits))
    params = SamplingParams(max_tokens=GOLDEN_MAX_TOKENS, temperature=0.0)
    sources = [(p, "default") for p in DEFAULT_PROMPTS]
    sources += [(p, "tenant") for p in tenant_prompts or [] if p not in DEFAULT_PROMPTS]
    prompts: list[dict[str, Any]] = []
    engine = Engine(model, num_blocks=64)
    with torch.inference_mode():
        for prompt, source in sources:
            ids = tokenizer.encode(prompt).ids or [0]
            seq = engine.generate([ids], params)[0]
            prompts.append(
                {
                    "prompt": prompt,
                    "source": source,
                    "answer": str(tokenizer.decode(seq.output_ids)),
                    "tokens": list(seq.output_ids),
                }
            )
    return {
        "max_tokens": GOLDEN_MAX_TOKENS,
        "recorded_at": time.time(),
        "tenant_prompts": [p for p, source in sources if source == "tenant"],
        "prompts": prompts,
    }
