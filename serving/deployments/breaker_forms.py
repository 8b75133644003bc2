"""The guard and breaker settings of one deployment as a page form: one field per setting of
the limit tables the services check (serving.deployments.services.spec), blank for the data
plane's default. The form reads numbers only; the bounds are the service's, so the page and the
API refuse the same values with the same words."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from django import forms

from serving.dataplane.breaker import BreakerConfig
from serving.dataplane.guard import GuardConfig
from serving.deployments.forms import plain
from serving.deployments.models import DeploymentRevision
from serving.deployments.services import BREAKER_LIMITS, GUARD_LIMITS

# setting map -> (title, the data plane's config class with its defaults, the service's bounds)
SECTIONS: dict[str, tuple[str, Any, Mapping[str, tuple[float, float]]]] = {
    "guard": ("Input limits (the router's guard)", GuardConfig, GUARD_LIMITS),
    "breaker": ("Circuit breaker (per version, at the router)", BreakerConfig, BREAKER_LIMITS),
}
HELP = {
    "guard.max_body_bytes": "Largest request body accepted (bytes); larger is refused with 413.",
    "guard.max_prompt_tokens": "Longest prompt accepted (tokens); longer is refused with 400.",
    "guard.max_tokens": "Highest max_tokens a request may ask for.",
    "breaker.window_s": "Rolling window (seconds) over which the failure rate is measured.",
    "breaker.min_requests": "Requests in the window before the breaker may open.",
    "breaker.failure_rate": "Failure rate (0-1) in the window that opens the breaker.",
    "breaker.open_s": "Seconds the breaker stays open before letting probes through.",
    "breaker.half_open_probes": "Probe requests that decide between closed and open again.",
    "breaker.canary_alpha": "The canary's breaker also opens when its last calls hold more "
    "failed or slow ones than the stable's rate makes this likely (0: no comparison).",
    "breaker.slow_ms": "A canary call slower than this counts as bad (0: three times the "
    "stable's p95, at least 250 ms).",
    "breaker.mirror_clean": "After a canary call fails, the canary's clients are answered by "
    "the stable and their calls mirrored to the canary until it answers this many for each "
    "failure (0: off).",
}


def defaults(config: Any) -> dict[str, Any]:
    """The data plane's defaults of a config dataclass (GuardConfig, BreakerConfig)."""
    return {f.name: f.default for f in fields(config)}


def field_name(section: str, key: str) -> str:
    return f"{section}_{key}"


class GuardBreakerForm(forms.Form):
    """One optional number per guard and breaker setting; blank: the default applies."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for section, (_, config, limits) in SECTIONS.items():
            default = defaults(config)
            for key, (low, high) in limits.items():
                self.fields[field_name(section, key)] = forms.FloatField(
                    required=False,
                    label=key,
                    help_text=f"{HELP[f'{section}.{key}']} Default {plain(default[key])}; "
                    f"allowed {plain(low)} to {plain(high)}. Blank: the default.",
                    # The browser's hint only: the service checks the bounds.
                    widget=forms.NumberInput(
                        attrs={
                            "step": "any",
                            "min": low,
                            "max": high,
                            "placeholder": plain(default[key]),
                        }
                    ),
                )

    @staticmethod
    def initial_from(revision: DeploymentRevision) -> dict[str, Any]:
        initial: dict[str, Any] = {}
        for section in SECTIONS:
            for key, value in (getattr(revision, section) or {}).items():
                initial[field_name(section, key)] = plain(value)
        return initial

    def fieldsets(self) -> list[tuple[str, list[forms.BoundField]]]:
        return [
            (title, [self[field_name(section, key)] for key in limits])
            for section, (title, _, limits) in SECTIONS.items()
        ]

    def settings(self) -> dict[str, dict[str, Any]]:
        """{"guard": {...}, "breaker": {...}}: the settings given, each map whole (a blank
        field leaves its setting to the default)."""
        out: dict[str, dict[str, Any]] = {}
        for section, (_, _, limits) in SECTIONS.items():
            out[section] = {}
            for key in limits:
                value = self.cleaned_data.get(field_name(section, key))
                if value is not None:
                    out[section][key] = value
        return out

    def error_field(self, field: str | None) -> str | None:
        """The form field a service error names (`breaker.min_requests`), None for the form."""
        section, _, key = (field or "").partition(".")
        name = field_name(section, key)
        return name if key and name in self.fields else None
