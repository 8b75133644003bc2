# A revision's traffic hygiene settings (sticky A/B by client key).
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("serving", "0014_kv_lifetime")]

    operations: list[migrations.operations.base.Operation] = [
        migrations.AddField(
            model_name="deploymentrevision",
            name="traffic",
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
