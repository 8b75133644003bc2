"""The drill form as the domain has it (issue 19, item 3): the chosen fault's parameters as
fields built from the catalogue (number fields with their range and default, choices as a
select), the steady state as the contract switch and up to three probes (an SLI and its bound),
the abort conditions as two numbers. Nothing is typed as JSON; the API keeps its JSON body.

Every fault's parameter fields are in the form, in a fieldset of their own
(`data-fault`); a small script shows only the chosen fault's (static/js/drill-form.js), and only
the chosen fault's values are read. The service's errors come back next to the field they name
(`parameters.delay_ms` -> that fault's delay field, `steady_state.probes[1].max` -> probe 2)."""

from __future__ import annotations

import re
from typing import Any

from django import forms

from incidents.drills.catalogue import CATALOGUE, PROBE_SLIS
from incidents.drills.models import DrillSlot, FaultKind, RevertStrategy

PROBES = 3  # probe rows on the form


def param_field(fault: str, name: str) -> str:
    return f"p_{fault}_{name}"


def _shown(number: float) -> str:
    return f"{int(number):,}" if float(number).is_integer() else f"{number:g}"


def _param_form_field(rule: Any) -> forms.Field:
    if isinstance(rule[0], str):
        return forms.ChoiceField(choices=[(c, c) for c in rule], initial=rule[0], required=False)
    low, high, default = rule
    field = forms.FloatField(min_value=low, max_value=high, initial=default, required=False)
    field.widget.attrs.update({"min": low, "max": high, "step": "any"})
    field.help_text = f"{_shown(low)} to {_shown(high)}; default {_shown(default)}"
    return field


class DrillForm(forms.Form):
    name = forms.CharField(max_length=100)
    deployment = forms.TypedChoiceField(coerce=int)
    fault = forms.ChoiceField(choices=FaultKind.choices)
    group = forms.ChoiceField(choices=DrillSlot.choices, label="Slot")
    traffic_share = forms.FloatField(
        initial=0.3, min_value=0.01, max_value=1, help_text="share of requests (traffic faults)"
    )
    replica_share = forms.FloatField(
        initial=1.0, min_value=0.01, max_value=1, help_text="share of replicas (replica faults)"
    )
    duration_s = forms.IntegerField(initial=60, min_value=5, max_value=3600, label="Duration (s)")
    steady_contract = forms.BooleanField(
        required=False, initial=True, label="The deployment's contract must hold"
    )
    abort_error_rate_above = forms.FloatField(
        required=False,
        initial=0.5,
        min_value=0,
        max_value=1,
        label="Abort above error rate",
        help_text="a ratio, e.g. 0.5; empty: no such condition",
    )
    abort_burn_rate_above = forms.FloatField(
        required=False,
        min_value=0,
        max_value=10_000,
        label="Abort above burn rate",
        help_text="e.g. 14.4; empty: no such condition",
    )
    schedule = forms.CharField(required=False, help_text="cron, UTC, e.g. 30 3 * * 1")
    revert = forms.ChoiceField(choices=RevertStrategy.choices)
    replay_prompts = forms.BooleanField(
        required=False,
        help_text="kv_pollution_probe, token_starvation: build the drill's prompts from a "
        "sample of your recent prompts (kept for the run only)",
    )
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for fault, spec in CATALOGUE.items():
            for name, rule in spec.parameters.items():
                field = _param_form_field(rule)
                field.label = name.replace("_", " ")
                self.fields[param_field(str(fault), name)] = field
        choices = [("", "–")] + [(s, s) for s in PROBE_SLIS]
        for index in range(PROBES):
            self.fields[f"probe_{index}_sli"] = forms.ChoiceField(
                choices=choices, required=False, label=f"Probe {index + 1} SLI"
            )
            bound = forms.FloatField(required=False, min_value=0, label=f"Probe {index + 1} bound")
            bound.widget.attrs.update({"min": 0, "step": "any"})
            self.fields[f"probe_{index}_bound"] = bound
        if not self.is_bound:
            self.initial.setdefault("probe_0_sli", "error_rate")
            self.initial.setdefault("probe_0_bound", 0.05)

    def fault_fieldsets(self) -> list[dict[str, Any]]:
        """Per fault: its title and description and its parameter fields (bound)."""
        return [
            {
                "fault": str(fault),
                "title": spec.title,
                "description": spec.description,
                "fields": [self[param_field(str(fault), name)] for name in spec.parameters],
            }
            for fault, spec in CATALOGUE.items()
        ]

    def probe_rows(self) -> list[tuple[forms.BoundField, forms.BoundField]]:
        return [(self[f"probe_{i}_sli"], self[f"probe_{i}_bound"]) for i in range(PROBES)]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        fault = data.get("fault")
        parameters: dict[str, Any] = {}
        if fault in CATALOGUE:
            for name in CATALOGUE[fault].parameters:
                value = data.get(param_field(fault, name))
                if value in (None, ""):
                    continue  # the catalogue's default
                if isinstance(value, float) and value.is_integer():
                    value = int(value)
                parameters[name] = value
        probes = []
        for index in range(PROBES):
            sli, bound = data.get(f"probe_{index}_sli"), data.get(f"probe_{index}_bound")
            if not sli:
                continue
            if bound is None:
                self.add_error(f"probe_{index}_bound", "give the probe's bound.")
                continue
            probes.append({"sli": sli, PROBE_SLIS[sli]: bound})
        abort = {
            key: data[f"abort_{key}"]
            for key in ("error_rate_above", "burn_rate_above")
            if data.get(f"abort_{key}") is not None
        }
        return {
            "name": data.get("name"),
            "deployment": data.get("deployment"),
            "fault": fault,
            "group": data.get("group"),
            "parameters": parameters,
            "traffic_share": data.get("traffic_share"),
            "replica_share": data.get("replica_share"),
            "duration_s": data.get("duration_s"),
            "steady_state": {"contract": bool(data.get("steady_contract")), "probes": probes},
            "abort_conditions": abort,
            "schedule": data.get("schedule") or "",
            "revert": data.get("revert"),
            "replay_prompts": bool(data.get("replay_prompts")),
            "description": data.get("description") or "",
        }

    def field_of(self, path: str) -> str | None:
        """The form field a service error's dotted path names (None: the form as a whole)."""
        fault = self.data.get("fault", "")
        if m := re.fullmatch(r"parameters\.(\w+)", path):
            name = param_field(fault, m[1])
            return name if name in self.fields else None
        if m := re.fullmatch(r"steady_state\.probes\[(\d+)\](?:\.(\w+))?", path):
            # The n-th probe given (rows left empty are skipped).
            given = [i for i in range(PROBES) if self.data.get(f"probe_{i}_sli")]
            index = int(m[1])
            if index < len(given):
                return f"probe_{given[index]}_{'sli' if m[2] == 'sli' else 'bound'}"
            return None
        if m := re.fullmatch(r"abort_conditions\.(\w+)", path):
            return f"abort_{m[1]}" if f"abort_{m[1]}" in self.fields else None
        if path == "steady_state.contract":
            return "steady_contract"
        top = path.split(".")[0].split("[")[0]
        return top if top in self.fields else None
