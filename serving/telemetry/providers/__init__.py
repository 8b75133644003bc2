"""GPU metric providers (NVML, or the labelled simulation): Django-free."""
