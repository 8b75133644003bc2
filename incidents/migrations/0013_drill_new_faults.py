# Filled in by the change that needs it (see its models).
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("incidents", "0012_drill_detection")]

    operations: list[migrations.operations.base.Operation] = []
