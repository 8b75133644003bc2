"""A checkpoint's chat template (`tokenizer_config.json`'s `chat_template`, as Hugging Face and
vLLM use it): chat messages become the prompt the model was trained on.

The template is the tenant's (it comes with the uploaded checkpoint), so it runs in Jinja's
immutable sandbox (no attribute tricks, no mutation, `range` capped) and its size is bounded
here; registry validation renders it once with a sample conversation (`check`), so a template
that fails or runs away is refused with the version, naming `chat_template`. A checkpoint
without one gets the plain format the portal always used ("role: content" lines, then
"assistant:").
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_TEMPLATE_CHARS = 64 * 1024
MAX_RENDER_S = 1.0  # at validation: one sample conversation
SAMPLE = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello!"},
    {"role": "assistant", "content": "Hi. How can I help?"},
    {"role": "user", "content": "What is a canary?"},
]


class ChatTemplateError(ValueError):
    field = "chat_template"


def plain(messages: list[dict[str, str]]) -> str:
    """The portal's format for a model without a template."""
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages) + "\nassistant:"


def _token(value: Any) -> str:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""


@dataclass(frozen=True)
class ChatTemplate:
    source: str
    bos_token: str = ""
    eos_token: str = ""

    def render(self, messages: list[dict[str, str]]) -> str:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise ChatTemplateError(f"the model's chat template refused: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        try:
            return env.from_string(self.source).render(
                messages=messages,
                add_generation_prompt=True,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except ChatTemplateError:
            raise
        except Exception as exc:  # the template is the tenant's: any failure is its own
            raise ChatTemplateError(f"the model's chat template failed: {exc}") from exc


def load(directory: Path) -> ChatTemplate | None:
    """The checkpoint's template, or None when it has none. Raises ChatTemplateError."""
    path = Path(directory) / "tokenizer_config.json"
    if not path.is_file():
        return None
    if path.stat().st_size > 4 * MAX_TEMPLATE_CHARS:
        raise ChatTemplateError("tokenizer_config.json is too large")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ChatTemplateError(f"tokenizer_config.json is unreadable: {exc}") from exc
    source = data.get("chat_template") if isinstance(data, dict) else None
    if isinstance(source, list):  # named templates: the default one
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default")
    if source is None:
        return None
    if not isinstance(source, str) or not 0 < len(source) <= MAX_TEMPLATE_CHARS:
        raise ChatTemplateError(f"chat_template must be a string of 1-{MAX_TEMPLATE_CHARS} chars")
    return ChatTemplate(source, _token(data.get("bos_token")), _token(data.get("eos_token")))


def check(directory: Path) -> ChatTemplate | None:
    """load(), then one render of a sample conversation in MAX_RENDER_S (validation)."""
    template = load(directory)
    if template is None:
        return None
    started = time.perf_counter()
    rendered = template.render(SAMPLE)
    if time.perf_counter() - started > MAX_RENDER_S:
        raise ChatTemplateError(f"the chat template took over {MAX_RENDER_S:g} s to render")
    if "What is a canary?" not in rendered:
        raise ChatTemplateError("the chat template leaves the user's message out")
    return template
