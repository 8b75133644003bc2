"""GPU telemetry history (models): device samples of every node (platform-wide: the device
totals a tenant may see are filtered by the selectors) and the GPU memory of each tenant's
replicas, downsampled to 1 s rows (kept an hour) and 1 min rows (kept 30 days)."""

from __future__ import annotations

from django.db import models

from tenants.scoping import TenantOwned

DEPLOYMENT = "serving.Deployment"


class GpuResolution(models.IntegerChoices):
    SECOND = 1, "1 second"
    MINUTE = 60, "1 minute"


class GpuDeviceSample(models.Model):
    """One device over [at, at + resolution): means of the agent's samples (5 Hz by default),
    peaks of memory and temperature. Not tenant-owned: a device can serve several tenants."""

    node = models.CharField(max_length=255)
    device_uuid = models.CharField(max_length=96)
    device_index = models.PositiveSmallIntegerField()
    name = models.CharField(max_length=128)
    simulated = models.BooleanField(default=False)
    resolution = models.PositiveSmallIntegerField(choices=GpuResolution.choices)
    at = models.DateTimeField()
    samples = models.PositiveIntegerField(default=1)
    gpu_util = models.FloatField()
    mem_util = models.FloatField()
    mem_used = models.BigIntegerField()
    mem_used_max = models.BigIntegerField()
    mem_total = models.BigIntegerField()
    temperature_c = models.FloatField()
    temperature_max_c = models.FloatField()
    power_w = models.FloatField()
    sm_clock_mhz = models.FloatField()
    xid_errors = models.BigIntegerField(null=True)

    class Meta:
        indexes = [
            models.Index(fields=["resolution", "device_uuid", "-at"], name="gpu_device_history"),
            models.Index(fields=["resolution", "at"], name="gpu_device_retention"),
        ]

    def __str__(self) -> str:
        return f"{self.node}/{self.device_index} {self.at:%H:%M:%S}"


class GpuProcessSample(TenantOwned):
    """The GPU memory one replica of a tenant's deployment held on one device (mean over the
    row's span of what NVML reported for the replica's process)."""

    deployment = models.ForeignKey(DEPLOYMENT, on_delete=models.CASCADE, related_name="+")
    replica = models.CharField(max_length=128)
    node = models.CharField(max_length=255)
    device_uuid = models.CharField(max_length=96)
    resolution = models.PositiveSmallIntegerField(choices=GpuResolution.choices)
    at = models.DateTimeField()
    used_memory = models.BigIntegerField()

    class Meta:
        indexes = [
            models.Index(fields=["tenant", "resolution", "-at"], name="gpu_process_history"),
            models.Index(fields=["resolution", "at"], name="gpu_process_retention"),
        ]

    def __str__(self) -> str:
        return f"{self.replica} on {self.device_uuid} {self.at:%H:%M:%S}"
