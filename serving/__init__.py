"""Serving: model registry, deployments on Ray Serve, reconcile, data plane and engine."""
