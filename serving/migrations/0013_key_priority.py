# Filled in by the change that needs it (see its models).
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("serving", "0012_remediation_runs")]

    operations: list[migrations.operations.base.Operation] = []
