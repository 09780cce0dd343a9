"""Simulated GPU nodes whose GPUs come from the DRA driver: Nodes labelled for the DRA kubelet plugin and
the ResourceSlices that plugin would publish for them, on the e2e plane (no kubelet, no GPU).

Builds on fleet.py: the Nodes are published by `fleet.Fleet` (its Node/status/taint steps and its
per-fleet isolation taint and toleration), from `fleet.PublishedNode` values planned here, since a DRA
node carries no device plugin resources and no GFD labels: on a node labelled gpu-stack.io/gpu-provider=dra
the chart runs neither (tests/chart/test_dra.py). What stays is NFD's PCI label and the chart's
nvidia.com/gpu.present rule.

What the plugin publishes, with the upstream code each fact mirrors — kubernetes-sigs/dra-driver-nvidia-gpu
main at 95932046 (VERSION v0.5.0-dev, the version GPU Operator v26.7.0 pins as v0.5.0):
- cmd/gpu-kubelet-plugin/driver.go publishResources (without DynamicMIG, the default): one pool per node,
  named after the node, of one slice holding every allocatable device; the kubeletplugin helper owns the
  slice by the Node (ownerReferences) and names it <node>-gpu.nvidia.com-<random> (generateName).
- cmd/gpu-kubelet-plugin/nvlib.go enumerateAllPossibleDevices: a GPU without MIG mode is one device; a GPU
  with MIG mode (static MIG) publishes its existing MIG devices and not itself.
- cmd/gpu-kubelet-plugin/deviceinfo.go GpuInfo.CanonicalName "gpu-<minor>", Attributes (type "gpu", uuid,
  productName, brand, architecture, cudaComputeCapability / driverVersion / cudaDriverVersion as versions,
  the standard resource.kubernetes.io/pciBusID and pcieRoot, resource.kubernetes.io/numaNode) and
  partitions.go fullGpuCapacity (memory, bytes).
- cmd/gpu-kubelet-plugin/deviceinfo.go MigDeviceInfo.GetDevice and mig.go: name
  gpu-<parent minor>-mig-<profile without dots>-<GI profile id>-<placement start> (ToCanonicalName),
  CommonAttributesMig (type "mig", parentUUID, profile, the parent's product/brand/architecture/versions/PCI
  attributes) plus uuid, CommonCapacitiesMig (multiprocessors, copyEngines, decoders, encoders, jpegEngines,
  ofaEngines, memory in bytes) plus one memorySlice<i> of 1 per memory slice of its placement.
The GPU facts (NVML) of the one model modelled are those upstream's reference page shows for an A100 40GB
(site/content/docs/reference/resourceslice-attributes.md: architecture Ampere, brand Nvidia, compute
capability 8.0, 1g.5gb with 14 SMs, 1 copy engine, 4864 MiB); its GPU instance profile id 19 for 1g.5gb
and 7 memory slices are NVML's (nvidia-smi mig -lgip on A100 40GB).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .e2elib import E2ECluster
from .fleet import GPU_MODELS, KUBELET_LABELS, NODE_BASE, ChartSharing, Fleet, FleetError, PublishedNode

DRIVER = "gpu.nvidia.com"  # cmd/gpu-kubelet-plugin/main.go DriverName
PROVIDER_LABEL = "gpu-stack.io/gpu-provider"  # charts/gpu-stack/templates/dra/_dra.tpl
DRIVER_VERSION, CUDA_DRIVER_VERSION = "580.95.05", "13.0"  # NVML's strings for the driver fleet.py's nodes report


@dataclass(frozen=True)
class MigProfile:
    gi_profile_id: int
    memory_mib: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    memory_slices: int  # placement size


@dataclass(frozen=True)
class NvmlFacts:
    name: str  # NVML device name (productName)
    brand: str
    architecture: str
    compute_capability: str
    memory_slices: int  # of the whole GPU
    mig_profiles: Mapping[str, MigProfile]


NVML = {
    "NVIDIA-A100-SXM4-40GB": NvmlFacts("NVIDIA A100-SXM4-40GB", "Nvidia", "Ampere", "8.0", 7, {
        "1g.5gb": MigProfile(19, 4864, 14, 1, 0, 0, 0, 0, 1)}),
}


@dataclass(frozen=True)
class DraNodeSpec:
    name: str
    gpus: int
    model: str = "NVIDIA-A100-SXM4-40GB"
    # GPU minor -> the MIG devices that exist on it (profile names, placed from slice 0 on); such a GPU is
    # in MIG mode and published only as its MIG devices.
    mig: Mapping[int, tuple[str, ...]] = field(default_factory=dict)


def _semver(version: str) -> str:
    """semver.MustParse(v).String() of github.com/Masterminds/semver/v3, which the driver applies to NVML's
    version strings: missing parts are 0, leading zeros go ("580.95.05" -> "580.95.5", "8.0" -> "8.0.0")."""
    parts = [int(p) for p in version.split(".")]
    return ".".join(str(p) for p in [*parts, 0, 0][:3])


def _uuid(prefix: str, *parts: object) -> str:
    h = hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()
    return f"{prefix}-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _mib(n: int) -> str:
    """n MiB as the API server serializes resource.NewQuantity(bytes, resource.BinarySI): the largest
    binary suffix that divides the value."""
    value = n * 1024 * 1024
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        unit = 1024 ** ("KMGTPE".index(suffix[0]) + 1)
        if value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value)


def devices(spec: DraNodeSpec) -> list[dict[str, Any]]:
    """The devices the GPU kubelet plugin publishes for this node (pure)."""
    facts = NVML.get(spec.model)
    if facts is None or spec.model not in GPU_MODELS:
        raise FleetError(f"node {spec.name}: no NVML facts for GPU model {spec.model!r} ({', '.join(NVML)})")
    if spec.gpus <= 0 or any(not 0 <= minor < spec.gpus for minor in spec.mig):
        raise FleetError(f"node {spec.name}: gpus={spec.gpus}, MIG on GPUs {sorted(spec.mig)}")
    memory_mib = GPU_MODELS[spec.model].memory_mib
    if memory_mib is None:
        raise FleetError(f"node {spec.name}: GPU model {spec.model!r} has no memory size")
    out: list[dict[str, Any]] = []
    for minor in range(spec.gpus):
        uuid = _uuid("GPU", spec.name, minor)
        common = {
            "productName": {"string": facts.name}, "brand": {"string": facts.brand},
            "architecture": {"string": facts.architecture},
            "cudaComputeCapability": {"version": _semver(facts.compute_capability)},
            "driverVersion": {"version": _semver(DRIVER_VERSION)},
            "cudaDriverVersion": {"version": _semver(CUDA_DRIVER_VERSION)},
            "resource.kubernetes.io/pciBusID": {"string": f"0000:{0x10 + minor:02x}:00.0"},
            "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{0x10 + minor:02x}"},
            "resource.kubernetes.io/numaNode": {"int": 0},
        }
        if minor not in spec.mig:
            out.append({"name": f"gpu-{minor}",
                        "attributes": {"type": {"string": "gpu"}, "uuid": {"string": uuid}, **common},
                        "capacity": {"memory": {"value": _mib(memory_mib)}}})
            continue
        start = 0
        for profile_name in spec.mig[minor]:
            profile = facts.mig_profiles.get(profile_name)
            if profile is None or start + profile.memory_slices > facts.memory_slices:
                raise FleetError(f"node {spec.name}: MIG {profile_name!r} does not fit GPU {minor}")
            capacity: dict[str, Any] = {
                "multiprocessors": {"value": str(profile.multiprocessors)},
                "copyEngines": {"value": str(profile.copy_engines)}, "decoders": {"value": str(profile.decoders)},
                "encoders": {"value": str(profile.encoders)}, "jpegEngines": {"value": str(profile.jpeg_engines)},
                "ofaEngines": {"value": str(profile.ofa_engines)}, "memory": {"value": _mib(profile.memory_mib)},
            }
            for i in range(start, start + profile.memory_slices):
                capacity[f"memorySlice{i}"] = {"value": "1"}
            name = f"gpu-{minor}-mig-{profile_name.replace('.', '')}-{profile.gi_profile_id}-{start}"
            out.append({"name": name, "capacity": capacity, "attributes": {
                "type": {"string": "mig"}, "uuid": {"string": _uuid("MIG", spec.name, minor, start)},
                "parentUUID": {"string": uuid}, "profile": {"string": profile_name}, **common}})
            start += profile.memory_slices
    return out


def node_of(spec: DraNodeSpec) -> PublishedNode:
    """The Node as NFD, the chart's gpu-present rule and the user's provider label leave it (pure): no GPU
    resources (no device plugin there), no GFD labels (no GFD there)."""
    labels = {"kubernetes.io/hostname": spec.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
              "feature.node.kubernetes.io/pci-10de.present": "true", "nvidia.com/gpu.present": "true",
              PROVIDER_LABEL: "dra"}
    assert set(labels) >= KUBELET_LABELS
    return PublishedNode(spec.name, labels, (), dict(NODE_BASE))


def slice_manifest(spec: DraNodeSpec, node_uid: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"generateName": f"{spec.name}-{DRIVER}-",
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": spec.name, "uid": node_uid,
                                              "controller": True}]},
            "spec": {"driver": DRIVER, "nodeName": spec.name,
                     "pool": {"name": spec.name, "generation": 1, "resourceSliceCount": 1},
                     "devices": devices(spec)}}


class DraFleet(Fleet):
    """fleet.Fleet with DRA GPU nodes: publishes the Nodes, then each node's ResourceSlice; deletes the
    slices with the nodes."""

    def __init__(self, cluster: E2ECluster, specs: Iterable[DraNodeSpec]) -> None:
        super().__init__(cluster, ChartSharing(configs={}, default_config="", config_label=""), ())
        self.specs = list(specs)
        for spec in self.specs:
            devices(spec)  # every FleetError before anything is created
        self.nodes = [node_of(spec) for spec in self.specs]
        self.slices: list[str] = []

    def __enter__(self) -> DraFleet:
        super().__enter__()
        for spec in self.specs:
            uid = self.cluster.get_json("node", spec.name)["metadata"]["uid"]
            created = self.cluster.kubectl("create", "-o", "json", "-f", "-",
                                           input=json.dumps(slice_manifest(spec, uid))).stdout
            self.slices.append(json.loads(created)["metadata"]["name"])
        return self

    def delete(self) -> None:
        if self.slices:
            self.cluster.kubectl("delete", "resourceslice", *self.slices, "--ignore-not-found", check=False)
            self.slices.clear()
        super().delete()
