"""Tests of the serving app: registry, deployments, the control plane and its Ray cluster."""
