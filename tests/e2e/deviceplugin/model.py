"""What the NVIDIA device plugin (NVIDIA/k8s-device-plugin v0.20.0, the version the chart pins) advertises
and answers for one node, computed from the chart's render (pure: no gRPC, no files).

A node is a `gpu_stack_dev.e2e.fleet` NodeSpec (GPU model and count, the device plugin config it is labelled
with, its MIG layout); the config file is the one the chart renders for it (fleet.ChartSharing), so the
resource names, replica counts and MIG resources come from the same functions that give the fleet its
numbers. Upstream facts, all at v0.20.0:

- Device IDs (internal/rm/devices.go, device_map.go): with deviceIDStrategy uuid a full GPU is its UUID
  (`GPU-...`), a MIG device its MIG UUID (`MIG-...`); with index they are `<gpu>` and `<gpu>:<mig>`. A
  shared GPU becomes `replicas` devices `<id>::<n>`, n = 0..replicas-1 (NewAnnotatedID,
  updateDeviceMapWithReplicas).
- Allocate (internal/plugin/server.go getAllocateResponse): the request's IDs lose their `::n` and
  duplicates; `envvar` sets NVIDIA_VISIBLE_DEVICES to them, joined by commas; `volume-mounts` sets it to
  /var/run/nvidia-container-devices and mounts /dev/null at /var/run/nvidia-container-devices/<id> for each
  (updateResponseForDeviceMounts, after envvar, so it wins when both are listed); `cdi-annotations` adds
  the annotation `cdi.k8s.io/nvidia-device-plugin_<random UUID>` = `k8s.device-plugin.nvidia.com/gpu=<id>,...` and
  `cdi-cri` the CDI device names (updateResponseForCDI; tags.cncf.io/container-device-interface
  pkg/cdi/annotations.go, pkg/parser/parser.go QualifiedName); with only CDI strategies nothing else is
  set. passDeviceSpecs adds /dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-uvm-tools, /dev/nvidia-modeset
  (each only when it exists where the plugin runs) and the devices' own nodes (apiDeviceSpecs;
  internal/rm/nvml_manager.go GetDevicePaths), host path under the driver's dev root.
- MPS (internal/plugin/mps.go updateReponse, cmd/mps-control-daemon/mps/root.go, daemon.go): env
  CUDA_MPS_PIPE_DIRECTORY=/mps/<resource>/pipe, mounts <mpsRoot>/<resource>/pipe at /mps/<resource>/pipe and
  <mpsRoot>/shm at /dev/shm.
- Requests (internal/rm/rm.go ValidateRequest): an unknown ID fails; more than one shared replica fails
  when failRequestsGreaterThanOne is set.
- GetPreferredAllocation (internal/rm/allocate.go greedyAlloc, distributed policy): replicas from the GPU
  with the fewest allocated replicas first. Full GPUs: upstream picks an NVLink-aligned set
  (nvml_manager.go, go-gpuallocator); with no topology to align here, the lowest IDs.
- Health: every device Healthy. Devices turning Unhealthy are the real plugin's own, on NVIDIA's mock NVML with
  a GPU failing (tests/deviceplugin/test_real_plugin_health.py); the stand-in is left for MIG devices, which
  the mock cannot create.

Not modelled: MIG capability device nodes (/dev/nvidia-caps/*: their minors come from the driver; the MIG
device's parent GPU node is passed), IMEX channels, GDS/MOFED/GDRCopy flags, topology (NUMA) hints.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_stack_dev.e2e.fleet import (
    FULL_GPU,
    GPU_MODELS,
    MIG_RESOURCE_PREFIX,
    ChartSharing,
    FleetError,
    NodeSpec,
    mig_layout,
    mig_strategy,
)
from gpu_stack_dev.e2e.fleet_plan import _sharing_of

HEALTHY = "Healthy"  # k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1 constants.go
API_VERSION = "v1beta1"
DEVICE_LIST_ENV = "NVIDIA_VISIBLE_DEVICES"  # server.go deviceListEnvVar
VOLUME_MOUNTS_HOST_PATH = "/dev/null"  # server.go deviceListAsVolumeMountsHostPath
VOLUME_MOUNTS_ROOT = "/var/run/nvidia-container-devices"  # server.go deviceListAsVolumeMountsContainerPathRoot
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"  # api/config/v1/consts.go DefaultCDIAnnotationPrefix
CDI_PLUGIN_NAME = "nvidia-device-plugin"  # server.go getCDIDeviceAnnotations
CDI_VENDOR = "k8s.device-plugin.nvidia.com"  # cmd/nvidia-device-plugin/plugin-manager.go cdi.WithVendor
MPS_CONTAINER_ROOT = "/mps"  # cmd/mps-control-daemon/mps/root.go ContainerRoot
MPS_SHM_IN_CONTAINER = "/dev/shm"  # cmd/mps-control-daemon/mps/daemon.go ShmDir
# nvml_manager.go GetDevicePaths; server.go apiDeviceSpecs drops each one that does not exist.
CONTROL_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
# A namespace for the stand-in's made-up GPU and MIG UUIDs (stable per node name and position).
UUID_NAMESPACE = uuid.UUID("6c1f2a3e-37a0-4c6b-9e53-0d5b1f2e7a37")


class AllocateError(ValueError):
    """An Allocate or GetPreferredAllocation request the NVIDIA plugin answers with an error."""


@dataclass(frozen=True)
class Device:
    id: str  # as the kubelet sees it
    gpu_index: int
    gpu_uuid: str
    base_id: str  # id without the replica annotation (what Allocate hands to the container)
    replica: int | None = None  # None: not shared


@dataclass(frozen=True)
class Resource:
    name: str
    devices: tuple[Device, ...]
    sharing: str = "none"  # "none", "time-slicing", "mps"
    fail_requests_greater_than_one: bool = False

    @property
    def socket_name(self) -> str:
        """server.go getPluginSocketPath: nvidia-<name without its domain>.sock."""
        return f"nvidia-{self.name.split('/', 1)[1]}.sock"

    def device(self, device_id: str) -> Device:
        for d in self.devices:
            if d.id == device_id:
                return d
        raise AllocateError(f"invalid allocation request for {self.name!r}: unknown device: {device_id}")


@dataclass(frozen=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True)
class DeviceNode:
    container_path: str
    host_path: str
    permissions: str = "rw"


@dataclass(frozen=True)
class ContainerAllocation:
    envs: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    devices: tuple[DeviceNode, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()


@dataclass(frozen=True)
class NodePlugin:
    """The device plugin of one node: its resources and how it answers Allocate."""

    node: str
    resources: tuple[Resource, ...]
    device_list_strategy: tuple[str, ...]
    device_id_strategy: str
    pass_device_specs: bool
    mps_root: str
    dev_root: str = "/"

    def resource(self, name: str) -> Resource:
        for r in self.resources:
            if r.name == name:
                return r
        raise KeyError(name)

    def allocate(self, resource: str, device_ids: Sequence[str], *, response_id: str = "",
                 exists: Callable[[str], bool] = lambda _path: False) -> ContainerAllocation:
        """One container's Allocate answer. `response_id` names the CDI annotation (upstream: a random
        UUID); `exists` tells which optional control device nodes exist where the plugin runs."""
        res = self.resource(resource)
        devices = [res.device(i) for i in device_ids]
        if res.sharing != "none" and res.fail_requests_greater_than_one and len(devices) > 1 and any(
                d.replica is not None for d in devices):
            raise AllocateError(f"invalid allocation request for {resource!r}: maximum request size for shared "
                                f"resources is 1; found {len(devices)}")
        ids = list(dict.fromkeys(d.base_id for d in devices))
        envs: dict[str, str] = {}
        mounts: list[Mount] = []
        nodes: list[DeviceNode] = []
        annotations: dict[str, str] = {}
        cdi: list[str] = []
        strategies = set(self.device_list_strategy)
        cdi_strategies = strategies & {"cdi-annotations", "cdi-cri"}
        if cdi_strategies and ids:
            names = [f"{CDI_VENDOR}/gpu={i}" for i in ids]
            if "cdi-annotations" in strategies:
                annotations[f"{CDI_ANNOTATION_PREFIX}{CDI_PLUGIN_NAME}_{response_id or uuid.uuid4()}"] = ",".join(names)
            if "cdi-cri" in strategies:
                cdi.extend(names)
        if res.sharing == "mps":
            pipe = f"{MPS_CONTAINER_ROOT}/{res.name}/pipe"
            envs["CUDA_MPS_PIPE_DIRECTORY"] = pipe
            mounts += [Mount(pipe, f"{self.mps_root}/{res.name}/pipe"),
                       Mount(MPS_SHM_IN_CONTAINER, f"{self.mps_root}/shm")]
        if cdi_strategies == strategies:
            return ContainerAllocation(envs, tuple(mounts), (), annotations, tuple(cdi))
        if "envvar" in strategies:
            envs[DEVICE_LIST_ENV] = ",".join(ids)
        if "volume-mounts" in strategies:
            envs[DEVICE_LIST_ENV] = VOLUME_MOUNTS_ROOT
            mounts += [Mount(f"{VOLUME_MOUNTS_ROOT}/{i}", VOLUME_MOUNTS_HOST_PATH) for i in ids]
        if self.pass_device_specs:
            paths = [p for p in CONTROL_DEVICE_NODES if exists(p)]
            paths += list(dict.fromkeys(f"/dev/nvidia{d.gpu_index}" for d in devices))
            root = self.dev_root.rstrip("/")
            nodes = [DeviceNode(p, f"{root}{p}") for p in paths]
        return ContainerAllocation(envs, tuple(mounts), tuple(nodes), annotations, tuple(cdi))

    def preferred(self, resource: str, available: Sequence[str], must_include: Sequence[str], size: int,
                  allocated: Iterable[str] = ()) -> list[str]:
        """GetPreferredAllocation for one container. `allocated`: device IDs of this resource already held
        by containers (the kubelet's view is `available`; upstream derives it from the same sets)."""
        res = self.resource(resource)
        for i in [*available, *must_include]:
            res.device(i)
        candidates = [i for i in available if i not in must_include]
        needed = size - len(must_include)
        if len(candidates) < needed:
            raise AllocateError("error getting list of preferred allocation devices: not enough available "
                                "devices to satisfy allocation")
        by_id = {d.id: d for d in res.devices}
        if all(by_id[i].replica is None for i in candidates):
            return [*must_include, *sorted(candidates, key=_natural)[:max(needed, 0)]]
        # greedyAlloc with the distributed comparator: fewest allocated replicas of the GPU first, then the
        # GPU this request took fewest from.
        free = set(available) - set(must_include)
        total: dict[str, int] = {}
        for d in res.devices:
            total[d.base_id] = total.get(d.base_id, 0) + 1
        left = {base: sum(1 for i in free if by_id[i].base_id == base) for base in total}
        picked: dict[str, int] = {}
        out = list(must_include)
        pool = sorted(candidates, key=_natural)
        for _ in range(needed):
            pool.sort(key=lambda i: (total[by_id[i].base_id] - left[by_id[i].base_id],
                                     picked.get(by_id[i].base_id, 0)))
            choice = pool.pop(0)
            base = by_id[choice].base_id
            picked[base] = picked.get(base, 0) + 1
            left[base] -= 1
            out.append(choice)
        return out

    def gpu_uuids(self) -> list[str]:
        return list(dict.fromkeys(d.gpu_uuid for r in self.resources for d in r.devices))


def _natural(device_id: str) -> tuple[Any, ...]:
    return tuple(int(p) if p.isdigit() else p for p in device_id.replace("::", ":").split(":"))


def _made_up_uuid(prefix: str, *parts: object) -> str:
    return f"{prefix}-{uuid.uuid5(UUID_NAMESPACE, '/'.join(str(p) for p in parts))}"


def node_plugin(spec: NodeSpec, sharing: ChartSharing, mps_root: str = "/run/nvidia/mps",
                gpu_seed: str | None = None, gpu_uuids: Sequence[str] | None = None) -> NodePlugin:
    """The stand-in for the node `spec` of a release whose device plugin inputs are `sharing` (the same
    derivation as fleet.plan: the resource names and counts agree with what the fleet publishes). The GPU
    UUIDs are `gpu_uuids` (a mock NVML profile's, to answer as the real plugin on it does), else made up, as
    the MIG UUIDs are, from `gpu_seed` (default: the node's name): another seed, other GPUs."""
    if spec.gpus <= 0:
        raise FleetError(f"node {spec.name}: no GPUs, no device plugin")
    model = GPU_MODELS[spec.model]
    config_name = spec.config if spec.config is not None else sharing.default_config
    if config_name not in sharing.configs:
        raise FleetError(f"node {spec.name}: device plugin config {config_name!r} is not in the chart's configs")
    config = sharing.configs[config_name]
    flags = config.get("flags") or {}
    plugin_flags = flags.get("plugin") or {}
    strategy = plugin_flags.get("deviceListStrategy") or ["volume-mounts"]
    id_strategy = str(plugin_flags.get("deviceIDStrategy") or "uuid")
    seed = gpu_seed if gpu_seed is not None else spec.name
    if gpu_uuids is not None and len(gpu_uuids) != spec.gpus:
        raise FleetError(f"node {spec.name}: {spec.gpus} GPUs but {len(gpu_uuids)} UUIDs")
    gpus = [(i, gpu_uuids[i] if gpu_uuids is not None else _made_up_uuid("GPU", seed, i)) for i in range(spec.gpus)]

    def gpu_id(index: int, gpu_uuid: str) -> str:
        return gpu_uuid if id_strategy == "uuid" else str(index)

    _, per_gpu = mig_layout(spec, model, sharing) if model.mig_capable else (None, {})
    resources: list[Resource] = []
    if per_gpu:
        mig = mig_strategy(config)
        by_resource: dict[str, list[Device]] = {}
        for index, gpu_uuid in gpus:
            mig_index = 0
            for profile, count in sorted(per_gpu.items()):
                name = FULL_GPU if mig == "single" else MIG_RESOURCE_PREFIX + profile
                for _ in range(count):
                    mig_uuid = _made_up_uuid("MIG", seed, index, mig_index)
                    device_id = mig_uuid if id_strategy == "uuid" else f"{index}:{mig_index}"
                    by_resource.setdefault(name, []).append(Device(device_id, index, gpu_uuid, device_id))
                    mig_index += 1
        resources = [Resource(name, tuple(devices)) for name, devices in sorted(by_resource.items())]
    else:
        shared = _sharing_of(config_name, config)
        section = (config.get("sharing") or {}).get("mps" if shared.strategy == "mps" else "timeSlicing") or {}
        devices: list[Device] = []
        for index, gpu_uuid in gpus:
            base = gpu_id(index, gpu_uuid)
            if shared.replicas > 1:
                devices += [Device(f"{base}::{n}", index, gpu_uuid, base, n) for n in range(shared.replicas)]
            else:
                devices.append(Device(base, index, gpu_uuid, base))
        resources = [Resource(shared.resource, tuple(devices), shared.strategy,
                              bool(section.get("failRequestsGreaterThanOne")))]
    return NodePlugin(node=spec.name, resources=tuple(resources),
                      device_list_strategy=tuple([strategy] if isinstance(strategy, str) else strategy),
                      device_id_strategy=id_strategy, pass_device_specs=bool(plugin_flags.get("passDeviceSpecs")),
                      mps_root=mps_root)


def mps_root_of(objects: Iterable[Mapping[str, Any]]) -> str:
    """MPS_ROOT of the device plugin container in a chart render (templates/device-plugin/daemonset.yaml)."""
    for o in objects:
        if o["kind"] == "DaemonSet" and o["metadata"]["name"].endswith("-device-plugin"):
            for container in o["spec"]["template"]["spec"]["containers"]:
                for env in container.get("env") or ():
                    if env["name"] == "MPS_ROOT":
                        return str(env["value"])
    raise FleetError("the render has no device plugin DaemonSet with MPS_ROOT")
