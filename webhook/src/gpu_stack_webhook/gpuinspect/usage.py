"""GPU use per holder pod (`inspect --usage` / `--idle`): the join of what inspect computes per node (its
holders, their sharing, their DRA devices) with dcgm-exporter's series. Pure: no I/O; prometheus.py asks.

The series, as dcgm-exporter writes them (NVIDIA/dcgm-exporter, tag 4.5.3-4.8.2, the newest whose source
could be read; the chart pins 4.6.0-4.8.3):
- Names: DCGM_FI_DEV_GPU_UTIL (percent), DCGM_FI_DEV_FB_USED (MiB), DCGM_FI_PROF_GR_ENGINE_ACTIVE (ratio),
  all three in the chart's `dcgmExporter.metrics` and files/monitoring/dcgm-counters.csv.
- Labels (internal/pkg/rendermetrics/render_metrics.go:47): gpu, UUID, pci_bus_id, device, modelName,
  GPU_I_PROFILE and GPU_I_ID for a MIG instance, Hostname (NODE_NAME, internal/pkg/hostname/hostname.go:53);
  newer exporters spell it `hostname`, both are read.
- Pod mapping (internal/pkg/transformation/kubernetes.go, const.go:20-40): with DCGM_EXPORTER_KUBERNETES the
  kubelet's pod-resources API names the pod of each device, and the series gets `pod`, `namespace`,
  `container` (`pod_name`, `pod_namespace`, `container_name` with --use-old-namespace), kubernetes.go:424-
  431. A shared GPU (device ids UUID::N) maps to one of its pods only (kubernetes.go:887-898 toDeviceToPod,
  deviceToPodMap[UUID] = the last pod read): its figures are the device's, "device-level".
- --kubernetes-virtual-gpus (KUBERNETES_VIRTUAL_GPUS): every pod of a shared GPU gets its own series with a
  `vgpu` label (the N of UUID::N, kubernetes.go:550-558); from 4.5.3-4.8.2 on, DCGM_FI_DEV_GPU_UTIL and
  DCGM_FI_DEV_FB_USED are per process (process_metrics.go:30 isPerProcessMetric; kubernetes.go:201-251
  createPerProcessMetrics: the pod's processes summed, 0 for a pod with none, `pod_uid` set), beside the
  unlabelled device series. Those are read as the pod's own figures.
- DRA (--kubernetes-enable-dra): the device's series per pod, with dra_claim_name, dra_claim_namespace,
  dra_driver_name, dra_pool_name, dra_device_name (kubernetes.go:466-491), and dra_mig_profile for MIG.

DCGM does not give DCGM_FI_DEV_GPU_UTIL for a MIG instance: a holder without it is read from
DCGM_FI_PROF_GR_ENGINE_ACTIVE x 100 (not for shared GPUs, whose profiling series are never per process).
A device-level figure bounds each sharing pod's use from above, so a device under the threshold is an idle
pod; a busy device says nothing about which of its pods is busy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_stack_webhook.gpuinspect.prometheus import Series
from gpu_stack_webhook.gpuinspect.records import NodeRecord, Report

GPU_UTIL, ENGINE_ACTIVE, FB_USED = "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_FB_USED"
METRICS = (GPU_UTIL, ENGINE_ACTIVE, FB_USED)
MIG_PREFIX = "nvidia.com/mig-"
SKEW_TOLERANCE = 10.0  # seconds between this machine's clock and Prometheus's before a note says so
DEFAULT_BELOW, DEFAULT_WINDOW = 5.0, "30m"


@dataclass(frozen=True)
class Figures:
    mean: float
    max: float
    first: float  # the earliest sample's time
    last: float


@dataclass(frozen=True)
class HolderUsage:
    namespace: str
    pod: str
    node: str
    resource: str  # extended resource, or driver/device for a DRA claim
    amount: int
    sharing: str  # whole | mig | time-slicing | mps | dra
    gpus: float  # GPU equivalents held: 1/replicas for a share, slices/7 for a MIG instance
    figures: str  # per-pod | device-level | none
    utilization: Figures | None  # percent
    memory: Figures | None  # MiB of framebuffer used
    utilization_metric: str | None
    idle: bool = False
    idle_gpu_hours: float = 0.0


@dataclass(frozen=True)
class Usage:
    where: str  # the Prometheus asked
    window: str
    start: float
    end: float
    step: float
    below: float  # percent: the idle threshold
    holders: tuple[HolderUsage, ...] = ()
    notes: tuple[str, ...] = ()
    error: str | None = None  # why there are no figures (Prometheus not asked, refused, unreachable)
    queries: int = 0
    # ok | unreachable | refused (no figures: `error` says why) | no-series (no dcgm-exporter series at all) |
    # partial (a holder without series, or clock skew): command.py turns it into the exit status
    status: str = "ok"

    @property
    def idle(self) -> tuple[HolderUsage, ...]:
        return tuple(sorted((h for h in self.holders if h.idle),
                            key=lambda h: (-h.idle_gpu_hours, h.namespace, h.pod, h.resource)))

    def to_dict(self, idle: bool) -> dict[str, Any]:
        return {"status": self.status, "prometheus": self.where, "window": self.window, "start": self.start,
                "end": self.end, "step": self.step, "queries": self.queries, "error": self.error,
                "notes": list(self.notes),
                "holders": [_holder_dict(h) for h in self.holders],
                "idle": {"utilizationPercentBelow": self.below,
                         "holders": [_holder_dict(h) for h in self.idle]} if idle else None}


def _figures_dict(f: Figures | None) -> dict[str, float] | None:
    return None if f is None else {"mean": round(f.mean, 3), "max": round(f.max, 3), "first": f.first,
                                   "last": f.last}


def _holder_dict(h: HolderUsage) -> dict[str, Any]:
    return {"namespace": h.namespace, "name": h.pod, "node": h.node, "resource": h.resource, "amount": h.amount,
            "sharing": h.sharing, "gpus": round(h.gpus, 4), "figures": h.figures,
            "utilizationPercent": _figures_dict(h.utilization), "utilizationMetric": h.utilization_metric,
            "memoryUsedMiB": _figures_dict(h.memory), "idle": h.idle, "idleGpuHours": round(h.idle_gpu_hours, 4)}


def parse_window(text: str) -> float:
    """Seconds of a Prometheus-style duration: 90s, 30m, 2h, 1h30m, 1d."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    total, number = 0.0, ""
    for char in text.strip():
        if char.isdigit() or char == ".":
            number += char
        elif char in units and number:
            total, number = total + float(number) * units[char], ""
        else:
            raise ValueError(f"not a duration: {text!r} (e.g. 30m, 2h, 90s)")
    if number or total <= 0:
        raise ValueError(f"not a duration: {text!r} (e.g. 30m, 2h, 90s)")
    return total


def summarize(values: Sequence[Sequence[Any]]) -> Figures | None:
    """Mean, max, first and last time of [time, value] pairs (the value a number or, as the API sends it, text)."""
    if not values:
        return None
    numbers = [float(pair[1]) for pair in values]
    return Figures(sum(numbers) / len(numbers), max(numbers), float(values[0][0]), float(values[-1][0]))


# The labels the join reads (above); a range query keeps only these (`max by`), so its answer carries no
# label nobody reads (instance, job, pci_bus_id, modelName, ...). Series that differ only in others (the
# same device scraped twice) are one.
KEPT_LABELS = ("namespace", "pod", "pod_namespace", "pod_name", "vgpu", "GPU_I_PROFILE", "GPU_I_ID",
               "dra_device_name", "dra_mig_profile", "Hostname", "hostname", "UUID", "uuid", "gpu")


def range_query(metric: str) -> str:
    return f"max by ({', '.join(KEPT_LABELS)}) ({metric})"


Summary = tuple[Mapping[str, str], Figures]  # one series: its labels and its figures over the window


def summaries(series: Iterable[Series]) -> list[Summary]:
    """Each series reduced to its figures as soon as it is read (the samples are not kept)."""
    out = []
    for s in series:
        figures = summarize(s.values)
        if figures is not None:
            out.append((s.labels, figures))
    return out


def _combine(parts: Sequence[Figures], add: bool) -> Figures | None:
    """Several GPUs of one holder: utilisation is their mean (max the busiest), memory their sum."""
    if not parts:
        return None
    mean = sum(p.mean for p in parts) / (1 if add else len(parts))
    top = sum(p.max for p in parts) if add else max(p.max for p in parts)
    return Figures(mean, top, min(p.first for p in parts), max(p.last for p in parts))


def _pod_of(labels: Mapping[str, str]) -> tuple[str, str] | None:
    pod = labels.get("pod") or labels.get("pod_name")
    namespace = labels.get("namespace") or labels.get("pod_namespace")
    return (namespace, pod) if pod and namespace else None


class _Index:
    """One metric's series by pod, and the unlabelled (device-level) ones by node."""

    def __init__(self, series: Iterable[Summary]) -> None:
        self.by_pod: dict[tuple[str, str], list[Summary]] = {}
        self.by_node: dict[str, list[Summary]] = {}
        self.count = 0
        for labels, figures in series:
            self.count += 1
            pod = _pod_of(labels)
            if pod is not None:
                self.by_pod.setdefault(pod, []).append((labels, figures))
            else:
                node = labels.get("Hostname") or labels.get("hostname") or ""
                self.by_node.setdefault(node, []).append((labels, figures))

    def pick(self, key: tuple[str, str], node: str, sharing: str, resource: str,
             dra_device: str | None) -> tuple[str, list[Figures]]:
        own = self.by_pod.get(key, [])
        if sharing == "dra":
            own = [s for s in own if s[0].get("dra_device_name") == dra_device] or own
        elif sharing == "mig" and resource.startswith(MIG_PREFIX):
            profile = resource[len(MIG_PREFIX):]
            own = [s for s in own if s[0].get("GPU_I_PROFILE", s[0].get("dra_mig_profile")) == profile]
        elif sharing in ("time-slicing", "mps"):
            per_pod = [f for labels, f in own if "vgpu" in labels]
            if per_pod:
                return "per-pod", per_pod
            device = [f for _, f in own] or [f for _, f in self.by_node.get(node, [])]
            return ("device-level", device) if device else ("none", [])
        return ("per-pod", [f for _, f in own]) if own else ("none", [])


@dataclass(frozen=True)
class _Held:
    namespace: str
    pod: str
    node: NodeRecord
    resource: str
    amount: int
    sharing: str
    gpus: float
    dra_device: str | None = None


def _sharing(node: NodeRecord, resource: str) -> tuple[str, int]:
    use = next((r for r in node.resources if r.name == resource), None)
    strategy = use.strategy if use is not None else None
    replicas = (use.replicas if use is not None else None) or node.replicas or 1
    if strategy is None and node.sharing_strategy not in (None, "none"):
        strategy = node.sharing_strategy
    if strategy in ("time-slicing", "mps") and replicas > 1:
        return str(strategy), replicas
    return ("mig" if resource.startswith(MIG_PREFIX) else "whole"), 1


def _mig_share(node: NodeRecord, resource: str) -> float:
    """A MIG instance's part of its GPU: its compute slices (the N of Ng) of 7 (A30: 4)."""
    slices = resource[len(MIG_PREFIX):].split("g", 1)[0]
    whole = 4 if "A30" in (node.product or "") else 7
    return int(slices) / whole if slices.isdigit() else 1.0


def held(report: Report) -> list[_Held]:
    """One entry per holder pod, node and GPU resource (its containers' amounts added; init containers
    only when no other container holds it), and one per pod of each allocated DRA device."""
    out: list[_Held] = []
    for node in report.nodes:
        amounts: dict[tuple[str, str, str], list[int]] = {}
        for h in node.holders:
            acc = amounts.setdefault((h.namespace, h.pod, h.resource), [0, 0])
            if h.container_type == "initContainer":
                acc[1] = max(acc[1], h.amount)
            else:
                acc[0] += h.amount
        for (namespace, pod, resource), (running, init) in amounts.items():
            amount = running or init
            sharing, replicas = _sharing(node, resource)
            gpus = amount * _mig_share(node, resource) if sharing == "mig" else amount / replicas
            out.append(_Held(namespace, pod, node, resource, amount, sharing, gpus))
        for device in node.dra:
            for ref in device.pods:
                namespace, _, pod = ref.partition("/")
                if report.holder_namespace is None or namespace == report.holder_namespace:
                    out.append(_Held(namespace, pod, node, f"{device.driver}/{device.name}", 1, "dra", 1.0,
                                     device.name))
    return out


def join(report: Report, series: Mapping[str, Sequence[Summary]], *, window: str, start: float, end: float,
         step: float, below: float, where: str, skew: float = 0.0, queries: int = 0) -> Usage:
    """Each holder's figures over [start, end] from the series of METRICS (query_range results, summarised)."""
    util, engine, memory = (_Index(series.get(m, ())) for m in METRICS)
    holders: list[HolderUsage] = []
    span = end - start
    for h in held(report):
        key = (h.namespace, h.pod)
        figures, parts = util.pick(key, h.node.name, h.sharing, h.resource, h.dra_device)
        metric: str | None = GPU_UTIL if parts else None
        if not parts and h.sharing not in ("time-slicing", "mps"):
            figures, ratio = engine.pick(key, h.node.name, h.sharing, h.resource, h.dra_device)
            parts = [Figures(f.mean * 100, f.max * 100, f.first, f.last) for f in ratio]
            metric = ENGINE_ACTIVE if parts else None
        fb_figures, fb = memory.pick(key, h.node.name, h.sharing, h.resource, h.dra_device)
        utilization = _combine(parts, add=False)
        covered = 0.0 if utilization is None else min(utilization.last - utilization.first + step, span)
        # Idle: every sample of the window under the threshold, and samples over (nearly) all of it.
        idle = utilization is not None and utilization.max < below and covered >= span - 2 * step
        holders.append(HolderUsage(
            h.namespace, h.pod, h.node.name, h.resource, h.amount, h.sharing, h.gpus,
            figures if utilization is not None else fb_figures, utilization, _combine(fb, add=True), metric,
            idle, h.gpus * covered / 3600 if idle else 0.0))
    notes, status = [], "ok"
    if abs(skew) > SKEW_TOLERANCE:
        status = "partial"
        notes.append(f"clock skew: Prometheus's clock is {abs(skew):.0f} s {'ahead of' if skew > 0 else 'behind'} "
                     "this machine's; the window is taken on Prometheus's clock")
    if not (util.count or engine.count or memory.count):
        status = "no-series"
        notes.append(f"no dcgm-exporter series ({', '.join(METRICS)}) in Prometheus at {where} for the last "
                     f"{window}: is dcgm-exporter running (dcgmExporter.enabled) and scraped by this Prometheus?")
    else:
        missing = sorted({f"{h.namespace}/{h.pod}" for h in holders if h.figures == "none"})
        if missing:
            status = "partial"
            shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            notes.append(f"no usage series for {len(missing)} holder pod{'s' if len(missing) != 1 else ''} in the "
                         f"last {window} ({shown}): started within the window, or not mapped by dcgm-exporter")
    return Usage(where, window, start, end, step, below, tuple(holders), tuple(notes), None, queries, status)


def failed(where: str, window: str, below: float, error: str, *, status: str, queries: int = 0) -> Usage:
    """No figures: Prometheus could not be asked (`status` unreachable or refused, `error` says why)."""
    return Usage(where, window, 0.0, 0.0, 0.0, below, (), (), error, queries, status)
