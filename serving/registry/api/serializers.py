"""Shapes of the model registry API. Serializers validate input shape; services own the rules."""

from __future__ import annotations

from rest_framework import serializers

from serving.registry.models import (
    LABEL_RE,
    NAME_RE,
    SHA256_RE,
    Model,
    ModelTask,
    ModelVersion,
)


class RegistryModelSerializer(serializers.ModelSerializer):
    created_by = serializers.EmailField(source="created_by.email", read_only=True, default=None)
    version_count = serializers.IntegerField(read_only=True, default=0)

    class Meta:
        model = Model
        fields = ["id", "name", "task", "description", "version_count", "created_by", "created_at"]
        read_only_fields = fields


class ModelCreateSerializer(serializers.Serializer):
    name = serializers.RegexField(NAME_RE, max_length=100)
    task = serializers.ChoiceField(choices=ModelTask.choices, default=ModelTask.TEXT_GENERATION)
    description = serializers.CharField(max_length=2000, required=False, allow_blank=True)


class ModelUpdateSerializer(serializers.Serializer):
    description = serializers.CharField(max_length=2000, allow_blank=True)


class ValidationStepSerializer(serializers.Serializer):
    step = serializers.CharField()
    state = serializers.ChoiceField(choices=["running", "ok", "failed"])
    seconds = serializers.FloatField(allow_null=True)


class ModelVersionSerializer(serializers.ModelSerializer):
    model_name = serializers.CharField(source="model.name", read_only=True)
    deployable = serializers.BooleanField(source="is_deployable", read_only=True)
    validation_steps = ValidationStepSerializer(many=True, read_only=True)
    created_by = serializers.EmailField(source="created_by.email", read_only=True, default=None)

    class Meta:
        model = ModelVersion
        fields = [
            "id",
            "model",
            "model_name",
            "label",
            "status",
            "deployable",
            "source",
            "artifact_uri",
            "expected_sha256",
            "sha256",
            "size_bytes",
            "stored_bytes",
            "format",
            "config_summary",
            "validation_steps",
            "engines",
            "golden",
            "failure_reason",
            "validation_attempts",
            "created_by",
            "created_at",
            "validation_started_at",
            "ready_at",
            "failed_at",
        ]
        read_only_fields = fields


_ENGINES_HELP = (
    "Engines to validate the version for (builtin, vllm); default builtin. A deployment may "
    "run a version only on an engine it was validated for."
)
_SHA256_HELP = "Expected checkpoint checksum (directory SHA-256, 64 hex digits); optional."


class VersionRegisterSerializer(serializers.Serializer):
    label = serializers.RegexField(LABEL_RE, max_length=64)
    path = serializers.CharField(
        max_length=900, help_text="Absolute path of a Hugging Face-layout directory."
    )
    sha256 = serializers.RegexField(SHA256_RE, required=False, help_text=_SHA256_HELP)
    engines = serializers.ListField(
        child=serializers.CharField(max_length=20),
        required=False,
        max_length=4,
        help_text=_ENGINES_HELP,
    )

    def to_internal_value(self, data):  # type: ignore[no-untyped-def]
        if isinstance(data, dict) and isinstance(data.get("sha256"), str):
            data = {**data, "sha256": data["sha256"].strip().lower()}
        return super().to_internal_value(data)


class GoldenPromptsSerializer(serializers.Serializer):
    """The shape only; serving.registry.golden.clean_prompts bounds count and length."""

    prompts = serializers.ListField(
        child=serializers.CharField(trim_whitespace=False), max_length=16, allow_empty=True
    )


class VersionUploadQuerySerializer(serializers.Serializer):
    label = serializers.RegexField(LABEL_RE, max_length=64)
    sha256 = serializers.RegexField(SHA256_RE, required=False, help_text=_SHA256_HELP)
    engines = serializers.CharField(
        max_length=80, required=False, help_text=_ENGINES_HELP + " Comma-separated here."
    )

    def to_internal_value(self, data):  # type: ignore[no-untyped-def]
        keys = ("label", "sha256", "engines")
        values = {key: data.get(key) for key in keys if data.get(key) is not None}
        if isinstance(values.get("sha256"), str):
            values["sha256"] = values["sha256"].strip().lower()
        return super().to_internal_value(values)
