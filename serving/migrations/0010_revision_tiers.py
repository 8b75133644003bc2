from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("serving", "0009_version_golden_answers"),
    ]

    operations = [
        migrations.AddField(
            model_name="deploymentrevision",
            name="tiers",
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
