"""SLA contracts: a YAML document of objectives, error budgets, alerts and a promotion gate.

Pure Python (no Django), so the health loop, the API and the CLI share one implementation.
"""
