"""A simulated GPU fleet: Nodes published as the chart's agents would publish them for one overlay.

There is no kubelet, device plugin or GPU Feature Discovery on the e2e plane, so a test describes its
nodes (`NodeSpec`: name, GPU model and count, the device plugin config the node is labelled with) and
`Fleet.publish` creates them through the API server as the agents would leave them: the Node, then
capacity/allocatable and a Ready condition through the status subresource (the kubelet's part), the
`node.kubernetes.io/not-ready` taint the API server adds at creation removed (the node lifecycle
controller's part; it is off on this plane, see hack/controlplane.py).

What a GPU node advertises is derived, never written by hand: `ChartSharing.render(helm, overlay)` runs
`helm template` for the overlay and reads the device plugin's own inputs from the render (the config files
of the `<release>-device-plugin-configs` ConfigMap, and DEFAULT_CONFIG / NODE_LABEL of its config-manager
container); `plan(spec, sharing)` (pure) turns one NodeSpec into labels, taints and resources. Each fact
cites the upstream source it mirrors: NVIDIA/k8s-device-plugin v0.20.0 (device plugin and GFD, the
versions the chart pins, tests/chart/test_upstream_versions.py).

Not modelled yet (FleetError when asked for): MIG (single/mixed strategies and the MIG manager's
layouts), per-device `devices` lists in a sharing config. A NodeSpec naming a GPU model, config or label
that no agent publishes is a FleetError too: the fleet never invents a fact.
"""

from __future__ import annotations

import copy
import json
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from .e2elib import CHART, E2ECluster, values_args

FULL_GPU = "nvidia.com/gpu"
# k8s-device-plugin v0.20.0 api/config/v1/resources.go NewResourceName: a bare name gets this prefix.
RESOURCE_PREFIX = "nvidia.com/"
# k8s-device-plugin v0.20.0 api/config/v1/replicas.go (ReplicatedResources.UnmarshalJSON with
# renameByDefault) and resources.go DefaultSharedRename: the shared resource is <name>.shared.
SHARED_SUFFIX = ".shared"
# README.md (MPS section) and Chart-values-examples/mps-x10.yaml ask users to taint MPS nodes so only
# MPS pods (which the webhook gives the matching toleration) land there.
MPS_TAINT = {"key": "gpu-stack.io/mps", "effect": "NoSchedule"}
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
FLEET_TAINT_KEY = "e2e.gpu-stack.io/fleet"  # test isolation only (see Fleet)
# What the kubelet reports for the node itself (any values; the same for every node of a fleet).
NODE_BASE = {"cpu": "32", "memory": "256Gi", "pods": "110", "ephemeral-storage": "500Gi"}


@dataclass(frozen=True)
class GpuModel:
    product: str  # NVML device name with spaces as dashes (GFD productLabel)
    memory_mib: int  # NVML total memory (GFD <resource>.memory)
    mig_capable: bool


# Only models whose facts are written down here can be published.
GPU_MODELS = {
    "Tesla-T4": GpuModel("Tesla-T4", 15360, mig_capable=False),
    "NVIDIA-L4": GpuModel("NVIDIA-L4", 23034, mig_capable=False),
    "NVIDIA-A100-SXM4-40GB": GpuModel("NVIDIA-A100-SXM4-40GB", 40960, mig_capable=True),
}

# Labels an upstream agent publishes on a GPU node and this fleet knows how to derive. A NodeSpec may
# name only these in `labels` (to override a derived value, e.g. an older driver version).
AGENT_LABELS = frozenset({
    # NFD v0.19 (the chart's nfd-worker, deviceLabelFields: vendor) and the chart's NodeFeatureRule
    "feature.node.kubernetes.io/pci-10de.present", "nvidia.com/gpu.present",
    # GFD, k8s-device-plugin v0.20.0 internal/lm/resource.go (baseLabeler, memory) and nvml.go
    "nvidia.com/gpu.product", "nvidia.com/gpu.count", "nvidia.com/gpu.replicas", "nvidia.com/gpu.sharing-strategy",
    "nvidia.com/gpu.memory", "nvidia.com/mps.capable", "nvidia.com/mig.capable",
    "nvidia.com/cuda.driver-version.full",
})
# Labels the kubelet sets on every node (k8s.io/api/core/v1 well_known_labels.go).
KUBELET_LABELS = frozenset({"kubernetes.io/hostname", "kubernetes.io/os", "kubernetes.io/arch"})


class FleetError(ValueError):
    """A fleet description asks for something no upstream agent would publish (or not modelled yet)."""


@dataclass(frozen=True)
class NodeSpec:
    name: str
    gpus: int = 0  # 0: a node without GPUs (no NVIDIA labels, no GPU resources)
    model: str = "Tesla-T4"
    # The value of the device plugin's node label (nvidia.com/device-plugin.config); None: unlabelled,
    # the chart's default config applies.
    config: str | None = None
    # README.md: users taint MPS nodes; False publishes an MPS node someone forgot to taint.
    taint_mps: bool = True
    labels: Mapping[str, str] = field(default_factory=dict)  # overrides, from AGENT_LABELS only


@dataclass(frozen=True)
class ChartSharing:
    """The device plugin's inputs from one chart render."""

    configs: Mapping[str, Mapping[str, Any]]  # config name -> parsed device plugin config file
    default_config: str
    config_label: str

    @classmethod
    def from_objects(cls, objects: Iterable[Mapping[str, Any]]) -> ChartSharing:
        objects = list(objects)
        configmap = next(o for o in objects if o["kind"] == "ConfigMap"
                         and o["metadata"]["name"].endswith("-device-plugin-configs"))
        plugin = next(o for o in objects if o["kind"] == "DaemonSet"
                      and o["metadata"]["name"].endswith("-device-plugin"))
        manager = next(c for c in plugin["spec"]["template"]["spec"]["containers"] if c["name"] == "config-manager")
        env = {e["name"]: e.get("value") for e in manager["env"]}
        configs = {name: yaml.safe_load(text) for name, text in configmap["data"].items()}
        return cls(configs=configs, default_config=env["DEFAULT_CONFIG"], config_label=env["NODE_LABEL"])

    @classmethod
    def render(cls, helm: Any, overlay: str, set_json: Mapping[str, Any] | None = None,
               namespace: str = "gpu-stack") -> ChartSharing:
        """`helm` is E2ECluster.helm (Helm 4); the overlay a file name in Chart-values-examples/ or "default";
        `set_json` as the install's (use the same values as the release the fleet stands beside)."""
        values = {"webhook.image.repository": "registry.invalid/fleet", **(set_json or {})}
        out = helm("template", "fleet", str(CHART), "-n", namespace, *values_args(overlay, set_json=values)).stdout
        return cls.from_objects(d for d in yaml.safe_load_all(out) if d)


@dataclass(frozen=True)
class PublishedNode:
    name: str
    labels: Mapping[str, str]
    taints: tuple[Mapping[str, str], ...]
    resources: Mapping[str, str]  # capacity == allocatable

    def manifest(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"taints": [dict(t) for t in self.taints]} if self.taints else {}
        return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.name, "labels": dict(self.labels)},
                "spec": spec}


@dataclass(frozen=True)
class _Sharing:
    strategy: str  # "none", "time-slicing", "mps" (GFD's sharing-strategy values)
    resource: str  # what the plugin advertises the node's full GPUs as
    replicas: int  # per GPU


def _sharing_of(name: str, config: Mapping[str, Any]) -> _Sharing:
    """How k8s-device-plugin v0.20.0 advertises the full GPUs of a node with this config file."""
    flags = config.get("flags") or {}
    if (flags.get("migStrategy") or "none") != "none":
        raise FleetError(f"config {name!r}: migStrategy {flags['migStrategy']!r} is not modelled by the fleet yet")
    sharing = config.get("sharing") or {}
    # api/config/v1/sharing.go ReplicatedResources/SharingStrategy: an mps section with resources wins
    # over timeSlicing.
    for key, strategy in (("mps", "mps"), ("timeSlicing", "time-slicing")):
        section = sharing.get(key) or {}
        for resource in section.get("resources") or ():
            name_in_config = str(resource["name"])
            base = name_in_config if name_in_config.startswith(RESOURCE_PREFIX) else RESOURCE_PREFIX + name_in_config
            if base != FULL_GPU:
                # internal/rm/device_map.go updateDeviceMapWithReplicas: an entry naming a resource the
                # plugin has no devices for is skipped; nothing is published for it.
                continue
            if resource.get("devices", "all") != "all":
                raise FleetError(f"config {name!r}: per-device sharing (devices: {resource['devices']!r}) "
                                 "is not modelled by the fleet yet")
            # v0.20.0 ignores `rename` (api/config/v1/config.go DisableResourceNamingInConfig); with
            # renameByDefault the resource is <name>.shared (replicas.go, resources.go DefaultSharedRename).
            advertised = base + SHARED_SUFFIX if section.get("renameByDefault") else base
            return _Sharing(strategy, advertised, int(resource["replicas"]))
    return _Sharing("none", FULL_GPU, 1)


def plan(spec: NodeSpec, sharing: ChartSharing) -> PublishedNode:
    """What the agents of a release with these device plugin configs publish for one node (pure)."""
    unknown = sorted(set(spec.labels) - AGENT_LABELS)
    if unknown:
        raise FleetError(f"node {spec.name}: no upstream agent publishes the label(s) {', '.join(unknown)}")
    labels = {"kubernetes.io/hostname": spec.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
    resources = dict(NODE_BASE)
    taints: list[Mapping[str, str]] = []
    if spec.gpus == 0:
        if spec.config is not None or spec.labels:
            raise FleetError(f"node {spec.name}: a node without GPUs gets no device plugin config or GPU labels")
        return PublishedNode(spec.name, labels, (), resources)
    if spec.gpus < 0:
        raise FleetError(f"node {spec.name}: gpus={spec.gpus}")
    model = GPU_MODELS.get(spec.model)
    if model is None:
        raise FleetError(f"node {spec.name}: GPU model {spec.model!r} is not one the fleet knows "
                         f"({', '.join(GPU_MODELS)})")
    config_name = spec.config if spec.config is not None else sharing.default_config
    if config_name not in sharing.configs:
        # cmd/config-manager (FALLBACK_STRATEGIES=named,single): a label naming no config file makes the
        # config-manager fail, the plugin never starts and advertises nothing.
        raise FleetError(f"node {spec.name}: device plugin config {config_name!r} is not in the chart's "
                         f"configs ({', '.join(sorted(sharing.configs))})")
    shared = _sharing_of(config_name, sharing.configs[config_name])
    # Device plugin: internal/rm/device_map.go updateDeviceMapWithReplicas makes `replicas` annotated
    # devices of every GPU, so the kubelet advertises gpus x replicas of the (possibly renamed) resource;
    # a renamed resource replaces nvidia.com/gpu (no device is left under the plain name).
    resources[shared.resource] = str(spec.gpus * shared.replicas)
    if spec.config is not None:
        labels[sharing.config_label] = spec.config  # set by the user; the config-manager reads it
    # GFD, internal/lm/resource.go: baseLabeler gives <resource>.product/.count/.replicas and the
    # sharing strategy ("none" unless replicas > 1), labels keyed by nvidia.com/gpu even when the
    # resource is renamed; productLabel appends "-SHARED" when shared and not renamed.
    renamed = shared.resource != FULL_GPU
    product = model.product + ("-SHARED" if shared.replicas > 1 and not renamed else "")
    labels |= {
        "feature.node.kubernetes.io/pci-10de.present": "true",  # NFD pci source, vendor 10de
        "nvidia.com/gpu.present": "true",  # the chart's gpu-present NodeFeatureRule
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.count": str(spec.gpus),
        "nvidia.com/gpu.replicas": str(shared.replicas),
        "nvidia.com/gpu.sharing-strategy": shared.strategy,
        "nvidia.com/gpu.memory": str(model.memory_mib),
        # internal/lm/nvml.go newSharingLabeler: "true" only for an MPS config on non-MIG GPUs
        "nvidia.com/mps.capable": str(shared.strategy == "mps").lower(),
        # internal/lm/nvml.go newMigCapabilityLabeler
        "nvidia.com/mig.capable": str(model.mig_capable).lower(),
        # internal/lm/nvml.go newVersionLabeler
        "nvidia.com/cuda.driver-version.full": "580.95.05",
    }
    labels |= dict(spec.labels)
    if shared.strategy == "mps" and spec.taint_mps:
        taints.append(MPS_TAINT)
    return PublishedNode(spec.name, labels, tuple(taints), resources)


def delete_pods(cluster: E2ECluster, namespace: str) -> None:
    """Every pod of the namespace, bound ones too: no kubelet confirms a graceful deletion, so --force."""
    cluster.kubectl("delete", "pods", "--all", "-n", namespace, "--force", "--grace-period=0", "--wait=true")


class Fleet:
    """Publishes the planned nodes on a cluster and deletes them, with every pod bound to them, at the
    end (a context manager).

    Isolation: e2e tests share one plane and leave Pending pods behind (their namespaces are deleted
    without waiting; some belong to controllers that recreate them). Each fleet's nodes carry one more
    taint, FLEET_TAINT_KEY=<fleet id>:NoSchedule, that no agent publishes: only pods given
    `fleet.toleration` (the test's own) can land there. It is the one fact not mirrored from upstream,
    and nothing the webhook reads."""

    def __init__(self, cluster: E2ECluster, sharing: ChartSharing, specs: Iterable[NodeSpec]) -> None:
        self.cluster = cluster
        self.nodes = [plan(spec, sharing) for spec in specs]  # every FleetError before anything is created
        self.published: list[str] = []
        self.id = uuid.uuid4().hex[:8]
        self.taint = {"key": FLEET_TAINT_KEY, "value": self.id, "effect": "NoSchedule"}
        self.toleration = {"key": FLEET_TAINT_KEY, "operator": "Equal", "value": self.id, "effect": "NoSchedule"}

    def __enter__(self) -> Fleet:
        for node in self.nodes:
            self.publish(node)
        return self

    def __exit__(self, *exc: object) -> None:
        self.delete()

    def __iter__(self) -> Iterator[PublishedNode]:
        return iter(self.nodes)

    def publish(self, node: PublishedNode) -> None:
        kubectl = self.cluster.kubectl
        manifest = node.manifest()
        manifest["spec"]["taints"] = [*manifest["spec"].get("taints", []), self.taint]
        kubectl("create", "-f", "-", input=json.dumps(manifest))
        self.published.append(node.name)
        # The kubelet's part: what the device plugin registered, and Ready.
        status = {"capacity": dict(node.resources), "allocatable": dict(node.resources),
                  "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                  "message": "published by tests/e2e/fleet.py"}]}
        kubectl("patch", "node", node.name, "--subresource=status", "--type=merge",
                "-p", json.dumps({"status": status}))
        # The node lifecycle controller's part: a Ready node loses the not-ready taint the API server's
        # TaintNodesByCondition admission added at creation.
        taints = [*(copy.deepcopy(dict(t)) for t in node.taints), self.taint]
        kubectl("patch", "node", node.name, "--type=merge", "-p", json.dumps({"spec": {"taints": taints}}))
        published = self.cluster.get_json("node", node.name)
        assert [t["key"] for t in published["spec"]["taints"]] == [t["key"] for t in taints], published

    def delete(self) -> None:
        for name in self.published:
            delete_node(self.cluster, name)
        self.published.clear()


def delete_node(cluster: E2ECluster, name: str) -> None:
    """The node and every pod bound to it, whichever test made them: with no kubelet, bound pods never
    finish a graceful deletion, and pods left on a deleted node would count as bound (e.g. for
    `kubectl gpu-stack inspect`) until the pod garbage collector's orphan sweep."""
    cluster.kubectl("delete", "pods", "--all-namespaces", f"--field-selector=spec.nodeName={name}", "--force",
                    "--grace-period=0", "--wait=true", check=False)
    cluster.kubectl("delete", "node", name, "--ignore-not-found", "--wait=false", check=False)


def wait_scheduled(cluster: E2ECluster, namespace: str, pod: str, want: str = "True",
                   timeout: float = 60) -> tuple[str, str, str]:
    """(status, message, nodeName) of the pod's PodScheduled condition once its status is `want` ("True":
    bound, "False": unschedulable), or as it stands after `timeout` seconds (the caller's assert fails).
    A pod found unschedulable is retried by the scheduler when the cluster changes (a node published,
    a pod deleted), so a "False" seen on the way to "True" is not the answer."""
    deadline = time.monotonic() + timeout
    seen = ("", "no PodScheduled condition", "")
    while True:
        obj = cluster.get_json("pod", pod, "-n", namespace)
        for condition in obj.get("status", {}).get("conditions", []):
            if condition["type"] == "PodScheduled":
                seen = (condition["status"], condition.get("message", ""), obj["spec"].get("nodeName", ""))
        if seen[0] == want or time.monotonic() > deadline:
            return seen
        time.sleep(0.5)
