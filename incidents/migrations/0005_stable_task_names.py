"""Stored drill schedules name their task by its stable name (tasks no longer take their
module's path as their name: `incidents.tasks.start_scheduled_drill` is now
`incidents.start_scheduled_drill`)."""

from django.db import migrations

RENAMES = {
    "incidents.tasks.start_scheduled_drill": "incidents.start_scheduled_drill",
    "incidents.tasks.advance_drill_run": "incidents.advance_drill_run",
    "incidents.tasks.resume_drill_runs": "incidents.resume_drill_runs",
    "incidents.tasks.deliver_notification": "incidents.deliver_notification",
    "incidents.tasks.sweep_notifications": "incidents.sweep_notifications",
    "serving.tasks.reconcile": "serving.reconcile",
    "serving.tasks.refresh_deployment_status": "serving.refresh_deployment_status",
    "serving.tasks.health_tick": "serving.health_tick",
    "serving.tasks.execute_rollback": "serving.execute_rollback",
    "serving.tasks.prune_sli_samples": "serving.prune_sli_samples",
    "serving.tasks.validate_version": "serving.validate_version",
    "tenants.tasks.invitation_send_email": "tenants.invitation_send_email",
    "tenants.tasks.signup_send_verification": "tenants.signup_send_verification",
    "tenants.tasks.invitations_expire": "tenants.invitations_expire",
}


def rename(apps, schema_editor, renames=RENAMES):
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    for old, new in renames.items():
        PeriodicTask.objects.filter(task=old).update(task=new)


def rename_back(apps, schema_editor):
    rename(apps, schema_editor, {new: old for old, new in RENAMES.items()})


class Migration(migrations.Migration):
    dependencies = [
        ("incidents", "0004_more_drill_faults"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(rename, rename_back)]
