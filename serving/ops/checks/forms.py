"""Page forms of a version's golden prompts and checks: they only turn the page's fields into
the services' arguments (serving.registry.services.golden, serving.ops.checks.services), which
bound every value; `put_error` sets a service's error on the field it names."""

from __future__ import annotations

import re
from typing import Any

from django import forms

from portal.exceptions import PortalError
from serving.ops.checks import limits
from serving.registry import golden

# What a check runs when the page leaves a field blank (the service fills the same defaults).
DEFAULTS = limits.clean_params("verify", {})
TEXT_MAX_CHARS = 4000  # a textarea of prompts or gates; the services bound each line further


def put_error(form: forms.Form, exc: PortalError) -> None:
    """A service's error on the form field it names: `prompts[2]` on `prompts` as "Line 3: ...",
    `gates.p95` on `gates` as "p95: ...", a field the form lacks on the form itself."""
    raw = exc.field or ""
    base = re.split(r"[.\[]", raw, maxsplit=1)[0]
    field = base if base in form.fields else None
    message = exc.message
    if field and (index := re.fullmatch(r"\w+\[(\d+)\]", raw)):
        message = f"Line {int(index.group(1)) + 1}: {message}"
    elif field and raw != base:
        message = f"{raw[len(base) + 1 :]}: {message}"
    form.add_error(field, message)


def _lines(value: str) -> list[str]:
    return [line.strip() for line in (value or "").splitlines() if line.strip()]


class GoldenPromptsForm(forms.Form):
    prompts = forms.CharField(
        label="Your golden prompts",
        required=False,
        max_length=TEXT_MAX_CHARS,
        widget=forms.Textarea(attrs={"rows": 4, "cols": 70}),
        help_text=f"One prompt a line, at most {golden.MAX_TENANT_PROMPTS}, "
        f"{golden.MAX_PROMPT_CHARS} characters each; answered greedily beside the defaults. "
        "Empty keeps the defaults only.",
    )

    def clean_prompts(self) -> list[str]:
        return _lines(self.cleaned_data["prompts"])


class _LoadForm(forms.Form):
    requests = forms.IntegerField(
        required=False,
        initial=DEFAULTS["requests"],
        help_text=f"per level, at most {limits.MAX_REQUESTS}",
    )
    max_tokens = forms.IntegerField(
        required=False, initial=DEFAULTS["max_tokens"], help_text=f"at most {limits.MAX_TOKENS}"
    )
    duration_s = forms.IntegerField(
        label="Seconds",
        required=False,
        initial=DEFAULTS["duration_s"],
        help_text=f"per level, at most {limits.MAX_DURATION_S}",
    )

    def params(self) -> dict[str, Any]:
        """The service's request: the fields given (blank ones take the service's defaults)."""
        return {k: v for k, v in self.cleaned_data.items() if v not in (None, "", {}, [])}


class VerifyForm(_LoadForm):
    deployment_id = forms.TypedChoiceField(
        label="Contract of", coerce=int, help_text="the deployment whose contract applies"
    )
    concurrency = forms.IntegerField(
        required=False,
        initial=DEFAULTS["concurrency"],
        help_text=f"1 to {limits.MAX_CONCURRENCY}",
    )
    gates = forms.CharField(
        label="Gate actions",
        required=False,
        max_length=TEXT_MAX_CHARS,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 40, "placeholder": "p95-latency: block"}),
        help_text="objective: block or review, one a line; others take the contract's gate mode",
    )
    field_order = ("deployment_id", "concurrency", "requests", "max_tokens", "duration_s")

    def __init__(self, *args: Any, deployments: list[tuple[int, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["deployment_id"].choices = deployments  # type: ignore[attr-defined]

    def clean_gates(self) -> dict[str, str]:
        gates: dict[str, str] = {}
        for number, line in enumerate(_lines(self.cleaned_data["gates"]), start=1):
            name, colon, action = line.partition(":")
            if not colon or not name.strip():
                raise forms.ValidationError(f"Line {number}: write objective: block or review.")
            gates[name.strip()] = action.strip()
        return gates


class BenchmarkForm(_LoadForm):
    concurrencies = forms.CharField(
        max_length=100,
        initial=", ".join(str(c) for c in limits.DEFAULT_BENCHMARK_LEVELS),
        help_text=f"up to {limits.MAX_LEVELS} levels, each 1 to {limits.MAX_CONCURRENCY}",
    )
    field_order = ("concurrencies", "requests", "max_tokens", "duration_s")

    def clean_concurrencies(self) -> list[int]:
        parts = [p.strip() for p in self.cleaned_data["concurrencies"].split(",") if p.strip()]
        if not parts or not all(p.isdigit() for p in parts):
            raise forms.ValidationError("Give whole numbers separated by commas, e.g. 1, 4, 8.")
        return [int(p) for p in parts]
