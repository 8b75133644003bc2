"""GPU metrics providers: NVML on real hardware, a labelled simulation elsewhere.

The only package that imports pynvml; nothing here imports Django, so it runs inside a Ray actor.
"""
