"""Serializers of the ops loop's API: contracts, rollbacks, the rollout policy and its steps,
rollouts with their analyses, feature reports and SLI points."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from serving.ops.models import Rollback, Rollout, RolloutPolicy, SlaContract, SliSample


class ContractSerializer(serializers.ModelSerializer):
    class Meta:
        model = SlaContract
        fields = ["id", "version", "name", "source", "document", "created_at"]
        read_only_fields = fields


class ContractInSerializer(serializers.Serializer):
    source = serializers.CharField(
        trim_whitespace=False, max_length=64 * 1024, help_text="the contract as YAML"
    )


class RollbackSerializer(serializers.ModelSerializer):
    from_revision = serializers.IntegerField(source="from_revision.number", read_only=True)
    to_revision = serializers.IntegerField(source="to_revision.number", read_only=True)
    new_revision = serializers.IntegerField(
        source="new_revision.number", read_only=True, allow_null=True, default=None
    )
    deployment = serializers.IntegerField(source="deployment_id", read_only=True)

    class Meta:
        model = Rollback
        fields = [
            "id",
            "deployment",
            "key",
            "trigger",
            "reason",
            "status",
            "error",
            "from_revision",
            "to_revision",
            "new_revision",
            "detected_at",
            "started_at",
            "traffic_switched_at",
            "finished_at",
            "created_at",
        ]
        read_only_fields = fields


class RollbackInSerializer(serializers.Serializer):
    revision = serializers.IntegerField(
        min_value=1,
        required=False,
        help_text="revision number to go back to; default: the "
        "last good revision, else the previous stable version",
    )
    reason = serializers.CharField(max_length=500, required=False, default="manual rollback")


class StepSerializer(serializers.Serializer):
    weight = serializers.FloatField(min_value=0.1, max_value=100)
    pause_s = serializers.FloatField(min_value=0, max_value=86400, default=0)


class PolicySerializer(serializers.ModelSerializer):
    steps = StepSerializer(many=True)

    class Meta:
        model = RolloutPolicy
        fields = [
            "steps",
            "analysis_interval_s",
            "failure_limit",
            "consecutive_error_limit",
            "min_requests",
            "on_failure",
            "updated_at",
        ]
        read_only_fields = ["updated_at"]


class RolloutSerializer(serializers.ModelSerializer):
    deployment = serializers.IntegerField(source="deployment_id", read_only=True)
    canary_version = serializers.StringRelatedField()
    base_revision = serializers.IntegerField(source="base_revision.number", read_only=True)
    analyses = serializers.SerializerMethodField()

    class Meta:
        model = Rollout
        fields = [
            "id",
            "deployment",
            "canary_version",
            "base_revision",
            "status",
            "step_index",
            "steps",
            "step_started_at",
            "failures",
            "consecutive_errors",
            "message",
            "started_at",
            "finished_at",
            "analyses",
        ]
        read_only_fields = fields

    def get_analyses(self, obj: Rollout) -> list[dict[str, Any]]:
        return [
            {
                "step": a.step_index,
                "at": a.at,
                "result": a.result,
                "summary": a.summary,
                "measurements": a.measurements,
            }
            for a in list(obj.analyses.all())[:20]
        ]


class RolloutStartSerializer(serializers.Serializer):
    version = serializers.IntegerField(min_value=1, help_text="id of a ready model version")


class FeaturesSerializer(serializers.Serializer):
    drift = serializers.DictField(
        child=serializers.ListField(child=serializers.FloatField(min_value=0)),
        required=False,
        help_text="feature -> counts per bin of the contract's reference histogram",
    )
    freshness = serializers.DictField(
        child=serializers.FloatField(min_value=0),
        required=False,
        help_text="feature -> when it was last updated (epoch seconds)",
    )


class SliPointSerializer(serializers.ModelSerializer):
    class Meta:
        model = SliSample
        fields = [
            "group",
            "version",
            "start",
            "end",
            "requests",
            "errors",
            "rejected",
            "tokens_out",
            "latency",
            "ttft",
            "itl",
            "probe_ok",
            "probe_ms",
            "kv",
        ]
        read_only_fields = fields
