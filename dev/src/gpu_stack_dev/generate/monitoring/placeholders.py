"""Tokens in the generated files that templates/monitoring/*.yaml replace when the chart renders.

Each is a plain identifier-like word, so a generated expression with the token inside a string literal still
parses; WEBHOOK_LATENCY_SECONDS and IDLE_GPU_PERCENT stand where a number goes, IDLE_GPU_WINDOW where a
duration goes: the chart always replaces them, and only the rendered expressions are parsed (by promtool).
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
# The idle-GPU alert and panels (monitoring.idleGpu): the utilisation in percent a GPU stays under (where a
# number goes), the window it stays under it (where a Prometheus duration goes: `for`, a range, an offset)
# and the alert's severity.
IDLE_GPU_PERCENT = "__GPU_STACK_IDLE_GPU_PERCENT__"
IDLE_GPU_WINDOW = "__GPU_STACK_IDLE_GPU_WINDOW__"
IDLE_GPU_SEVERITY = "__GPU_STACK_IDLE_GPU_SEVERITY__"

ALL = (NAMESPACE, AGENTS_NAMESPACE, WEBHOOK_JOB, DCGM_JOB, DEVICE_PLUGIN_DAEMONSET, WEBHOOK_LATENCY_SECONDS,
       RUNBOOK_BASE, IDLE_GPU_PERCENT, IDLE_GPU_WINDOW, IDLE_GPU_SEVERITY)
