"""Contract documents shared by the SLO tests; line numbers in the tests refer to FULL."""

FULL = """\
apiVersion: aiops.portal/v1
kind: SlaContract
metadata:
  name: chat-sla
  description: chat completions for the support bot
spec:
  window: 30d
  objectives:
    - name: availability
      sli: availability
      target: 0.999
    - name: errors
      sli: error_rate
      max: 0.01
    - name: p95
      sli: latency_p95
      threshold_ms: 500
      target: 0.95
    - name: throughput
      sli: tokens_per_s
      min: 20
      window: 5m
    - name: prompt-drift
      sli: drift_psi
      feature: prompt_length
      max: 0.2
      reference: {edges: [0, 16, 64, 256, 1024], counts: [10, 40, 40, 10]}
    - name: profile-fresh
      sli: feature_freshness
      feature: user_profile
      max_age: 15m
  fast:
    - name: error-spike
      sli: error_rate
      above: 0.1
      for: 15s
      min_requests: 10
      action: rollback
      severity: page
  alerts:
    - {severity: page,   burn_rate: 14.4, long: 1h, short: 5m,  action: rollback}
    - {severity: page,   burn_rate: 6,    long: 6h, short: 30m, action: rollback}
    - {severity: ticket, burn_rate: 3,    long: 1d, short: 2h,  action: notify}
    - {severity: ticket, burn_rate: 1,    long: 3d, short: 6h,  action: notify}
  gate:
    mode: block
    objectives: [availability, p95]
    min_requests: 50
"""

MINIMAL = """\
apiVersion: aiops.portal/v1
kind: SlaContract
metadata:
  name: mini
spec:
  window: {window}
  objectives:
    - name: availability
      sli: availability
      target: 0.999
"""
