"""What the chart's agents publish on a GPU node and how a test describes one: GPU models, label sets, NodeSpec,
ChartSharing (the device plugin's inputs read from a chart render) and PublishedNode (fleet.py says how they
are used)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from gpu_stack_dev.paths import CHART, TEMPLATE_API_VERSIONS

from .e2elib import values_args

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
        out = helm("template", "fleet", str(CHART), "-n", namespace, *TEMPLATE_API_VERSIONS,
                   *values_args(overlay, set_json=values)).stdout
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
                                "message": "published by gpu_stack_dev.e2e.fleet"}]}
