"""plan(spec, sharing): one NodeSpec turned into the labels, taints and resources the agents would publish
(pure; fleet.py says what each fact mirrors)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .fleet_facts import (
    AGENT_LABELS,
    FULL_GPU,
    GPU_MODELS,
    MIG_CONFIG_LABEL,
    MIG_LABEL,
    MIG_PROFILE,
    MIG_RESOURCE_PREFIX,
    MIG_STATE_LABEL,
    MPS_TAINT,
    NODE_BASE,
    RESOURCE_PREFIX,
    SHARED_SUFFIX,
    ChartSharing,
    FleetError,
    GpuModel,
    NodeSpec,
    PublishedNode,
)


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
