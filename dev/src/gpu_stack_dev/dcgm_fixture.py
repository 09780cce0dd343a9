"""A stand-in for dcgm-exporter's /metrics, for tests that need a real Prometheus to scrape GPU series:
the fields are the ones the chart makes dcgm-exporter export (its rendered metrics.csv, `chart_fields()`),
and each series is labelled and ordered as dcgm-exporter writes it (NVIDIA/dcgm-exporter tag 4.5.3-4.8.2,
the newest whose source could be read; the chart pins 4.6.0-4.8.3):

- internal/pkg/rendermetrics/render_metrics.go:47: `FIELD{gpu,UUID,pci_bus_id,device,modelName[,GPU_I_PROFILE,
  GPU_I_ID][,Hostname]` then the extra labels and the pod attributes, each in key order (Go templates range
  over a map's sorted keys).
- internal/pkg/transformation/kubernetes.go: without --kubernetes-virtual-gpus a device gets the `pod`,
  `namespace`, `container` of the one pod the kubelet gave it (a shared GPU: the last one read, 424-431);
  with it, every pod of a shared GPU gets a copy with `vgpu` (372-391), and DCGM_FI_DEV_GPU_UTIL and
  DCGM_FI_DEV_FB_USED are per process, with `pod_uid`, beside the device's own series (201-251, 360-367);
  DRA (--kubernetes-enable-dra): one copy per pod with the dra_* labels (466-491).
- A MIG instance has no DCGM_FI_DEV_GPU_UTIL (DCGM leaves it blank, the exporter skips blank values).
Nothing here is upstream code: the shapes are written from those lines."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache

from gpu_stack_dev.inspect_cluster import render_chart

PER_PROCESS = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED")  # process_metrics.go:30
NOT_FOR_MIG = ("DCGM_FI_DEV_GPU_UTIL",)


@cache
def chart_fields() -> tuple[tuple[str, str, str], ...]:
    """(field, type, help) of each line of the metrics.csv the chart's dcgm-exporter reads (default values)."""
    (configmap,) = render_chart(["--show-only", "templates/dcgm-exporter/configmap.yaml"])
    fields = []
    for raw in configmap["data"]["metrics.csv"].splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            name, kind, text = (part.strip() for part in line.split(",", 2))
            fields.append((name, kind, text))
    return tuple(fields)


@dataclass(frozen=True)
class PodUse:
    namespace: str
    pod: str
    container: str
    util: float = 0.0  # percent: this pod's processes (per-process series), else ignored
    fb_mib: float = 0.0
    vgpu: str | None = None  # the N of UUID::N the kubelet gave the pod
    dra: Mapping[str, str] | None = None  # dra_* labels


@dataclass(frozen=True)
class Device:
    node: str
    index: int
    model: str
    util: float  # percent, the whole device
    fb_mib: float
    pods: Sequence[PodUse] = ()
    mig_profile: str | None = None
    mig_instance: int | None = None
    shared: bool = False  # time-slicing / MPS replicas
    uuid: str = field(default="")

    @property
    def gpu_uuid(self) -> str:
        return self.uuid or f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{self.node}/{self.index}')}"


def _value(name: str, device: Device, pod: PodUse | None) -> float:
    if name == "DCGM_FI_DEV_GPU_UTIL":
        return pod.util if pod is not None else device.util
    if name == "DCGM_FI_DEV_FB_USED":
        return pod.fb_mib if pod is not None else device.fb_mib
    if name == "DCGM_FI_PROF_GR_ENGINE_ACTIVE":
        return round(device.util / 100, 4)
    return {"DCGM_FI_DEV_GPU_TEMP": 41, "DCGM_FI_DEV_POWER_USAGE": 72.5, "DCGM_FI_DEV_FB_FREE": 1000}.get(name, 0)


def _line(name: str, device: Device, attributes: Mapping[str, str], value: float) -> str:
    labels = [("gpu", str(device.index)), ("UUID", device.gpu_uuid),
              ("pci_bus_id", f"00000000:{device.index + 1:02X}:00.0"), ("device", f"nvidia{device.index}"),
              ("modelName", device.model)]
    if device.mig_profile is not None:
        labels += [("GPU_I_PROFILE", device.mig_profile), ("GPU_I_ID", str(device.mig_instance))]
    labels.append(("Hostname", device.node))
    labels += sorted(attributes.items())
    text = ",".join(f'{k}="{v}"' for k, v in labels)
    return f"{name}{{{text}}} {value:g}"


def _pod_attributes(pod: PodUse) -> dict[str, str]:
    return {"pod": pod.pod, "namespace": pod.namespace, "container": pod.container}


def exposition(devices: Iterable[Device], fields: Sequence[tuple[str, str, str]], virtual_gpus: bool = False,
               dra: bool = True) -> str:
    """The /metrics text of one scrape over `devices` (of any number of nodes)."""
    devices = list(devices)
    out = []
    for name, kind, text in fields:
        out += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
        for d in devices:
            if d.mig_profile is not None and name in NOT_FOR_MIG:
                continue
            if any(p.dra for p in d.pods) and dra:
                out += [_line(name, d, {**_pod_attributes(p), **(p.dra or {})}, _value(name, d, None))
                        for p in d.pods]
            elif d.shared and virtual_gpus and d.pods:
                if name in PER_PROCESS:
                    out.append(_line(name, d, {}, _value(name, d, None)))
                    out += [_line(name, d, {**_pod_attributes(p), "pod_uid": _uid(p), "vgpu": p.vgpu or "0"},
                                  _value(name, d, p)) for p in d.pods]
                else:
                    out += [_line(name, d, {**_pod_attributes(p), "vgpu": p.vgpu or "0"}, _value(name, d, None))
                            for p in d.pods]
            elif d.pods:  # the one pod the exporter maps the device to: the last one read
                out.append(_line(name, d, _pod_attributes(d.pods[-1]), _value(name, d, None)))
            else:
                out.append(_line(name, d, {}, _value(name, d, None)))
    return "\n".join(out) + "\n"


def _uid(pod: PodUse) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{pod.namespace}/{pod.pod}"))
