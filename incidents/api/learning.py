"""Shapes of the incidents-that-learn API: hint feedback, similar incidents, analytics."""

from __future__ import annotations

from rest_framework import serializers


class HintFeedbackInputSerializer(serializers.Serializer):
    cause = serializers.CharField(max_length=200, help_text="the hint's cause, as listed")
    verdict = serializers.ChoiceField(
        choices=["right", "wrong", ""], allow_blank=True, help_text="'' takes your vote back"
    )


class HintWeightSerializer(serializers.Serializer):
    cause = serializers.CharField()
    right = serializers.IntegerField()
    wrong = serializers.IntegerField()
    multiplier = serializers.FloatField()


class SimilarSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    title = serializers.CharField()
    severity = serializers.CharField()
    status = serializers.CharField()
    is_drill = serializers.BooleanField()
    triggered_at = serializers.DateTimeField()
    deployment_name = serializers.CharField(allow_null=True)
    score = serializers.FloatField()
    reasons = serializers.ListField(child=serializers.CharField())


class DurationsSerializer(serializers.Serializer):
    n = serializers.IntegerField()
    p50_s = serializers.FloatField(allow_null=True)
    p95_s = serializers.FloatField(allow_null=True)


class TimingsSerializer(serializers.Serializer):
    incidents = serializers.IntegerField()
    mttd = DurationsSerializer()
    mttr = DurationsSerializer()


class WeekSerializer(serializers.Serializer):
    week = serializers.DateTimeField()
    page = serializers.IntegerField()
    ticket = serializers.IntegerField()
    drill = serializers.IntegerField()


class AvailabilitySerializer(serializers.Serializer):
    deployment = serializers.IntegerField()
    name = serializers.CharField()
    requests = serializers.IntegerField()
    errors = serializers.IntegerField()
    request_availability = serializers.FloatField(allow_null=True)
    incident_free = serializers.FloatField(allow_null=True)
    incidents = serializers.IntegerField()


class AnalyticsSerializer(serializers.Serializer):
    weeks = serializers.IntegerField()
    window_days = serializers.IntegerField()
    per_week = WeekSerializer(many=True)
    timings = serializers.DictField(child=TimingsSerializer(), help_text="real, drill")
    availability = AvailabilitySerializer(many=True)


class AnalyticsQuerySerializer(serializers.Serializer):
    weeks = serializers.IntegerField(min_value=1, max_value=52, default=12)
    days = serializers.IntegerField(min_value=1, max_value=30, default=7)
