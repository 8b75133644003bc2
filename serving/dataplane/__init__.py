"""Code that runs inside Ray Serve: the per-deployment router and the version replicas.

Nothing here imports Django: the portal being down must not stop inference.
"""
