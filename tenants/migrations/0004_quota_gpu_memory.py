"""The tenant's GPU memory cap per replica (issue 18: GPU memory as the seeds mean it)."""

import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("tenants", "0003_sso_source_totp")]

    operations = [
        migrations.AddField(
            model_name="quota",
            name="max_gpu_memory_mb_per_replica",
            field=models.PositiveIntegerField(
                default=24576, validators=[django.core.validators.MinValueValidator(1)]
            ),
        ),
    ]
