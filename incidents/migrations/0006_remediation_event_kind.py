from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("incidents", "0005_stable_task_names"),
    ]

    operations = [
        migrations.AlterField(
            model_name="incidentevent",
            name="kind",
            field=models.CharField(
                choices=[
                    ("breach", "SLA breach"),
                    ("rollback_started", "Rollback started"),
                    ("rollback_finished", "Rollback finished"),
                    ("status_changed", "Status changed"),
                    ("escalated", "Severity raised"),
                    ("acknowledged", "Acknowledged"),
                    ("note", "Note"),
                    ("notification", "Notification"),
                    ("hint", "Hint"),
                    ("analysis", "Analysis"),
                    ("remediation", "Remediation step"),
                ],
                max_length=20,
            ),
        ),
    ]
