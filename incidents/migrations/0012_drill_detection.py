# Drills prove detection (issue 18 item 1): when the fault took effect, which signal noticed it.
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("incidents", "0011_notification_kinds")]

    operations = [
        migrations.AddField(
            model_name="drillrun",
            name="effect_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="drillrun",
            name="detected_by",
            field=models.CharField(blank=True, max_length=32),
        ),
        migrations.AddField(
            model_name="drillrun",
            name="detection",
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
