"""Shapes of the incidents API. Serializers validate input shape; services own the rules."""

from __future__ import annotations

from datetime import datetime

from django.core.validators import URLValidator
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from incidents.models import CauseRule, Incident, IncidentEvent, RuleOp, Severity, SlaBreach
from incidents.notifications.models import ChannelKind, NotificationChannel
from incidents.rca.evidence import SIGNAL_NAMES
from incidents.services.incidents import NOTE_MAX_CHARS
from serving.ops.models import Rollback


class IncidentSerializer(serializers.ModelSerializer):
    deployment_name = serializers.CharField(source="deployment.name", read_only=True, default=None)

    class Meta:
        model = Incident
        fields = [
            "id",
            "title",
            "severity",
            "status",
            "deployment",
            "deployment_name",
            "triggered_at",
            "acknowledged_at",
            "mitigated_at",
            "resolved_at",
            "is_drill",
            "drill_run_id",
            "rollback",
            "first_breach",
            "dedup_key",
            "summary",
        ]
        read_only_fields = fields


class EventSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor_label", read_only=True)

    class Meta:
        model = IncidentEvent
        fields = ["id", "at", "kind", "actor", "message", "data"]
        read_only_fields = fields


class BreachSerializer(serializers.ModelSerializer):
    deployment_name = serializers.CharField(source="deployment.name", read_only=True)

    class Meta:
        model = SlaBreach
        fields = [
            "id",
            "deployment",
            "deployment_name",
            "group",
            "contract_version",
            "objective",
            "kind",
            "severity",
            "action",
            "detail",
            "burn_long",
            "burn_short",
            "observed",
            "detected_at",
            "last_seen_at",
            "occurrences",
            "incident",
        ]
        read_only_fields = fields


def _seconds(a: datetime | None, b: datetime | None) -> float | None:
    return None if a is None or b is None else round((b - a).total_seconds(), 3)


class RollbackSummarySerializer(serializers.ModelSerializer):
    from_revision = serializers.IntegerField(source="from_revision.number", read_only=True)
    to_revision = serializers.IntegerField(source="to_revision.number", read_only=True)
    new_revision = serializers.IntegerField(
        source="new_revision.number", read_only=True, default=None
    )
    detect_to_finish_s = serializers.SerializerMethodField()
    start_to_switch_s = serializers.SerializerMethodField()

    class Meta:
        model = Rollback
        fields = [
            "id",
            "key",
            "trigger",
            "reason",
            "status",
            "from_revision",
            "to_revision",
            "new_revision",
            "detected_at",
            "started_at",
            "traffic_switched_at",
            "finished_at",
            "start_to_switch_s",
            "detect_to_finish_s",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.FloatField(allow_null=True))
    def get_detect_to_finish_s(self, obj: Rollback) -> float | None:
        return _seconds(obj.detected_at, obj.finished_at)

    @extend_schema_field(serializers.FloatField(allow_null=True))
    def get_start_to_switch_s(self, obj: Rollback) -> float | None:
        return _seconds(obj.started_at, obj.traffic_switched_at)


class IncidentDetailSerializer(IncidentSerializer):
    events = EventSerializer(many=True, read_only=True)
    breaches = BreachSerializer(many=True, read_only=True)
    rollback_summary = RollbackSummarySerializer(source="rollback", read_only=True, default=None)

    class Meta(IncidentSerializer.Meta):
        fields = [*IncidentSerializer.Meta.fields, "rollback_summary", "breaches", "events"]
        read_only_fields = fields


class NoteSerializer(serializers.Serializer):
    text = serializers.CharField(max_length=NOTE_MAX_CHARS)


class HintSerializer(serializers.Serializer):
    cause = serializers.CharField()
    fix = serializers.CharField()
    score = serializers.FloatField()
    evidence = serializers.ListField(child=serializers.CharField())
    base_score = serializers.FloatField(help_text="the score before your team's votes")
    multiplier = serializers.FloatField(help_text="2 x Beta(1 + right, 1 + wrong) mean")
    right = serializers.IntegerField()
    wrong = serializers.IntegerField()


class SymptomSerializer(serializers.Serializer):
    symptom = serializers.CharField(help_text="out_of_memory, tokenizer_error, load_failure, ...")
    label = serializers.CharField()
    source = serializers.CharField()
    at = serializers.DateTimeField(allow_null=True)
    excerpt = serializers.CharField()


class HintsSerializer(serializers.Serializer):
    signals = serializers.DictField(help_text="signal name -> number or flag")
    hints = HintSerializer(many=True)
    muted = HintSerializer(many=True, help_text="causes your team's votes put aside")
    symptoms = SymptomSerializer(many=True, help_text="what Serve and the replicas said")
    my_votes = serializers.DictField(help_text="cause (case-folded) -> your verdict")


class CauseRuleSerializer(serializers.ModelSerializer):
    class Meta:
        model = CauseRule
        fields = ["id", "symptom", "op", "threshold", "cause", "fix", "weight", "is_active"]
        read_only_fields = fields


class CauseRuleInputSerializer(serializers.Serializer):
    symptom = serializers.ChoiceField(choices=list(SIGNAL_NAMES))
    op = serializers.ChoiceField(choices=RuleOp.choices)
    threshold = serializers.FloatField(required=False, allow_null=True)
    cause = serializers.CharField(max_length=200)
    fix = serializers.CharField(max_length=2000, required=False, allow_blank=True)
    weight = serializers.FloatField(min_value=0, max_value=10, required=False)
    is_active = serializers.BooleanField(required=False)


class ChannelSerializer(serializers.ModelSerializer):
    url = serializers.CharField(
        source="url_shown", read_only=True, help_text="a Slack webhook URL is shown masked"
    )
    routing_key = serializers.CharField(
        source="routing_key_hint", read_only=True, help_text="PagerDuty: its last 4 only"
    )

    class Meta:
        model = NotificationChannel
        fields = [
            "id",
            "kind",
            "name",
            "url",
            "email",
            "routing_key",
            "min_severity",
            "is_active",
            "created_at",
        ]
        read_only_fields = fields


class ChannelCreatedSerializer(ChannelSerializer):
    secret = serializers.CharField(
        read_only=True, help_text="signs the webhook bodies; shown only once"
    )

    class Meta(ChannelSerializer.Meta):
        fields = [*ChannelSerializer.Meta.fields, "secret"]
        read_only_fields = fields


class ChannelUpdateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=80, required=False)
    url = serializers.URLField(
        max_length=500,
        required=False,
        allow_blank=True,
        validators=[URLValidator(schemes=["http", "https"])],
    )
    email = serializers.EmailField(required=False, allow_blank=True)
    routing_key = serializers.CharField(
        max_length=80,
        required=False,
        allow_blank=True,
        write_only=True,
        help_text="PagerDuty: the Events API v2 integration key (never shown back)",
    )
    min_severity = serializers.ChoiceField(choices=Severity.choices, required=False)
    is_active = serializers.BooleanField(required=False)


class ChannelCreateSerializer(ChannelUpdateSerializer):
    kind = serializers.ChoiceField(choices=ChannelKind.choices)
    name = serializers.CharField(max_length=80)
