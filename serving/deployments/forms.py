"""Page forms of the model registry and of deployments; they check shape only, services own
the rules."""

from __future__ import annotations

from typing import Any

from django import forms
from django.db.models import QuerySet

from serving.deployments.models import DeploymentRevision
from serving.registry.models import ModelVersion


def plain(value: Any) -> Any:
    """A whole float as an int, so a form shows 20 rather than 20.0."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


FIXED = "fixed"


AUTOSCALING = "autoscaling"


class VersionChoiceField(forms.ModelChoiceField):  # type: ignore[type-arg]  # not generic at runtime
    def label_from_instance(self, obj: Any) -> str:
        return f"{obj.model.name} · {obj.label}"


class DeploymentSettingsForm(forms.Form):
    """Replicas or autoscaling, and the resources of one replica (the scale form)."""

    scaling = forms.ChoiceField(
        choices=[(FIXED, "Fixed replicas"), (AUTOSCALING, "Autoscaling")],
        initial=FIXED,
        widget=forms.RadioSelect,
    )
    num_replicas = forms.IntegerField(required=False, initial=1, label="Replicas")
    min_replicas = forms.IntegerField(required=False, initial=1, label="Min replicas")
    max_replicas = forms.IntegerField(required=False, label="Max replicas")
    target_ongoing_requests = forms.FloatField(
        required=False, initial=2, label="Target ongoing requests per replica"
    )
    num_cpus = forms.FloatField(initial=1, label="CPUs per replica")
    num_gpus = forms.FloatField(initial=0, label="GPUs per replica")
    max_ongoing_requests = forms.IntegerField(initial=16, label="Max ongoing requests")
    kv_blocks = forms.IntegerField(initial=256, label="KV blocks per replica")
    block_size = forms.IntegerField(initial=16, label="Tokens per KV block")

    FIELDSETS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
        ("", "scaling", ("scaling",)),  # a radio group: its own fieldset and legend
        ("Fixed replicas", "fixed", ("num_replicas",)),
        ("Autoscaling", "autoscaling", ("min_replicas", "max_replicas", "target_ongoing_requests")),
        ("Resources", "resources", ("num_cpus", "num_gpus", "max_ongoing_requests")),
        ("KV cache", "kv", ("kv_blocks", "block_size")),
    )

    @classmethod
    def initial_from(cls, revision: DeploymentRevision) -> dict[str, Any]:
        auto = revision.autoscaling or {}
        return {
            "scaling": AUTOSCALING if auto else FIXED,
            "num_replicas": revision.num_replicas or 1,
            "min_replicas": auto.get("min_replicas", 1),
            "max_replicas": auto.get("max_replicas"),
            "target_ongoing_requests": plain(auto.get("target_ongoing_requests", 2)),
            "num_cpus": plain(revision.num_cpus),
            "num_gpus": plain(revision.num_gpus),
            "max_ongoing_requests": revision.max_ongoing_requests,
            "kv_blocks": revision.kv_blocks,
            "block_size": revision.block_size,
        }

    def fieldsets(self) -> list[tuple[str, str, list[forms.BoundField]]]:
        return [
            (legend, css, [self[name] for name in names]) for legend, css, names in self.FIELDSETS
        ]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("scaling") == AUTOSCALING:
            if data.get("max_replicas") is None:
                self.add_error("max_replicas", "Autoscaling needs a maximum.")
        elif data.get("scaling") == FIXED and data.get("num_replicas") is None:
            self.add_error("num_replicas", "Give a number of replicas.")
        return data

    def settings(self) -> dict[str, Any]:
        """The settings as the deployment services take them."""
        data = self.cleaned_data
        names = ("num_cpus", "num_gpus", "max_ongoing_requests", "kv_blocks", "block_size")
        out: dict[str, Any] = {name: data[name] for name in names}
        if data["scaling"] == AUTOSCALING:
            out["autoscaling"] = {
                key: data[key]
                for key in ("min_replicas", "max_replicas", "target_ongoing_requests")
                if data[key] is not None
            }
        else:
            out["num_replicas"] = data["num_replicas"]
            out["autoscaling"] = None
        return out

    def error_field(self, field: str | None) -> str | None:
        """The form field a service error names (None: the form as a whole)."""
        field = {
            "autoscaling": "scaling",
            "autoscaling.min_replicas": "min_replicas",
            "autoscaling.max_replicas": "max_replicas",
            "autoscaling.target_ongoing_requests": "target_ongoing_requests",
        }.get(field or "", field)
        if field == "num_replicas" and self.cleaned_data.get("scaling") == AUTOSCALING:
            field = "max_replicas"  # a replicas quota counts the autoscaling maximum
        return field if field in self.fields else None


class DeploymentCreateForm(DeploymentSettingsForm):
    name = forms.CharField(
        max_length=40, help_text="Lower-case letters, digits and '-'; part of the route."
    )
    version = VersionChoiceField(queryset=ModelVersion.objects.none(), empty_label=None)
    description = forms.CharField(
        max_length=2000, required=False, widget=forms.Textarea(attrs={"rows": 2})
    )

    FIELDSETS = (
        ("Deployment", "basics", ("name", "version", "description")),
        *DeploymentSettingsForm.FIELDSETS,
    )

    def __init__(self, *args: Any, versions: QuerySet[ModelVersion], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["version"].queryset = versions  # type: ignore[attr-defined]
        self.fields["version"].help_text = "Only ready versions are listed."


class CanaryForm(forms.Form):
    version = VersionChoiceField(
        queryset=ModelVersion.objects.none(), empty_label=None, label="Canary version"
    )
    percent = forms.FloatField(
        initial=10,
        label="Canary traffic (%)",
        widget=forms.NumberInput(attrs={"min": 0, "max": 100, "step": "any"}),
    )

    def __init__(self, *args: Any, versions: QuerySet[ModelVersion], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["version"].queryset = versions  # type: ignore[attr-defined]

    def error_field(self, field: str | None) -> str | None:
        field = {"canary_version": "version", "canary_percent": "percent"}.get(field or "", field)
        return field if field in self.fields else None


class TrafficForm(forms.Form):
    """Canary weight only. Its ids are its own: the canary form on the same page has `percent`."""

    percent = forms.FloatField(
        label="Traffic to the canary (%)",
        widget=forms.NumberInput(
            attrs={
                "min": 0,
                "max": 100,
                "step": "any",
                "oninput": "this.form.elements['traffic-slider'].value = this.value",
            }
        ),
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("auto_id", "id_traffic_%s")
        super().__init__(*args, **kwargs)

    def error_field(self, field: str | None) -> str | None:
        field = "percent" if field == "canary_percent" else field
        return field if field in self.fields else None


class InferenceKeyForm(forms.Form):
    name = forms.CharField(max_length=80, help_text="Who or what will use it, e.g. 'web-app'.")
