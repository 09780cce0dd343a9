"""Idle allocated GPUs: for each pod holding a GPU (a whole GPU, a MIG instance, a time-sliced or MPS share, a
DRA claim), the utilisation in percent of the device it holds, from the DCGM exporter's series. The alert
GPUStackGPUAllocatedIdle (alerts.py) and the fleet dashboard's idle panels (dashboards.py) read it, with the
thresholds of `monitoring.idleGpu` (placeholders.IDLE_GPU_PERCENT and IDLE_GPU_WINDOW).

What the exporter writes, read in NVIDIA/dcgm-exporter at tag 4.5.3-4.8.2 (the newest whose source could be read;
the chart pins 4.6.0-4.8.3, tests/fixtures/dcgm-exporter/README.md):

- Utilisation. `DCGM_FI_DEV_GPU_UTIL` (0-100, enabled by default: etc/default-counters.csv:23) for a GPU.
  A MIG instance has none: DCGM does not support it on GPU instances (NVIDIA/dcgm-exporter#105 and #216: "there
  are no plans to support DCGM_FI_DEV_GPU_UTIL for MIG instances"; some versions wrote 0) and the exporter
  drops a blank value (internal/pkg/collector/gpu_collector.go:300-305). A MIG instance reports
  `DCGM_FI_PROF_GR_ENGINE_ACTIVE` (0-1, etc/default-counters.csv:89, a profiling field of Volta and newer
  datacenter GPUs). So the signal is GPU_UTIL on a series without `GPU_I_ID` and GR_ENGINE_ACTIVE x 100 on a
  series with it, both in percent; GPU_UTIL of a MIG instance is never read, whatever it says.
- MIG series carry `GPU_I_PROFILE`, `GPU_I_ID` and their parent GPU's `UUID` (internal/pkg/rendermetrics/
  render_metrics.go:47, gpu_collector.go:339-356). In the default device mode `f` a GPU in MIG mode is reported
  as its instances only (pkg/cmd/app.go:42 and 204-210, internal/pkg/devicemonitoring/device_monitoring.go:41-42
  and 97-125); with `-d g` the parent GPU is reported too, and is left out here (`unless on (UUID)` a MIG
  instance's framebuffer series), so a parent's GPU_UTIL never speaks for its instances' pods.
- Pods. With `--kubernetes` (the chart sets DCGM_EXPORTER_KUBERNETES) the series of a device the kubelet's
  pod-resources API lists as allocated get `pod`, `namespace`, `container` (internal/pkg/transformation/
  const.go:21-23, kubernetes.go:414-452); a device nobody holds keeps its series without them. A time-sliced
  or MPS replica (`<UUID>::<n>`) maps to its GPU, one pod per GPU, the last one listed (kubernetes.go:887-898:
  a map keyed by the GPU). With KUBERNETES_VIRTUAL_GPUS every holder gets a copy of the GPU's series
  (kubernetes.go:371-403, pkg/cmd/app.go:300-304), and GPU_UTIL and FB_USED become the device-level series
  without a pod plus one per pod with that pod's processes' figures (kubernetes.go:360-369,
  process_metrics.go:30-32 and 88-100). With `--kubernetes-enable-dra` each pod of a claim gets a copy
  (kubernetes.go:454-511).
- Prometheus. A ServiceMonitor's target carries the exporter's own `namespace`, `pod`, `container`
  (prometheus-operator v0.93.0 pkg/prometheus/promcfg.go:1600-1613). With honorLabels (the chart's
  ServiceMonitor) the exporter's labels win, and a series without them gets the exporter's pod; without
  honorLabels (the GPU Operator's ServiceMonitor unless its ClusterPolicy sets it, gpu-operator v26.7.0
  controllers/object_controls.go:5002) they arrive as `exported_pod`, `exported_namespace`. A holder is a
  series with `exported_pod`, or with a `pod` that is not the pod of the target it was scraped from (the
  `up` series of the same job and instance): a GPU no pod holds never counts, whichever way it was scraped,
  and whatever the exporter's job is called.

Shared GPUs: a pod counts as idle when the device it holds is idle: the device's utilisation is the highest of
all its series (the device-level one where the exporter writes per-process series), and every pod holding the
device gets it. A pod idling on a GPU that another pod keeps busy wastes no GPU-hour; and the per-process
figures exist only in the exporter's virtual-GPU mode, and then only for some of the holders' processes.
"""

from __future__ import annotations

from gpu_stack_dev.generate.monitoring.placeholders import IDLE_GPU_PERCENT, IDLE_GPU_WINDOW
from gpu_stack_dev.generate.monitoring.promql import with_hostname

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
GR_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
# A field every MIG instance reports (framebuffer is per instance), to find the GPUs in MIG mode.
MIG_PRESENCE = "DCGM_FI_DEV_FB_USED"
NOT_MIG, MIG = 'GPU_I_ID=""', 'GPU_I_ID!=""'
DEVICE = ("UUID", "GPU_I_ID")  # a GPU, or a MIG instance of it
HOLDER = ("namespace", "pod", "Hostname")


def _by(labels: tuple[str, ...]) -> str:
    return ", ".join(labels)


def device_utilisation() -> str:
    """Per device (UUID, GPU_I_ID): its utilisation in percent, the highest of its series."""
    gpus = f"{GPU_UTIL}{{{NOT_MIG}}} unless on (UUID) {MIG_PRESENCE}{{{MIG}}}"
    instances = f"{GR_ENGINE_ACTIVE}{{{MIG}}} * 100"
    return f"max by ({_by(DEVICE)}) ({gpus} or {instances})"


def _named(metric: str, selector: str) -> str:
    """The series of `metric` that name a pod, with `pod` and `namespace` wherever Prometheus put them."""
    kept = f'{metric}{{{selector}, pod!="", exported_pod=""}}'
    renamed = f'{metric}{{{selector}, exported_pod!=""}}'
    for target, source in (("pod", "exported_pod"), ("namespace", "exported_namespace")):
        renamed = f'label_replace({renamed}, "{target}", "$1", "{source}", "(.+)")'
    return f"{kept} or {renamed}"


def holders() -> str:
    """One series (value 1) per pod and device it holds, labelled namespace, pod, Hostname, UUID, GPU_I_ID. A
    series whose pod is the one of the target that scraped it (same job, instance and pod as an `up` series)
    got it from Prometheus, not from the exporter: its GPU is held by nobody. A GPU pod that is a scrape target
    itself is another target (another instance), so it still counts."""
    named = with_hostname(f"{_named(GPU_UTIL, NOT_MIG)} or {_named(GR_ENGINE_ACTIVE, MIG)}")
    return f"group by ({_by(HOLDER + DEVICE)}) ({named} unless on (job, instance, pod) up)"


def pod_device_utilisation() -> str:
    """Per pod and device it holds: the device's utilisation in percent."""
    return f"({holders()}) * on ({_by(DEVICE)}) group_left () ({device_utilisation()})"


def alert_expr() -> str:
    """Per pod: the utilisation of its busiest device, when under the threshold (the rule's `for` is the window)."""
    return f"max by ({_by(HOLDER)}) ({pod_device_utilisation()}) < {IDLE_GPU_PERCENT}"


def idle_for_window(step: str) -> str:
    """Per pod and device: present (value: the highest utilisation of the window) when the device stayed under
    the threshold at every `step` of the last window and was already held a window ago: what the alert's `for`
    asks, sampled at `step`."""
    series = pod_device_utilisation()
    return (f"max_over_time(({series})[{IDLE_GPU_WINDOW}:{step}]) < {IDLE_GPU_PERCENT} "
            f"and present_over_time(({series})[{step}:{step}] offset {IDLE_GPU_WINDOW})")


def idle_devices_now() -> str:
    """How many devices (GPUs, MIG instances; a shared GPU once) are held and idle for the window."""
    return f"count(max by ({_by(DEVICE)}) ({idle_for_window('1m')})) or vector(0)"


def idle_devices_by_pod() -> str:
    return f"count by ({_by(HOLDER)}) ({idle_for_window('1m')})"


HOURS_RANGE, HOURS_STEP_MINUTES = "24h", 5


def idle_gpu_hours(by: tuple[str, ...]) -> str:
    """GPU-hours held idle over the last HOURS_RANGE, counted from the moment a device had been idle for the
    window (the time the alert fires), at HOURS_STEP_MINUTES steps."""
    step = f"{HOURS_STEP_MINUTES}m"
    return (f"sum by ({_by(by)}) (count_over_time(({idle_for_window(step)})[{HOURS_RANGE}:{step}])) "
            f"* {HOURS_STEP_MINUTES} / 60")
