# KV cache lifetime per deployment revision (serving.deployments.kv_specs).
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("serving", "0013_key_priority")]

    operations = [
        migrations.AddField(
            model_name="deploymentrevision",
            name="kv_cache",
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
