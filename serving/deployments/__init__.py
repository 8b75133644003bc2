"""Desired state (deployments, revisions, keys, shared pools) and the reconcile loop."""
