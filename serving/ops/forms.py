"""Page forms of the ops loop (contract, OpenSLO import, rollout policy and start); they check
shape only, the services in serving.contracts and serving.rollouts own the rules."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from django import forms

from serving.deployments.forms import VersionChoiceField, plain
from serving.ops.models import RolloutPolicy
from serving.slo.errors import FieldError

SOURCE_MAX_CHARS = 64 * 1024
STARTER = """\
# SLA contract of {name}: uncomment and adapt what you need, then Save.
# The whole document is validated; an invalid one is refused and the one in force stays.
apiVersion: aiops.portal/v1
kind: SlaContract
metadata:
  name: {name}-sla
spec:
  window: 30d                 # error-budget window
  objectives:
    - name: availability
      sli: availability       # good = not a 5xx
      target: 0.999
    # - name: p95
    #   sli: latency_p95
    #   threshold_ms: 500     # one of 5, 10, 25, 50, 100, 250, 500, 1000, ...
    #   target: 0.95
  alerts:                     # multi-window burn rates (Google SRE workbook)
    - {{severity: page, burn_rate: 14.4, long: 1h, short: 5m, action: rollback}}
    - {{severity: ticket, burn_rate: 3, long: 1d, short: 2h, action: notify}}
  # fast:                     # fires within seconds, before the burn windows fill
  #   - {{name: error-spike, sli: error_rate, above: 0.1, for: 15s, action: rollback}}
  # gate: {{mode: block, objectives: [availability], min_requests: 50}}
"""


def numbered(source: str, errors: Sequence[FieldError] = ()) -> list[dict[str, Any]]:
    """The source as numbered lines, each with the errors found on it (a line past the end,
    e.g. an unclosed bracket at EOF, is shown empty)."""
    lines = source.splitlines() or [""]
    last = max([e.line for e in errors if e.line] or [0])
    lines += [""] * max(0, last - len(lines))
    by_line: dict[int, list[FieldError]] = {}
    for error in errors:
        by_line.setdefault(error.line or 0, []).append(error)
    return [
        {"number": n, "text": text, "errors": by_line.get(n, [])}
        for n, text in enumerate(lines, start=1)
    ]


_STEP = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%?\s*(?::\s*(\d+(?:\.\d+)?)\s*s?)?\s*$")


class ContractForm(forms.Form):
    source = forms.CharField(
        label="Contract (YAML)",
        max_length=SOURCE_MAX_CHARS,
        strip=False,
        widget=forms.Textarea(attrs={"rows": 24, "spellcheck": "false", "class": "code"}),
    )


class OpenSloImportForm(forms.Form):
    text = forms.CharField(
        label="OpenSLO v1 documents (YAML)",
        max_length=SOURCE_MAX_CHARS,
        strip=False,
        required=False,
        widget=forms.Textarea(attrs={"rows": 8, "spellcheck": "false", "class": "code"}),
    )
    upload = forms.FileField(label="or a file", required=False)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        upload = data.get("upload")
        if upload is not None:
            if upload.size > SOURCE_MAX_CHARS:
                raise forms.ValidationError("The file is larger than 64 KiB.")
            try:
                data["text"] = upload.read().decode("utf-8")
            except UnicodeDecodeError:
                raise forms.ValidationError("The file is not UTF-8 text.") from None
        if not (data.get("text") or "").strip():
            raise forms.ValidationError("Paste the OpenSLO YAML or choose a file.")
        return data


def steps_text(steps: list[dict[str, Any]]) -> str:
    return "\n".join(f"{plain(s['weight'])}:{plain(s['pause_s'])}" for s in steps)


class PolicyForm(forms.Form):
    steps = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 4, "class": "code"}),
        help_text="One step a line, weight:pause_s (canary % of traffic, then seconds to hold "
        "it), e.g. 10:60 then 50:120. After the last step the canary is promoted.",
    )
    analysis_interval_s = forms.IntegerField(
        label="Analysis every (s)", min_value=1, max_value=3600, initial=10
    )
    failure_limit = forms.IntegerField(
        min_value=0, initial=0, help_text="Failed analyses tolerated (0: the first one fails)."
    )
    min_requests = forms.IntegerField(
        min_value=0, initial=20, help_text="Canary requests an analysis needs to conclude."
    )
    on_failure = forms.ChoiceField(choices=RolloutPolicy.OnFailure.choices, initial="abort")

    @classmethod
    def initial_from(cls, policy: RolloutPolicy | None) -> dict[str, Any]:
        if policy is None:
            return {"steps": "10:60\n50:120"}
        return {
            "steps": steps_text(policy.steps),
            "analysis_interval_s": policy.analysis_interval_s,
            "failure_limit": policy.failure_limit,
            "min_requests": policy.min_requests,
            "on_failure": policy.on_failure,
        }

    def clean_steps(self) -> list[dict[str, float]]:
        steps = []
        for number, line in enumerate(self.cleaned_data["steps"].splitlines(), start=1):
            if not line.strip():
                continue
            match = _STEP.match(line)
            if match is None:
                raise forms.ValidationError(f"line {number}: write weight:pause_s, e.g. 20:60.")
            steps.append({"weight": float(match[1]), "pause_s": float(match[2] or 0)})
        if not steps:
            raise forms.ValidationError("Give at least one step.")
        return steps

    def error_field(self, field: str | None) -> str | None:
        """The form field a service error names ("steps[1].weight" is the steps box)."""
        name = (field or "").split("[")[0]
        return name if name in self.fields else None

    def error_message(self, field: str | None, message: str) -> str:
        match = re.match(r"steps\[(\d+)\]", field or "")
        return f"step {int(match[1]) + 1}: {message}" if match else message


class RolloutStartForm(forms.Form):
    version = VersionChoiceField(queryset=None, empty_label=None, label="Version to roll out")

    def __init__(self, *args: Any, versions: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["version"].queryset = versions  # type: ignore[attr-defined]


class PlaygroundForm(forms.Form):
    """A playground run's shape; serving.ops.playground checks the deployment's bounds."""

    kind = forms.ChoiceField(
        choices=[("completion", "Completion"), ("chat", "Chat (one user message)")],
        initial="completion",
    )
    prompt = forms.CharField(
        strip=False,
        error_messages={"required": "Write a prompt."},
        widget=forms.Textarea(attrs={"rows": 6, "spellcheck": "false"}),
    )
    max_tokens = forms.IntegerField(label="Max tokens", initial=32)
    temperature = forms.FloatField(initial=0.0)
    arm = forms.ChoiceField(
        label="Arm",
        choices=[("stable", "Stable"), ("canary", "Canary"), ("both", "Both, side by side")],
        initial="stable",
        widget=forms.RadioSelect,
    )

    def __init__(self, *args: Any, max_prompt_chars: int, max_tokens: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Hints for the browser; the service enforces the same bounds.
        self.fields["prompt"].widget.attrs["maxlength"] = str(max_prompt_chars)
        self.fields["max_tokens"].widget.attrs.update({"min": "1", "max": str(max_tokens)})
        self.fields["temperature"].widget.attrs.update({"min": "0", "max": "2", "step": "0.1"})
