# Filled in by the change that needs it (see its models).
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("serving", "0013_key_priority")]

    operations: list[migrations.operations.base.Operation] = []
