# Filled in by the change that needs it (see its models).
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("tenants", "0003_sso_source_totp")]

    operations: list[migrations.operations.base.Operation] = []
