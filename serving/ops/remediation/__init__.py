"""Remediation beyond rollback: a contract's chains of actions and conditional waits
(serving.slo.remediation), run step by step, exactly once, each step on the incident timeline."""
