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

MIG: a node whose device plugin config has migStrategy single or mixed gets the MIG devices the MIG
manager makes of each GPU: the layout is the node's `nvidia.com/mig.config` label (`NodeSpec.mig_config`,
as the user sets it, else the value the chart's `<release>-mig-default-config` NodeFeatureRule gives GPUs
with the PCI device IDs it lists), read from the chart's `<release>-mig-parted-config` ConfigMap, where
each GPU takes the entry whose device-filter names its PCI device ID (an entry without a filter: every
GPU; NVIDIA/mig-parted v0.15.0 api/spec/v1/helpers.go MatchesDeviceFilter). The device plugin then advertises under
`single` every MIG device as one nvidia.com/gpu (all of one profile, else it refuses), under `mixed`
each profile as nvidia.com/mig-<profile>; GFD labels them (k8s-device-plugin v0.20.0
internal/lm/mig-strategy.go, resource.go). A GPU no layout entry names, or a node without a layout,
keeps MIG off (the GPUs' factory state): full GPUs, as under `none`.

Not modelled (FleetError when asked for): per-device `devices` lists in a sharing config, sharing
sections beside a MIG strategy, MIG profiles with media-extension suffixes (`+me`, `+gfx`), the per-MIG-
device attribute labels GFD adds (`<resource>.memory`, `.multiprocessors`, `.slices.*`, `.engines.*`:
NVML facts of each profile; under `single` the full GPU's `nvidia.com/gpu.memory` is left off instead of
being published wrong). A NodeSpec naming a GPU model, config, MIG layout or label that no agent
publishes is a FleetError too: the fleet never invents a fact.
"""

from __future__ import annotations

import copy
import json
import re
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


# k8s-device-plugin v0.20.0 internal/lm/mig-strategy.go newMigStrategyMixedLabeler (and the plugin's
# resource names under mixed): each MIG profile is its own resource nvidia.com/mig-<profile>.
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
# The MIG manager's labels (NVIDIA/mig-parted v0.15.0 pkg/mig/reconfigure/reconfigure.go: the layout a
# node asks for, and the state the manager reports, "success" once it has applied it).
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
MIG_STATE_LABEL = "nvidia.com/mig.config.state"
# A MIG profile as the built-in layouts name it (<slices>g.<memory>gb); suffixed ones (+me, +gfx, -me) are
# not modelled.
MIG_PROFILE = re.compile(r"^[0-9]+g\.[0-9]+gb$")


@dataclass(frozen=True)
class GpuModel:
    product: str  # NVML device name with spaces as dashes (GFD productLabel)
    # NVML total memory (GFD <resource>.memory); None: no figure we can cite, the label is left off.
    memory_mib: int | None
    mig_capable: bool
    # PCI device ID as NFD's pci.device feature reports it (lower-case hex), for the MIG manager's
    # device-filter and the chart's default-layout NodeFeatureRule. Source: the PCI ID database the device
    # plugin vendors (k8s-device-plugin v0.20.0 vendor/github.com/NVIDIA/go-nvlib/pkg/pciids/default_pci.ids).
    pci_device: str | None = None


# Only models whose facts are written down here can be published.
GPU_MODELS = {
    "Tesla-T4": GpuModel("Tesla-T4", 15360, mig_capable=False),
    "NVIDIA-L4": GpuModel("NVIDIA-L4", 23034, mig_capable=False),
    # default_pci.ids: 20b0 "GA100 [A100 SXM4 40GB]"; GFD docs (docs/gpu-feature-discovery/README.md):
    # product A100-SXM4-40GB, under single A100-SXM4-40GB-MIG-1g.5gb.
    "NVIDIA-A100-SXM4-40GB": GpuModel("NVIDIA-A100-SXM4-40GB", 40960, mig_capable=True, pci_device="20b0"),
    # default_pci.ids: 20b2 "GA100 [A100 SXM4 80GB]"; the NVML name as mig-parted v0.15.0
    # cmd/nvidia-mig-parted/export/export_test.go writes it (A100-SXM4-80GB).
    "NVIDIA-A100-SXM4-80GB": GpuModel("NVIDIA-A100-SXM4-80GB", None, mig_capable=True, pci_device="20b2"),
    # default_pci.ids: 2330 "GH100 [H100 SXM5 80GB]"; its NVML name as mig-parted v0.15.0 CHANGELOG.md
    # writes it ("H100 80GB HBM3 SKU").
    "NVIDIA-H100-80GB-HBM3": GpuModel("NVIDIA-H100-80GB-HBM3", None, mig_capable=True, pci_device="2330"),
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
    # GFD under a MIG strategy (internal/lm/mig-strategy.go migStrategyLabeler), the MIG manager's label
    "nvidia.com/mig.strategy", MIG_CONFIG_LABEL, MIG_STATE_LABEL,
})
# GFD under the mixed strategy: nvidia.com/mig-<profile>.{product,count,replicas,sharing-strategy}
# (resource.go baseLabeler keyed by the MIG resource name).
MIG_LABEL = re.compile(r"^nvidia\.com/mig-[0-9]+g\.[0-9]+gb\.(product|count|replicas|sharing-strategy)$")
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
    # The node's nvidia.com/mig.config label as the user sets it; None: the chart's default-layout
    # NodeFeatureRule sets it on the GPUs it lists (or nothing does, and MIG stays off).
    mig_config: str | None = None


@dataclass(frozen=True)
class ChartSharing:
    """The device plugin's (and the MIG manager's) inputs from one chart render."""

    configs: Mapping[str, Mapping[str, Any]]  # config name -> parsed device plugin config file
    default_config: str
    config_label: str
    # layout name -> mig-parted config entries (the `<release>-mig-parted-config` ConfigMap; {} without
    # the MIG manager)
    mig_layouts: Mapping[str, Any] = field(default_factory=dict)
    # What the chart's `<release>-mig-default-config` NodeFeatureRule labels nodes with (the layout), and
    # on which PCI device IDs; None / empty when migManager.defaultConfig is empty.
    mig_default_layout: str | None = None
    mig_default_devices: frozenset[str] = frozenset()

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
        parted = next((o for o in objects if o["kind"] == "ConfigMap"
                       and o["metadata"]["name"].endswith("-mig-parted-config")), None)
        layouts = yaml.safe_load(parted["data"]["config.yaml"])["mig-configs"] if parted else {}
        rule = next((o for o in objects if o["kind"] == "NodeFeatureRule"
                     and o["metadata"]["name"].endswith("-mig-default-config")), None)
        default_layout, default_devices = None, frozenset[str]()
        if rule is not None:
            (only,) = rule["spec"]["rules"]
            default_layout = only["labels"][MIG_CONFIG_LABEL]
            (pci,) = [f for f in only["matchFeatures"] if f["feature"] == "pci.device"]
            default_devices = frozenset(str(d) for d in pci["matchExpressions"]["device"]["value"])
        return cls(configs=configs, default_config=env["DEFAULT_CONFIG"], config_label=env["NODE_LABEL"],
                   mig_layouts=layouts, mig_default_layout=default_layout, mig_default_devices=default_devices)

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

    def status(self) -> dict[str, Any]:
        """The kubelet's part, for the status subresource: what the device plugin registered, and Ready."""
        return {"capacity": dict(self.resources), "allocatable": dict(self.resources),
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                "message": "published by tests/e2e/fleet.py"}]}


@dataclass(frozen=True)
class _Sharing:
    strategy: str  # "none", "time-slicing", "mps" (GFD's sharing-strategy values)
    resource: str  # what the plugin advertises the node's full GPUs as
    replicas: int  # per GPU


def _sharing_of(name: str, config: Mapping[str, Any]) -> _Sharing:
    """How k8s-device-plugin v0.20.0 advertises the full GPUs of a node with this config file."""
    sharing = config.get("sharing") or {}
    if mig_strategy(config) != "none" and any((sharing.get(k) or {}).get("resources") for k in ("mps", "timeSlicing")):
        raise FleetError(f"config {name!r}: sharing beside migStrategy {mig_strategy(config)!r} is not modelled "
                         "by the fleet")
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


def mig_strategy(config: Mapping[str, Any]) -> str:
    return str((config.get("flags") or {}).get("migStrategy") or "none")


def mig_layout(spec: NodeSpec, model: GpuModel, sharing: ChartSharing) -> tuple[str | None, dict[str, int]]:
    """(the node's nvidia.com/mig.config label, the MIG devices per GPU the MIG manager makes of it: {} for
    MIG off). mig-parted v0.15.0 applies to each GPU the layout's entries whose device-filter names its
    PCI ID ("0x<DEVICE><VENDOR>", upper-case; an entry without a filter: every GPU); a GPU no entry names
    is left as it is (MIG off)."""
    label = spec.mig_config
    if label is None and model.pci_device in sharing.mig_default_devices:
        label = sharing.mig_default_layout  # the chart's NodeFeatureRule (nfd-master applies it)
    if label is None:
        return None, {}
    if label not in sharing.mig_layouts:
        # The MIG manager cannot apply a layout it does not have: nvidia.com/mig.config.state=failed.
        raise FleetError(f"node {spec.name}: MIG layout {label!r} is not in the chart's MIG manager config "
                         f"({', '.join(sorted(sharing.mig_layouts)) or 'no MIG manager'})")
    pci_id = f"0X{(model.pci_device or '').upper()}10DE"  # compared upper-case
    entries = []
    for entry in sharing.mig_layouts[label]:
        device_filter = entry.get("device-filter")
        filters = [device_filter] if isinstance(device_filter, str) else list(device_filter or [])
        if entry.get("devices", "all") != "all":
            raise FleetError(f"node {spec.name}: layout {label!r} lists devices by index; not modelled by the fleet")
        if not filters or pci_id in {f.upper() for f in filters}:
            entries.append(entry)
    if len(entries) > 1:
        raise FleetError(f"node {spec.name}: layout {label!r} has {len(entries)} entries for {model.product}")
    if not entries or not entries[0].get("mig-enabled"):
        return label, {}
    devices = {str(k): int(v) for k, v in (entries[0].get("mig-devices") or {}).items()}
    odd = sorted(p for p in devices if not MIG_PROFILE.match(p))
    if odd:
        raise FleetError(f"node {spec.name}: MIG profile(s) {', '.join(odd)} of layout {label!r} are not modelled")
    return label, devices


def plan(spec: NodeSpec, sharing: ChartSharing) -> PublishedNode:
    """What the agents of a release with these device plugin configs publish for one node (pure)."""
    unknown = sorted(k for k in spec.labels if k not in AGENT_LABELS and not MIG_LABEL.match(k))
    if unknown:
        raise FleetError(f"node {spec.name}: no upstream agent publishes the label(s) {', '.join(unknown)}")
    labels = {"kubernetes.io/hostname": spec.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
    resources = dict(NODE_BASE)
    taints: list[Mapping[str, str]] = []
    if spec.gpus == 0:
        if spec.config is not None or spec.labels or spec.mig_config is not None:
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
    config = sharing.configs[config_name]
    shared = _sharing_of(config_name, config)
    strategy = mig_strategy(config)
    mig_label, per_gpu = mig_layout(spec, model, sharing) if model.mig_capable else (spec.mig_config, {})
    if spec.mig_config is not None and not model.mig_capable:
        raise FleetError(f"node {spec.name}: {model.product} has no MIG; the MIG manager cannot apply "
                         f"{spec.mig_config!r}")
    if per_gpu and strategy == "none":
        raise FleetError(f"node {spec.name}: MIG devices under migStrategy none are not modelled by the fleet")
    if per_gpu:
        return _plan_mig(spec, sharing, model, strategy, mig_label, per_gpu, labels, resources)
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
        # internal/lm/nvml.go newSharingLabeler: "true" only for an MPS config on non-MIG GPUs
        "nvidia.com/mps.capable": str(shared.strategy == "mps").lower(),
        # internal/lm/nvml.go newMigCapabilityLabeler
        "nvidia.com/mig.capable": str(model.mig_capable).lower(),
        # internal/lm/nvml.go newVersionLabeler
        "nvidia.com/cuda.driver-version.full": "580.95.05",
    }
    if model.memory_mib is not None:
        labels["nvidia.com/gpu.memory"] = str(model.memory_mib)
    if strategy != "none":
        labels["nvidia.com/mig.strategy"] = strategy  # mig-strategy.go migStrategyLabeler
    if mig_label is not None:
        labels |= {MIG_CONFIG_LABEL: mig_label, MIG_STATE_LABEL: "success"}
    _override(spec, labels)
    if shared.strategy == "mps" and spec.taint_mps:
        taints.append(MPS_TAINT)
    return PublishedNode(spec.name, labels, tuple(taints), resources)


def _plan_mig(spec: NodeSpec, sharing: ChartSharing, model: GpuModel, strategy: str, mig_label: str | None,
              per_gpu: Mapping[str, int], labels: dict[str, str], resources: dict[str, str]) -> PublishedNode:
    """A node whose GPUs (all of one model) the MIG manager split into `per_gpu` MIG devices each."""
    if strategy == "single" and len(per_gpu) != 1:
        # mig-strategy.go newMigStrategySingleLabeler: "more than one MIG device type present on node"
        # (GFD labels the product MIG-INVALID; the plugin refuses to start).
        raise FleetError(f"node {spec.name}: migStrategy single with several MIG profiles "
                         f"({', '.join(sorted(per_gpu))}) is invalid upstream; not modelled")
    if spec.config is not None:
        labels[sharing.config_label] = spec.config
    labels |= {
        "feature.node.kubernetes.io/pci-10de.present": "true",
        "nvidia.com/gpu.present": "true",
        # mig-strategy.go newGPULabelers: MIG-enabled GPUs keep nvidia.com/gpu.* labels without sharing
        # (NewGPUResourceLabelerWithoutSharing: replicas 0, strategy none), product without a suffix.
        "nvidia.com/gpu.product": model.product,
        "nvidia.com/gpu.count": str(spec.gpus),
        "nvidia.com/gpu.replicas": "0",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/mps.capable": "false",  # nvml.go newSharingLabeler: not an MPS config
        "nvidia.com/mig.capable": "true",
        "nvidia.com/cuda.driver-version.full": "580.95.05",
        "nvidia.com/mig.strategy": strategy,
        MIG_CONFIG_LABEL: str(mig_label),
        MIG_STATE_LABEL: "success",  # the MIG manager, once the layout is applied
    }
    if model.memory_mib is not None and strategy == "mixed":
        labels["nvidia.com/gpu.memory"] = str(model.memory_mib)
    for profile, count in sorted(per_gpu.items()):
        # Device plugin: one device per MIG device; mig-strategy.go names the resource nvidia.com/gpu
        # under single, nvidia.com/mig-<profile> under mixed. MIG devices are not shared (replicas 1).
        resource = FULL_GPU if strategy == "single" else MIG_RESOURCE_PREFIX + profile
        resources[resource] = str(spec.gpus * count)
        # resource.go NewMIGResourceLabeler: baseLabeler(count, model, "MIG", profile) for the resource.
        labels |= {
            f"{resource}.product": f"{model.product}-MIG-{profile}",
            f"{resource}.count": str(spec.gpus * count),
            f"{resource}.replicas": "1",
            f"{resource}.sharing-strategy": "none",
        }
    _override(spec, labels)
    return PublishedNode(spec.name, labels, (), resources)


def _override(spec: NodeSpec, labels: dict[str, str]) -> None:
    """The NodeSpec's label overrides: a MIG resource label only for a resource the node has."""
    absent = sorted(k for k in spec.labels if MIG_LABEL.match(k) and k not in labels)
    if absent:
        raise FleetError(f"node {spec.name}: no upstream agent publishes the label(s) {', '.join(absent)} "
                         "on this node (no such MIG resource here)")
    labels |= dict(spec.labels)


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
        kubectl("patch", "node", node.name, "--subresource=status", "--type=merge",
                "-p", json.dumps({"status": node.status()}))
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
