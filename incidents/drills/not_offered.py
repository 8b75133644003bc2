"""Fault kinds the seeds name that this portal does not offer, each with the reason: asking for
one is a validation error naming `fault` and saying why (docs/architecture.md, "Chaos drills")."""

from __future__ import annotations

from portal.exceptions import ValidationFailed

NOT_OFFERED: dict[str, str] = {
    "adapter_switch_jitter": (
        "adapter_switch_jitter is not offered: it switches LoRA adapters under traffic, and no "
        "engine here serves adapters. The built-in engine (serving.engine) runs one full set "
        "of weights per version with no adapter (LoRA) layers, and the vLLM slot is started "
        "without enable_lora and the registry holds no adapters, so there is nothing to "
        "switch. weight_swap_jitter rehearses the nearest thing: hot reloads of a version's "
        "weights under traffic."
    ),
}


def check_offered(fault: object) -> None:
    """Refuses a fault kind the portal does not offer, with its reason."""
    if isinstance(fault, str) and fault in NOT_OFFERED:
        raise ValidationFailed(NOT_OFFERED[fault], field="fault")
