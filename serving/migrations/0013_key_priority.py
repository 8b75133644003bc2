# Inference keys carry a priority class; a revision lists the hashes of its batch keys.
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("serving", "0012_remediation_runs")]

    operations: list[migrations.operations.base.Operation] = [
        migrations.AddField(
            model_name="inferencekey",
            name="priority",
            field=models.CharField(
                choices=[("realtime", "realtime"), ("batch", "batch")],
                default="realtime",
                max_length=10,
            ),
        ),
        migrations.AddField(
            model_name="deploymentrevision",
            name="batch_key_hashes",
            field=models.JSONField(blank=True, default=list),
        ),
    ]
