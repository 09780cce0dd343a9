"""The chart's alert rules: one description, rendered into charts/gpu-stack/files/monitoring/alerts.yaml
(generate.py) and shipped as a PrometheusRule (templates/monitoring/prometheusrule.yaml).

Every alert carries `severity`, `summary`, `description` and a `runbook_url` to docs/runbooks/<alert>.md.
The metrics they read come from the webhook's /metrics, the API server, kube-state-metrics and the DCGM
exporter (metrics.py lists where each name comes from); their promtool unit tests are in
tests/monitoring/alerts.test.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpu_stack_dev.generate.monitoring import idle
from gpu_stack_dev.generate.monitoring.placeholders import (
    AGENTS_NAMESPACE,
    DCGM_JOB,
    DEVICE_PLUGIN_DAEMONSET,
    IDLE_GPU_PERCENT,
    IDLE_GPU_SEVERITY,
    IDLE_GPU_WINDOW,
    NAMESPACE,
    RUNBOOK_BASE,
    WEBHOOK_JOB,
    WEBHOOK_LATENCY_SECONDS,
)
from gpu_stack_dev.generate.monitoring.promql import with_hostname

# The webhook configurations' webhook names (templates/webhook/*webhookconfiguration.yaml): the `name`
# label of the API server's admission webhook metrics.
WEBHOOK_NAMES = 'name=~"validate.gpu-stack.io|mutate.gpu-stack.io"'
WEBHOOK_TARGET = f'job="{WEBHOOK_JOB}", namespace="{NAMESPACE}"'
DCGM_TARGET = f'job="{DCGM_JOB}", namespace="{AGENTS_NAMESPACE}"'
# Extended resources of NVIDIA GPUs as kube-state-metrics names them: nvidia.com/gpu, nvidia.com/gpu.shared,
# nvidia.com/mig-1g.10gb -> nvidia_com_gpu, nvidia_com_gpu_shared, nvidia_com_mig_1g_10gb.
GPU_RESOURCES = 'resource=~"nvidia_com_gpu.*|nvidia_com_mig_.*"'
# XID 79: "GPU has fallen off the bus" (NVIDIA's XID catalogue).
XID_FELL_OFF_BUS = 79
GPU_TEMPERATURE_CELSIUS = 85


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str

    def rule(self) -> dict[str, Any]:
        out: dict[str, Any] = {"alert": self.name, "expr": self.expr}
        if self.for_ != "0m":
            out["for"] = self.for_
        out["labels"] = {"severity": self.severity}
        out["annotations"] = {
            "summary": self.summary,
            "description": self.description,
            "runbook_url": f"{RUNBOOK_BASE}/{self.name}.md",
        }
        return out


@dataclass(frozen=True)
class Group:
    name: str
    alerts: tuple[Alert, ...]


WEBHOOK = Group("gpu-stack-webhook", (
    Alert(
        "GPUStackWebhookDown",
        f"absent(up{{{WEBHOOK_TARGET}}} == 1)",
        "5m", "critical",
        "No gpu-stack admission webhook target is up.",
        "Prometheus has scraped no gpu-stack webhook pod successfully for 5 minutes (all targets down, or "
        "none at all). With failurePolicy Fail the API server rejects every pod the webhook covers; with "
        "Ignore, GPU pods are admitted unchecked.",
    ),
    Alert(
        "GPUStackWebhookReplicaDown",
        f"up{{{WEBHOOK_TARGET}}} == 0",
        "15m", "warning",
        "A gpu-stack webhook pod is not answering scrapes.",
        "The webhook pod {{ $labels.pod }} ({{ $labels.instance }}) has failed its scrapes for 15 minutes; "
        "the other replicas carry the admission traffic.",
    ),
    Alert(
        "GPUStackWebhookCallsFailing",
        "sum by (name, type) (rate(apiserver_admission_webhook_rejection_count"
        f'{{{WEBHOOK_NAMES}, error_type="calling_webhook_error"}}[5m])) > 0',
        "5m", "critical",
        "The API server fails to call the gpu-stack webhook and rejects requests.",
        "The API server rejected requests because calling {{ $labels.name }} ({{ $labels.type }}) failed "
        "(timeout, TLS or connection errors) at {{ $value | humanize }} per second over 5 minutes.",
    ),
    Alert(
        "GPUStackWebhookFailingOpen",
        f"sum by (name, type) (rate(apiserver_admission_webhook_fail_open_count{{{WEBHOOK_NAMES}}}[5m])) > 0",
        "5m", "warning",
        "The API server admits requests without the gpu-stack webhook (failing open).",
        "Calls to {{ $labels.name }} ({{ $labels.type }}) fail and failurePolicy Ignore lets the requests "
        "through unchecked: {{ $value | humanize }} per second over 5 minutes.",
    ),
    Alert(
        "GPUStackWebhookLatencyNearTimeout",
        "histogram_quantile(0.99, sum by (name, type, le) (rate("
        f"apiserver_admission_webhook_admission_duration_seconds_bucket{{{WEBHOOK_NAMES}}}[5m]))) "
        f"> {WEBHOOK_LATENCY_SECONDS}",
        "10m", "warning",
        "The gpu-stack webhook's p99 latency is close to its timeout.",
        "The API server's p99 for {{ $labels.name }} ({{ $labels.type }}) is {{ $value | humanizeDuration }}, "
        "close to the webhook's timeoutSeconds: past it, calls fail (or fail open).",
    ),
    Alert(
        "GPUStackPolicySourceStale",
        f"time() - gpu_stack_policy_source_last_read_timestamp_seconds{{{WEBHOOK_TARGET}}} > 60",
        "2m", "critical",
        "A gpu-stack webhook cannot read the configuration it judges GPU pods by.",
        "The webhook pod {{ $labels.pod }} has not read {{ $labels.source }} for {{ $value | humanizeDuration }}: "
        "past webhook.policySource.keepLastGoodRead it denies GPU pods (GPU010), and, for runtime-classes, "
        "every pod that names a runtime class.",
    ),
))

GPU = Group("gpu-stack-gpus", (
    Alert(
        "GPUStackDCGMExporterDown",
        f"up{{{DCGM_TARGET}}} == 0",
        "10m", "warning",
        "A DCGM exporter is not answering scrapes.",
        "The DCGM exporter {{ $labels.pod }} ({{ $labels.instance }}) has failed its scrapes for 10 minutes: "
        "the GPU metrics and alerts of its node are blind.",
    ),
    Alert(
        "GPUStackGPUXIDError",
        with_hostname("DCGM_FI_DEV_XID_ERRORS > 0 and changes(DCGM_FI_DEV_XID_ERRORS[10m]) > 0"),
        "0m", "warning",
        "A GPU reported a new XID error.",
        "GPU {{ $labels.gpu }} ({{ $labels.UUID }}) on {{ $labels.Hostname }} reported XID {{ $value }}. "
        "The exporter's gauge holds the last XID and never resets, so this alert fires when it changes.",
    ),
    Alert(
        "GPUStackGPUFellOffTheBus",
        with_hostname(f"DCGM_FI_DEV_XID_ERRORS == {XID_FELL_OFF_BUS}"),
        "0m", "critical",
        "A GPU fell off the bus (XID 79).",
        "GPU {{ $labels.gpu }} ({{ $labels.UUID }}) on {{ $labels.Hostname }} reported XID 79: the driver "
        "lost it. Its pods fail until the node is drained and the GPU reset or the node rebooted.",
    ),
    # The kubelet counts a device its plugin reports Unhealthy in capacity, not in allocatable
    # (measured with tests/e2e/deviceplugin on a kubelet v1.36.2). A plugin that stops advertising a
    # resource also leaves capacity above an allocatable of 0, for endpointStopGracePeriod (5 minutes,
    # kubernetes pkg/kubelet/cm/devicemanager/types.go) until capacity drops too: `for` outlasts that.
    Alert(
        "GPUStackGPUAllocatableBelowCapacity",
        f"min by (node, resource) (kube_node_status_capacity{{{GPU_RESOURCES}}}) "
        f"- min by (node, resource) (kube_node_status_allocatable{{{GPU_RESOURCES}}}) > 0",
        "15m", "warning",
        "A node has GPUs its device plugin reports unhealthy.",
        "Node {{ $labels.node }} has {{ $value }} {{ $labels.resource }} device(s) in capacity but not "
        "allocatable: its device plugin reports them Unhealthy (after an XID such as 79, 48 or 63). The "
        "NVIDIA device plugin never reports a device healthy again: once the GPU is reset, restart the "
        "plugin's pod on the node.",
    ),
    Alert(
        "GPUStackGPUTemperatureHigh",
        with_hostname(f"DCGM_FI_DEV_GPU_TEMP > {GPU_TEMPERATURE_CELSIUS}"),
        "10m", "warning",
        f"A GPU has been above {GPU_TEMPERATURE_CELSIUS} °C for 10 minutes.",
        "GPU {{ $labels.gpu }} on {{ $labels.Hostname }} is at {{ $value }} °C; it throttles its clocks near "
        "its slowdown temperature.",
    ),
    Alert(
        "GPUStackGPURowRemapFailure",
        with_hostname("DCGM_FI_DEV_ROW_REMAP_FAILURE > 0"),
        "0m", "critical",
        "A GPU failed to remap a memory row after an uncorrectable error.",
        "GPU {{ $labels.gpu }} ({{ $labels.UUID }}) on {{ $labels.Hostname }} could not remap a row of its "
        "memory: the GPU needs a reset at least, and may need replacing.",
    ),
    Alert(
        "GPUStackNodeAdvertisesNoGPUs",
        "count by (node) (kube_pod_info"
        f'{{namespace="{AGENTS_NAMESPACE}", created_by_kind="DaemonSet", created_by_name="{DEVICE_PLUGIN_DAEMONSET}", '
        'node!=""} * on (namespace, pod) group_left () (kube_pod_status_phase{phase="Running"} == 1)) '
        f"unless on (node) (max by (node) (kube_node_status_capacity{{{GPU_RESOURCES}}}) > 0)",
        "15m", "warning",
        "The device plugin runs on a node that advertises no GPUs.",
        "The gpu-stack device plugin has been running on {{ $labels.node }} for 15 minutes but the node's "
        "capacity has no nvidia.com/gpu (or MIG) devices: driver, toolkit or plugin configuration is broken.",
    ),
))

# Allocated GPUs nobody uses (idle.py: the signal, the exporter's series and labels it relies on). Its own
# group, which the chart leaves out with monitoring.idleGpu.enabled false (templates/monitoring/prometheusrule.yaml).
IDLE_GROUP = "gpu-stack-gpu-idle"
IDLE = Group(IDLE_GROUP, (
    Alert(
        "GPUStackGPUAllocatedIdle",
        idle.alert_expr(),
        IDLE_GPU_WINDOW, IDLE_GPU_SEVERITY,
        f"A pod holds GPUs that have been under {IDLE_GPU_PERCENT}% busy for {IDLE_GPU_WINDOW}.",
        "Pod {{ $labels.namespace }}/{{ $labels.pod }} on {{ $labels.Hostname }} holds GPUs (whole, MIG or "
        f"shared) whose utilisation has stayed under {IDLE_GPU_PERCENT}% for {IDLE_GPU_WINDOW} (the busiest is at "
        "{{ $value | humanize }}%): no other workload can be scheduled on them. A shared GPU counts only while "
        "every pod on it is idle.",
    ),
))

GROUPS = (WEBHOOK, GPU, IDLE)


def alerts() -> list[Alert]:
    return [a for g in GROUPS for a in g.alerts]


def rule_groups() -> dict[str, Any]:
    """The PrometheusRule's spec (and a promtool rule file): {"groups": [...]}."""
    return {"groups": [{"name": g.name, "rules": [a.rule() for a in g.alerts]} for g in GROUPS]}
