"""The records `gpu-stack-webhook inspect` reports (built by `model.build_report`) and their JSON shape.

`Report.to_dict()` is the `-o json` / `-o yaml` document; its shape is versioned by SCHEMA_VERSION and
described by inspect-v1.schema.json beside this file. A field is only ever added within a version.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = "gpu-stack.io/inspect/v1"


@dataclass(frozen=True)
class MpsLimits:
    memory_mib: int | None  # None when GFD does not label the GPU's memory
    active_thread_percentage: int


@dataclass(frozen=True)
class ResourceUse:
    name: str
    capacity: int
    allocatable: int
    requested: int
    strategy: str | None = None  # exclusive | time-slicing | mps; None when unknown
    replicas: int | None = None
    mps: MpsLimits | None = None

    @property
    def free(self) -> int:
        return self.allocatable - self.requested

    @property
    def unhealthy(self) -> int:
        """Devices the kubelet counts in capacity but not in allocatable: those its device plugin reports
        Unhealthy (pkg/kubelet/cm/devicemanager: allocatable counts healthy devices only)."""
        return max(self.capacity - self.allocatable, 0)


@dataclass(frozen=True)
class Holder:
    namespace: str
    pod: str
    container: str
    container_type: str  # container | initContainer | sidecar (restartable init container)
    resource: str
    amount: int
    phase: str


@dataclass(frozen=True)
class DraDevice:
    """A device a DRA driver publishes for the node in a ResourceSlice, and the claim it is allocated to."""

    driver: str
    pool: str
    name: str
    type: str | None  # the driver's `type` attribute: gpu, mig, vfio, ...
    product: str | None  # `productName`
    claim: str | None  # namespace/name of the ResourceClaim whose allocation names it; None: free
    pods: tuple[str, ...] = ()  # namespace/name of the pods the claim is reserved for

    @property
    def allocated(self) -> bool:
        return self.claim is not None


@dataclass(frozen=True)
class NodeRecord:
    name: str
    product: str | None
    memory_mib: int | None
    gpu_count: int | None
    sharing_strategy: str | None  # GFD label
    replicas: int | None  # GFD label
    config_label: str | None
    config: str | None  # the config the device plugin uses on this node; None without the ConfigMap
    mig_strategy: str | None
    mig_config: str | None
    mig_state: str | None
    resources: tuple[ResourceUse, ...]
    holders: tuple[Holder, ...]
    notes: tuple[str, ...] = ()
    dra: tuple[DraDevice, ...] = ()  # DRA devices published for the node (ResourceSlices)


@dataclass(frozen=True)
class Dashboard:
    kind: str  # ConfigMap (Grafana's dashboard sidecar) | GrafanaDashboard (grafana-operator)
    namespace: str
    name: str
    uid: str | None  # from the dashboard JSON; None when it cannot be read
    title: str | None
    folder: str | None  # the folder annotation (ConfigMap) or spec.folder (GrafanaDashboard)


@dataclass(frozen=True)
class Dashboards:
    namespace: str  # where they were looked for (monitoring.dashboards.namespace, else the release's)
    items: tuple[Dashboard, ...]


@dataclass(frozen=True)
class Report:
    nodes: tuple[NodeRecord, ...]
    other_nodes: int  # nodes listed that carry no GPU
    notes: tuple[str, ...] = ()
    holder_namespace: str | None = None  # holders listed from this namespace only
    dashboards: Dashboards | None = None  # None: not looked up (forbidden, or not asked)
    totals: tuple[ResourceUse, ...] = field(init=False)

    def __post_init__(self) -> None:
        sums: dict[str, list[int]] = {}
        for node in self.nodes:
            for res in node.resources:
                acc = sums.setdefault(res.name, [0, 0, 0])
                acc[0] += res.capacity
                acc[1] += res.allocatable
                acc[2] += res.requested
        object.__setattr__(self, "totals", tuple(ResourceUse(n, capacity=c, allocatable=a, requested=r)
                                                 for n, (c, a, r) in sorted(sums.items())))

    @property
    def gpus(self) -> int:
        return sum(node.gpu_count or 0 for node in self.nodes)

    @property
    def dra_devices(self) -> tuple[int, int]:
        """(published, allocated) DRA devices on the nodes listed."""
        devices = [d for node in self.nodes for d in node.dra]
        return len(devices), sum(1 for d in devices if d.allocated)

    @property
    def holding_pods(self) -> int:
        return len({(h.namespace, h.pod) for node in self.nodes for h in node.holders})

    def to_dict(self) -> dict[str, Any]:
        return {
            "schemaVersion": SCHEMA_VERSION,
            "nodes": [_node_dict(n) for n in self.nodes],
            "summary": {
                "gpuNodes": len(self.nodes),
                "otherNodes": self.other_nodes,
                "gpus": self.gpus,
                "holdingPods": self.holding_pods,
                "holderNamespace": self.holder_namespace,
                "resources": [_usage_dict(r) for r in self.totals],
                "draDevices": {"published": self.dra_devices[0], "allocated": self.dra_devices[1],
                               "free": self.dra_devices[0] - self.dra_devices[1]},
            },
            "notes": list(self.notes),
            "dashboards": None if self.dashboards is None else {
                "namespace": self.dashboards.namespace,
                "items": [{"kind": d.kind, "namespace": d.namespace, "name": d.name, "uid": d.uid, "title": d.title,
                           "folder": d.folder} for d in self.dashboards.items],
            },
        }


def _usage_dict(res: ResourceUse) -> dict[str, Any]:
    return {"name": res.name, "capacity": res.capacity, "allocatable": res.allocatable,
            "requested": res.requested, "free": res.free, "unhealthy": res.unhealthy}


def _node_dict(node: NodeRecord) -> dict[str, Any]:
    resources = []
    for res in node.resources:
        entry = _usage_dict(res)
        entry["sharing"] = {"strategy": res.strategy, "replicas": res.replicas}
        entry["mps"] = None if res.mps is None else {
            "memoryLimitMiB": res.mps.memory_mib, "activeThreadPercentage": res.mps.active_thread_percentage}
        resources.append(entry)
    return {
        "name": node.name,
        "gpu": {"product": node.product, "memoryMiB": node.memory_mib, "count": node.gpu_count},
        "sharing": {"strategy": node.sharing_strategy, "replicas": node.replicas,
                    "configLabel": node.config_label, "config": node.config},
        "mig": {"strategy": node.mig_strategy, "config": node.mig_config, "state": node.mig_state},
        "resources": resources,
        "pods": [{"namespace": h.namespace, "name": h.pod, "container": h.container,
                  "containerType": h.container_type, "resource": h.resource, "amount": h.amount,
                  "phase": h.phase} for h in node.holders],
        "notes": list(node.notes),
        "draDevices": [{"driver": d.driver, "pool": d.pool, "name": d.name, "type": d.type, "product": d.product,
                        "claim": d.claim, "pods": list(d.pods)} for d in node.dra],
    }
