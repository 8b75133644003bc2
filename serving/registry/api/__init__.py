"""The registry's REST API."""
