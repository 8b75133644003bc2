# Typed notification channels: Slack incoming webhooks and PagerDuty Events API v2.
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("incidents", "0010_incident_learning")]

    operations: list[migrations.operations.base.Operation] = [
        migrations.AlterField(
            model_name="notificationchannel",
            name="kind",
            field=models.CharField(
                choices=[
                    ("webhook", "Webhook"),
                    ("email", "E-mail"),
                    ("slack", "Slack"),
                    ("pagerduty", "PagerDuty"),
                ],
                max_length=10,
            ),
        ),
        migrations.AlterField(
            model_name="notificationchannel",
            name="secret",
            field=models.CharField(blank=True, max_length=80),
        ),
    ]
