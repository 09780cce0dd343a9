"""Tokens in the generated files that templates/monitoring/*.yaml replace when the chart renders.

Each is a plain identifier-like word, so a generated expression with the token inside a string literal still
parses; WEBHOOK_LATENCY_SECONDS stands where a number goes and is always replaced by the chart.
"""

from __future__ import annotations

# The release namespace (where the webhook runs).
NAMESPACE = "__GPU_STACK_NAMESPACE__"
# Where the DCGM exporter and the device plugin run: the release namespace, or another project's
# (monitoring.agents.namespace; the GPU Operator's with webhook.policySource gpu-operator).
AGENTS_NAMESPACE = "__GPU_STACK_AGENTS_NAMESPACE__"
# The `job` label of the webhook's and the DCGM exporter's targets: by default their Service names, what a
# ServiceMonitor gives them (monitoring.jobs overrides them for other scrape setups).
WEBHOOK_JOB = "__GPU_STACK_WEBHOOK_JOB__"
DCGM_JOB = "__GPU_STACK_DCGM_JOB__"
# The device plugin DaemonSet's name (kube-state-metrics' kube_pod_info created_by_name).
DEVICE_PLUGIN_DAEMONSET = "__GPU_STACK_DEVICE_PLUGIN_DAEMONSET__"
# The apiserver-side p99 above which the webhook counts as close to its timeout:
# webhook.timeoutSeconds x monitoring.prometheusRule.webhookLatencyRatio.
WEBHOOK_LATENCY_SECONDS = "__GPU_STACK_WEBHOOK_LATENCY_SECONDS__"
# The runbooks' base URL (monitoring.prometheusRule.runbookBaseURL).
RUNBOOK_BASE = "__GPU_STACK_RUNBOOK_BASE__"

ALL = (NAMESPACE, AGENTS_NAMESPACE, WEBHOOK_JOB, DCGM_JOB, DEVICE_PLUGIN_DAEMONSET, WEBHOOK_LATENCY_SECONDS,
       RUNBOOK_BASE)
