"""django-filter filter sets of the model registry API."""

from __future__ import annotations

import django_filters

from serving.registry.models import Model, ModelVersion


class ModelFilter(django_filters.FilterSet):
    name = django_filters.CharFilter(lookup_expr="icontains")

    class Meta:
        model = Model
        fields = ["task"]


class ModelVersionFilter(django_filters.FilterSet):
    class Meta:
        model = ModelVersion
        fields = ["status", "label", "source"]
