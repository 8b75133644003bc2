"""A checkpoint's chat template: rendered in Jinja's sandbox as Hugging Face and vLLM render it,
checked at validation (a template that fails, escapes or leaves the user out is refused naming
`chat_template`), and applied by the version server to chat requests."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from serving.dataplane import openai
from serving.dataplane.version import VersionCore
from serving.engine import chat
from serving.engine.checkpoint import CheckpointError, validate_checkpoint
from serving.engine.testing import write_tiny_checkpoint

# Zephyr's template, as its tokenizer_config.json ships it.
ZEPHYR = (
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n"
    "{{ '<|user|>\\n' + message['content'] + eos_token }}\n"
    "{% elif message['role'] == 'system' %}\n{{ '<|system|>\\n' + message['content'] + eos_token }}\n"
    "{% elif message['role'] == 'assistant' %}\n"
    "{{ '<|assistant|>\\n'  + message['content'] + eos_token }}\n{% endif %}\n"
    "{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n"
    "{% endfor %}"
)


def _with_template(directory: Path, template: object) -> Path:
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": template, "eos_token": {"content": "</s>"}})
    )
    return directory


def test_a_template_renders_the_conversation_the_way_the_model_learnt_it(tmp_path: Path) -> None:
    directory = _with_template(write_tiny_checkpoint(tmp_path / "m"), ZEPHYR)
    template = chat.check(directory)
    assert template is not None
    rendered = template.render([{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "Hi"}])  # fmt: skip
    assert rendered == "<|system|>\nBe brief.</s>\n<|user|>\nHi</s>\n<|assistant|>\n"
    assert chat.load(write_tiny_checkpoint(tmp_path / "plain")) is None  # none: plain format
    named = _with_template(write_tiny_checkpoint(tmp_path / "named"),
                           [{"name": "default", "template": ZEPHYR}])  # fmt: skip
    assert chat.load(named) == template


@pytest.mark.parametrize(
    ("template", "said"),
    [
        ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "failed"),  # the sandbox holds
        ("{% set x = messages.append(1) %}", "failed"),  # immutable
        ("{{ raise_exception('no system role') }}", "refused: no system role"),
        ("{% for i in range(10**9) %}{% endfor %}", "failed"),  # range is capped
        ("{{ 'nothing of the user' }}", "leaves the user's message out"),
        ("{% for %}", "failed"),
        ("x" * (chat.MAX_TEMPLATE_CHARS + 1), "chat_template must be a string"),
        (42, "chat_template must be a string"),
    ],
)
def test_a_hostile_or_broken_template_is_refused_at_validation(
    tmp_path: Path, template: object, said: str
) -> None:
    directory = _with_template(write_tiny_checkpoint(tmp_path / "m"), template)
    with pytest.raises(CheckpointError) as refused:
        validate_checkpoint(directory)
    assert refused.value.field == "chat_template"
    assert said in str(refused.value)


def test_the_version_server_applies_the_template_to_chat_requests(tmp_path: Path) -> None:
    directory = _with_template(write_tiny_checkpoint(tmp_path / "m"), ZEPHYR)
    core = VersionCore(app="acme.chat", group="stable", engine={"num_blocks": 32})
    config = {"version": "v1", "artifact": str(directory), "tenants": {"7": {"salt": "ab" * 32}}}
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0}

    def request(messages: object) -> dict[str, object]:
        return {"request_id": "r", "tenant": "7", "prompt": openai.prompt_of("chat", body),
                "messages": messages, "sampling": openai.sampling_fields(body), "guard": {}}  # fmt: skip

    async def scenario() -> tuple[int, int]:
        await core.reconfigure(config)
        templated = await core.complete(request(openai.messages_of(body)))
        untemplated = await core.complete(request(None))  # a completion: the prompt as given
        return templated["usage"]["prompt_tokens"], untemplated["usage"]["prompt_tokens"]

    try:
        templated, untemplated = asyncio.run(scenario())
    finally:
        core.chaos.close()
        core.engine.stop()
    encode = core.tokenizer.encode
    assert templated == len(encode("<|user|>\nHi</s>\n<|assistant|>\n").ids)
    assert untemplated == len(encode("user: Hi\nassistant:").ids)
