"""The staff's shared-pool form: every field of a pool, the ready version it serves (of any
tenant: the pool is the platform's) and the tenants granted to it. Saved through `pool_save`
(validation, engine check, audit in every granted tenant, reconcile), as the admin is."""

from __future__ import annotations

from typing import Any

from django import forms

from serving.deployments.forms import ENGINE_CHOICES, VersionChoiceField
from serving.deployments.models import SharedPool
from serving.deployments.services.pools import POOL_FIELDS
from serving.engine.choice import name_of
from serving.registry.models import ModelVersion, VersionStatus
from tenants.models import Tenant


class TenantChoices(forms.ModelMultipleChoiceField):  # type: ignore[type-arg]
    def label_from_instance(self, obj: Any) -> str:
        return f"{obj.name} ({obj.slug})"


class PoolVersionChoice(VersionChoiceField):
    def label_from_instance(self, obj: Any) -> str:
        return f"{obj.tenant.slug} / {super().label_from_instance(obj)}"


class PoolForm(forms.ModelForm):  # type: ignore[type-arg]
    model_version = PoolVersionChoice(queryset=ModelVersion.objects.none(), label="Version")
    engine_name = forms.ChoiceField(choices=ENGINE_CHOICES, label="Engine")
    allowed_tenants = TenantChoices(
        queryset=Tenant.objects.none(),
        required=False,
        widget=forms.CheckboxSelectMultiple,
        label="Tenants allowed",
    )

    class Meta:
        model = SharedPool
        # The audited fields but the engine (a choice of its own below), the version second.
        fields = ["name", "model_version", *(f for f in POOL_FIELDS[1:] if f != "engine")]
        labels = {
            "num_cpus": "CPUs per replica",
            "num_gpus": "GPUs per replica",
            "kv_blocks": "KV blocks per replica",
            "min_tenants": "Fair share divides by at least",
            "max_num_seqs": "Sequences at once per replica",
            "is_active": "Active",
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        versions = ModelVersion.objects.filter(status=VersionStatus.READY)
        if self.instance.pk is not None:  # its own version stays choosable
            versions = versions | ModelVersion.objects.filter(pk=self.instance.model_version_id)
        self.fields["model_version"].queryset = (  # type: ignore[attr-defined]
            versions.select_related("tenant", "model").order_by(
                "tenant__slug", "model__name", "label"
            )
        )
        self.fields["allowed_tenants"].queryset = Tenant.objects.filter(  # type: ignore[attr-defined]
            is_active=True
        ).order_by("name")
        if self.instance.pk is not None:
            self.initial["engine_name"] = name_of(self.instance.engine)
            self.initial["allowed_tenants"] = list(self.instance.allowed_tenants.all())

    def pool(self) -> SharedPool:
        """The pool with the form's values (unsaved: validation put them on the instance): the
        engine keeps its options when its name stays, and starts from its defaults when it
        changes."""
        pool = self.instance
        name = self.cleaned_data["engine_name"]
        engine = dict(pool.engine or {})
        pool.engine = engine if name_of(engine) == name else {"name": name}
        return pool

    def error_field(self, field: str | None) -> str | None:
        field = "engine_name" if field and field.startswith("engine") else field
        return field if field in self.fields else None
