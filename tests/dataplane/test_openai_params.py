"""OpenAI parameters as vLLM's server treats them: `stop` ends the answer before the first stop
sequence (finish_reason "stop", never sent in part while streaming), and what this server does
not honour (n, logprobs, penalties, tools...) is refused with a 400 naming it, never ignored.
A real VersionCore on a tiny checkpoint, no Ray."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from serving.dataplane import openai
from serving.dataplane.guard import Refused
from serving.dataplane.version import VersionCore
from serving.engine.testing import write_tiny_checkpoint

SALT = "ab" * 32


def _payload(stop: list[str] | None = None, max_tokens: int = 24) -> dict[str, Any]:
    body = {"prompt": "Hello, world! How are", "max_tokens": max_tokens, "temperature": 0}
    if stop is not None:
        body["stop"] = stop
    return {"request_id": "r1", "tenant": "7", "prompt": body["prompt"],
            "sampling": openai.sampling_fields(body), "guard": {}}  # fmt: skip


@pytest.mark.parametrize(
    ("name", "value"),
    [("n", 2), ("best_of", 3), ("logprobs", 1), ("logprobs", True), ("top_logprobs", 2),
     ("echo", True), ("suffix", "x"), ("logit_bias", {"1": 5}), ("presence_penalty", 0.5),
     ("frequency_penalty", -1), ("tools", [{"type": "function"}]), ("tool_choice", "auto"),
     ("response_format", {"type": "json_object"})],
)  # fmt: skip
def test_a_parameter_this_server_does_not_honour_is_refused_by_name(name: str, value: Any) -> None:
    with pytest.raises(Refused) as refused:
        openai.sampling_fields({name: value})
    assert refused.value.status == 400 and refused.value.code == "unsupported_parameter"
    assert refused.value.message.startswith(f"{name} is not supported")


def test_the_values_that_mean_off_are_accepted() -> None:
    off = {"n": 1, "best_of": 1, "logprobs": False, "echo": False, "presence_penalty": 0,
           "frequency_penalty": 0.0, "logit_bias": {}, "tools": [], "tool_choice": "none",
           "response_format": {"type": "text"}}  # fmt: skip
    assert openai.sampling_fields(off)["max_tokens"] == 16


@pytest.mark.parametrize("stop", [[""], ["a"] * 5, 7, ["x" * 257], [None]])
def test_a_bad_stop_is_refused(stop: Any) -> None:
    with pytest.raises(Refused, match="stop must be"):
        openai.sampling_fields({"stop": stop})


def test_first_stop() -> None:
    assert openai.first_stop("abc STOP def END", ["END", "STOP"]) == 4
    assert openai.first_stop("abc", ["x"]) is None
    assert openai.first_stop("abcabc", ["abc"], start=1) == 3
    assert openai.sampling_fields({"stop": "END"})["stop"] == ["END"]


def test_generation_ends_before_the_first_stop_sequence(tmp_path: Path) -> None:
    core = VersionCore(app="acme.chat", group="stable", engine={"num_blocks": 32})
    config = {"version": "v1", "artifact": str(write_tiny_checkpoint(tmp_path / "tiny")),
              "tenants": {"7": {"salt": SALT}}}  # fmt: skip

    async def scenario() -> None:
        await core.reconfigure(config)
        free = await core.complete(_payload())
        text = free["text"]
        assert free["finish_reason"] == "length" and len(text) > 12, free
        stop = text[len(text) // 2 : len(text) // 2 + 3]  # a sequence it will generate
        cut = text.find(stop)
        stopped = await core.complete(_payload([stop, "never-said"]))
        assert stopped["text"] == text[:cut]
        assert stopped["finish_reason"] == "stop"
        assert stopped["usage"]["completion_tokens"] < free["usage"]["completion_tokens"]
        # Streaming: the same text, and no piece of the stop sequence is ever sent.
        pieces = [e["text"] async for e in core.generate(_payload([stop])) if e["type"] == "token"]
        assert "".join(pieces) == text[:cut]
        ends = [e async for e in core.generate(_payload([stop])) if e["type"] == "end"]
        assert ends[0]["finish_reason"] == "stop"

    try:
        asyncio.run(scenario())
    finally:
        core.chaos.close()
        core.engine.stop()
