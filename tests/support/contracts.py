"""SLA contract documents shared by the tests and the benchmarks. Plain YAML strings, as a user
pastes them into `contract_set`; no Django needed."""

from __future__ import annotations

_HEAD = """\
apiVersion: aiops.portal/v1
kind: SlaContract
metadata:
  name: {name}
"""

# 99% availability over 30 days, one fast rule: error ratio above 10% over 15 s, at least 10
# requests, rolls back (tests/serving/test_ops_loop.py's FAST_CONTRACT).
FAST_CONTRACT = (
    _HEAD.format(name="chat-sla")
    + """\
spec:
  window: 30d
  objectives:
    - name: availability
      sli: availability
      target: 0.99
  fast:
    - name: error-spike
      sli: error_rate
      above: 0.1
      for: 15s
      min_requests: 10
      action: rollback
"""
)

# bench/rollback.py: a faster rule (5% over 10 s, at least 5 requests) so a 30% canary error
# burst is caught within a tick or two.
CANARY_ERRORS = (
    _HEAD.format(name="bench-sla")
    + """\
spec:
  window: 30d
  objectives:
    - name: availability
      sli: availability
      target: 0.99
  fast:
    - name: canary-errors
      sli: error_rate
      above: 0.05
      for: 10s
      min_requests: 5
      action: rollback
"""
)

# bench/drills.py: FAST_CONTRACT plus the demo's p95 objective and a latency fast rule
# (without one a latency spike on the canary is never an incident: the objectives alone only
# burn the 30-day budget, which a 20 s spike hardly touches).
DRILLS = (
    _HEAD.format(name="bench-drills-sla")
    + """\
spec:
  window: 30d
  objectives:
    - name: availability
      sli: availability
      target: 0.99
    - name: p95-latency
      sli: latency_p95
      threshold_ms: 500
  fast:
    - name: error-spike
      sli: error_rate
      above: 0.1
      for: 15s
      min_requests: 10
      action: rollback
    - name: latency-spike
      sli: latency_p95
      above_ms: 500
      for: 15s
      min_requests: 10
      action: rollback
"""
)

# bench/health_tick.py: a realistic contract (availability 0.999, p95 <= 500 ms, an error-rate
# fast rule, the default burn-rate alerts over 30 days).
REALISTIC = """\
apiVersion: aiops.portal/v1
kind: SlaContract
metadata:
  name: bench-sla
  description: a realistic contract (30d budget, default burn-rate alerts)
spec:
  window: 30d
  objectives:
    - name: availability
      sli: availability
      target: 0.999
    - name: p95
      sli: latency_p95
      threshold_ms: 500
      target: 0.95
  fast:
    - name: error-spike
      sli: error_rate
      above: 0.1
      for: 15s
      min_requests: 10
      action: rollback
      severity: page
"""
