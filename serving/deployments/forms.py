"""Page forms of the model registry and of deployments; they check shape only, services own
the rules."""

from __future__ import annotations

from typing import Any

from django import forms
from django.db.models import QuerySet

from serving.deployments.models import DeploymentRevision, KeyPriority
from serving.registry.models import ModelVersion


def plain(value: Any) -> Any:
    """A whole float as an int, so a form shows 20 rather than 20.0."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


FIXED = "fixed"


AUTOSCALING = "autoscaling"


class VersionChoiceField(forms.ModelChoiceField):  # type: ignore[type-arg]  # not generic at runtime
    def label_from_instance(self, obj: Any) -> str:
        """The version and the engines it was validated for (it runs only on those)."""
        engines = ", ".join(obj.engines or ["builtin"])
        return f"{obj.model.name} · {obj.label} ({engines})"


ENGINE_CHOICES = [("builtin", "Built-in (paged KV, per-tenant quotas)"), ("vllm", "vLLM")]
# The vLLM knobs as form fields (serving.engine.choice names them without the prefix).
VLLM_FIELDS = (
    "vllm_dtype",
    "vllm_max_model_len",
    "vllm_max_num_seqs",
    "vllm_cpu_kv_space_gib",
    "vllm_gpu_memory_utilization",
    "vllm_tensor_parallel_size",
    "vllm_enable_prefix_caching",
)


def engine_from(data: dict[str, Any], name: str) -> dict[str, Any]:
    """The engine choice the services take, from the form's engine fields."""
    if name != "vllm":
        return {"name": "builtin"}
    engine: dict[str, Any] = {"name": "vllm"}
    for field in VLLM_FIELDS:
        value = data.get(field)
        if value not in (None, ""):
            engine[field.removeprefix("vllm_")] = value
    return engine


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
    engine = forms.ChoiceField(
        choices=ENGINE_CHOICES,
        initial="builtin",
        required=False,
        help_text="vLLM needs a version validated for it (shown beside each version).",
    )
    vllm_dtype = forms.ChoiceField(
        choices=[(d, d) for d in ("auto", "float32", "float16", "bfloat16")],
        initial="auto",
        required=False,
        label="dtype",
    )
    vllm_max_model_len = forms.IntegerField(
        required=False, label="Max model length", help_text="Tokens; empty: the model's own."
    )
    vllm_max_num_seqs = forms.IntegerField(
        required=False, initial=16, label="Max sequences in a batch"
    )
    vllm_cpu_kv_space_gib = forms.FloatField(
        required=False, initial=1.0, label="KV cache on a CPU (GiB)"
    )
    vllm_gpu_memory_utilization = forms.FloatField(
        required=False,
        initial=0.9,
        label="GPU memory share",
        help_text="Of the replica's GPUs (0.05-0.99).",
    )
    vllm_tensor_parallel_size = forms.IntegerField(
        required=False, initial=1, label="GPUs per replica (TP)"
    )
    vllm_enable_prefix_caching = forms.BooleanField(
        required=False, initial=True, label="Prefix caching"
    )

    FIELDSETS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
        ("", "scaling", ("scaling",)),  # a radio group: its own fieldset and legend
        ("Fixed replicas", "fixed", ("num_replicas",)),
        ("Autoscaling", "autoscaling", ("min_replicas", "max_replicas", "target_ongoing_requests")),
        ("Resources", "resources", ("num_cpus", "num_gpus", "max_ongoing_requests")),
        ("KV cache", "kv", ("kv_blocks", "block_size")),
        ("Engine", "engine", ("engine",)),
        ("vLLM", "vllm", VLLM_FIELDS),
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
            "engine": (revision.engine or {}).get("name", "builtin"),
            **{
                f"vllm_{knob}": plain(value)
                for knob, value in (revision.engine or {}).items()
                if f"vllm_{knob}" in VLLM_FIELDS
            },
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
        out["engine"] = engine_from(data, data.get("engine") or "builtin")
        return out

    def error_field(self, field: str | None) -> str | None:
        """The form field a service error names (None: the form as a whole)."""
        field = {
            "autoscaling": "scaling",
            "autoscaling.min_replicas": "min_replicas",
            "autoscaling.max_replicas": "max_replicas",
            "autoscaling.target_ongoing_requests": "target_ongoing_requests",
        }.get(field or "", field)
        if field and field.startswith("engine."):  # a vLLM knob
            field = f"vllm_{field.removeprefix('engine.')}"
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
    engine = forms.ChoiceField(
        choices=[("", "Same as stable"), *ENGINE_CHOICES],
        required=False,
        label="Canary engine",
        help_text="vLLM runs with its defaults here; tune it on the deployment's settings.",
    )

    def __init__(self, *args: Any, versions: QuerySet[ModelVersion], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["version"].queryset = versions  # type: ignore[attr-defined]

    def canary_engine(self) -> dict[str, Any] | None:
        name = self.cleaned_data.get("engine") or ""
        return {"name": name} if name else None

    def changes(self) -> dict[str, Any]:
        """The change as `deployment_change` takes it (what the cost preview weighs)."""
        return {
            "canary_version": self.cleaned_data["version"].pk,
            "canary_percent": self.cleaned_data["percent"],
            "canary_engine": self.canary_engine(),
        }

    def error_field(self, field: str | None) -> str | None:
        field = {"canary_version": "version", "canary_percent": "percent"}.get(field or "", field)
        if field and field.startswith("canary_engine"):
            field = "engine"
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
    priority = forms.ChoiceField(
        choices=KeyPriority.choices,
        initial=KeyPriority.REALTIME,
        required=False,  # left out: realtime, as every key was before priority classes
        help_text="Batch requests wait behind realtime ones (never longer than a bound).",
    )

    def clean_priority(self) -> str:
        return str(self.cleaned_data.get("priority") or KeyPriority.REALTIME)
