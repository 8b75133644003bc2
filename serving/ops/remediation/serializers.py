"""Remediation runs in the API: a run with its chain as written and each step it took."""

from __future__ import annotations

from rest_framework import serializers

from serving.ops.remediation.models import RemediationRun, RemediationStep


class RemediationStepSerializer(serializers.ModelSerializer[RemediationStep]):
    class Meta:
        model = RemediationStep
        fields = ["index", "kind", "status", "message", "data", "started_at", "finished_at"]


class RemediationRunSerializer(serializers.ModelSerializer[RemediationRun]):
    step_rows = RemediationStepSerializer(many=True, read_only=True)

    class Meta:
        model = RemediationRun
        fields = [
            "id",
            "chain",
            "group",
            "alert",
            "incident_id",
            "contract_version",
            "status",
            "message",
            "steps",
            "next_step",
            "due_at",
            "created_at",
            "finished_at",
            "step_rows",
        ]
