"""The portal's side of Ray: the local head it manages and the Serve REST API it applies configs to.

This package is the only place on the Django side that talks to Ray (see docs/architecture.md).
"""
