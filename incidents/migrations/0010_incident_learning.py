# Hint feedback and the learned per-tenant weights of causes (incidents.rca.models).

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("incidents", "0009_breach_kind_reload"),
        ("tenants", "0001_initial"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="HintFeedback",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("cause_key", models.CharField(max_length=200)),
                ("cause", models.CharField(max_length=200)),
                (
                    "verdict",
                    models.CharField(
                        choices=[("right", "Right"), ("wrong", "Wrong")], max_length=5
                    ),
                ),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("updated_at", models.DateTimeField(default=django.utils.timezone.now)),
                (
                    "incident",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="hint_feedback",
                        to="incidents.incident",
                    ),
                ),
                (
                    "tenant",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="%(app_label)s_%(class)s_set",
                        to="tenants.tenant",
                    ),
                ),
                (
                    "user",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={
                "indexes": [
                    models.Index(fields=["tenant", "cause_key"], name="hint_feedback_by_cause")
                ],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("tenant", "incident", "cause_key", "user"),
                        name="hint_one_vote_per_user",
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="HintWeight",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("cause_key", models.CharField(max_length=200)),
                ("cause", models.CharField(max_length=200)),
                ("right", models.PositiveIntegerField(default=0)),
                ("wrong", models.PositiveIntegerField(default=0)),
                ("multiplier", models.FloatField(default=1.0)),
                ("updated_at", models.DateTimeField(default=django.utils.timezone.now)),
                (
                    "tenant",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="%(app_label)s_%(class)s_set",
                        to="tenants.tenant",
                    ),
                ),
            ],
            options={
                "ordering": ["cause_key"],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("tenant", "cause_key"), name="hint_weight_per_cause"
                    )
                ],
            },
        ),
    ]
