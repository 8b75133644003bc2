# New drill faults (issue 18 item 2): prompt_injection, and replaying the tenant's own prompts.
from django.db import migrations, models

FAULTS = [
    ("gpu_memory_leak", "GPU memory leak"),
    ("latency_spike", "Latency spike"),
    ("error_burst", "Error burst"),
    ("replica_crash", "Replica crash"),
    ("replica_hang", "Replica hang"),
    ("kv_pollution_probe", "KV cache pollution probe"),
    ("token_starvation", "Token starvation"),
    ("weight_swap_jitter", "Weight swap jitter"),
    ("control_plane_delay", "Control plane delay"),
    ("prompt_injection", "Prompt injection"),
]


class Migration(migrations.Migration):
    dependencies = [("incidents", "0012_drill_detection")]

    operations = [
        migrations.AlterField(
            model_name="chaosdrill",
            name="fault",
            field=models.CharField(choices=FAULTS, max_length=32),
        ),
        migrations.AlterField(
            model_name="drillrun",
            name="fault",
            field=models.CharField(choices=FAULTS, max_length=32),
        ),
        migrations.AddField(
            model_name="chaosdrill",
            name="replay_prompts",
            field=models.BooleanField(default=False),
        ),
    ]
