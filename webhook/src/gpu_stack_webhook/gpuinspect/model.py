"""What `gpu-stack-webhook inspect` knows about the cluster's GPUs: a pure model, no I/O.

`build_report(nodes, pods, sharing)` turns Node and Pod objects (plain dicts, as the API serves them)
and the device plugin configs the chart rendered into one record per GPU node:

- GPU product, memory and count from the GPU Feature Discovery labels (`nvidia.com/gpu.product`,
  `.memory` in MiB, `.count`); GFD appends `-SHARED` to the product when the GPU is replicated.
- Sharing as GFD labels it (`nvidia.com/gpu.sharing-strategy`, `.replicas`), the config the node label
  `nvidia.com/device-plugin.config` selects (else the default config), and per resource the strategy
  and replicas that config sets (parsed by `sharing.SharingIndex`, the webhook's own parser).
- MIG: GFD's `nvidia.com/mig.strategy`, and the MIG manager's `nvidia.com/mig.config` / `.config.state`.
- Every GPU resource (policy `gpuResources`: by default nvidia.com/gpu, nvidia.com/gpu.shared and
  nvidia.com/mig-<profile>; plus every name the sharing configs give) in the node's capacity or
  allocatable or requested by a pod on it: capacity, allocatable, requested (what the scheduler counts:
  `pod_requests`, summed over the pods bound to the node that have not finished) and free
  (allocatable - requested, the room the scheduler's NodeResourcesFit sees).
- MPS per-client limits: the MPS control daemon gives each of the N replicas of a GPU 1/N of its memory
  and 100/N percent of its threads (see tests/inspect/test_inspect_model.py for the upstream source).
- The pods holding them: every container that requests a GPU resource, in pods bound to the node that
  have not finished (Succeeded and Failed pods hold nothing).
- DRA devices (dra.py): what the NVIDIA DRA driver publishes for the node, and who holds each.

The chart's Grafana dashboards are read by dashboards.py. The records and their `-o json` / `-o yaml`
shape (versioned, inspect-v1.schema.json) are in records.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import yaml

from gpu_stack_webhook.gpuinspect.dra import dra_devices
from gpu_stack_webhook.gpuinspect.fields import as_dict, as_int, as_quantity
from gpu_stack_webhook.gpuinspect.records import Dashboards, Holder, MpsLimits, NodeRecord, Report, ResourceUse
from gpu_stack_webhook.policy.config import ConfigError, DevicePluginConfig, GpuResources, PolicyConfig, SharingConfigs
from gpu_stack_webhook.policy.sharing import NodeConfig, SharingIndex

CONFIG_LABEL = "nvidia.com/device-plugin.config"
GPU = "nvidia.com/gpu"
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})
# Labels that mark a node as a GPU node even before the device plugin advertises anything.
GPU_NODE_LABELS = ("nvidia.com/gpu.present", "nvidia.com/gpu.product", "nvidia.com/gpu.count")


# --- the device plugin configs --------------------------------------------------------------------------


def sharing_from_configmap(data: Mapping[str, str], default_config: str | None = None) -> SharingIndex:
    """The SharingIndex of the chart's device plugin ConfigMap (one config file per key). Without a
    known default, a single config is the default; otherwise the first name."""
    try:
        configs = {name: DevicePluginConfig.model_validate(yaml.safe_load(text) or {})
                   for name, text in sorted(data.items())}
    except (yaml.YAMLError, ValueError) as exc:
        raise ConfigError(f"device plugin config is not valid: {exc}") from None
    if not configs:
        raise ConfigError("the device plugin ConfigMap holds no config")
    default = default_config if default_config in configs else next(iter(configs))
    return SharingIndex(PolicyConfig(sharing=SharingConfigs(configs=configs, default_config=default)))


# --- building -----------------------------------------------------------------------------------------


def _containers(spec: Mapping[str, Any]) -> Iterable[tuple[str, str, Mapping[str, Any]]]:
    """(container type, name, requests) of every container that can hold a device."""
    for c in spec.get("initContainers") or []:
        kind = "sidecar" if c.get("restartPolicy") == "Always" else "initContainer"
        yield kind, str(c.get("name", "")), _requests(c)
    for c in spec.get("containers") or []:
        yield "container", str(c.get("name", "")), _requests(c)


def _requests(container: Mapping[str, Any]) -> dict[str, int]:
    # Extended resources cannot be overcommitted: the request is the limit, and a limit alone is the request.
    resources = as_dict(container.get("resources"))
    merged = {**as_dict(resources.get("limits")), **as_dict(resources.get("requests"))}
    return {name: as_quantity(v) for name, v in merged.items()}


def pod_requests(spec: Mapping[str, Any], is_gpu: Callable[[str], bool]) -> dict[str, int]:
    """What the scheduler counts against the node for each GPU resource (k8s.io/component-helpers
    resource/helpers.go PodRequests, which the NodeResourcesFit plugin and the scheduler cache use): the
    larger of the sum over containers and sidecars, and each init container plus the sidecars started
    before it; then the pod overhead (spec.overhead, from its RuntimeClass) on top."""
    total: dict[str, int] = {}
    peak: dict[str, int] = {}
    sidecars: dict[str, int] = {}
    for kind, _, requests in _containers(spec):
        for name, amount in requests.items():
            if not is_gpu(name):
                continue
            if kind == "initContainer":
                peak[name] = max(peak.get(name, 0), amount + sidecars.get(name, 0))
            else:
                total[name] = total.get(name, 0) + amount
                if kind == "sidecar":
                    sidecars[name] = sidecars.get(name, 0) + amount
    merged = {n: max(total.get(n, 0), peak.get(n, 0)) for n in set(total) | set(peak)}
    for name, amount in as_dict(spec.get("overhead")).items():
        if is_gpu(name):
            merged[name] = merged.get(name, 0) + as_quantity(amount)
    return {n: amount for n, amount in sorted(merged.items()) if amount}


def _is_gpu_node(labels: Mapping[str, str], gpu_resources: Iterable[str]) -> bool:
    return any(labels.get(k) not in (None, "", "false") for k in GPU_NODE_LABELS) or any(True for _ in gpu_resources)


def _memory_label(labels: Mapping[str, str], resource: str) -> int | None:
    own = as_int(labels.get(f"{resource}.memory"))
    return own if own is not None else as_int(labels.get(f"{GPU}.memory"))


def _resource_use(name: str, node_labels: Mapping[str, str], advertised: tuple[Mapping[str, Any], Mapping[str, Any]],
                  requested: int, config: NodeConfig | None) -> ResourceUse:
    strategy: str | None = None
    replicas: int | None = None
    exposed = config.lookup(name) if config is not None else None
    if exposed is not None:
        strategy, replicas = exposed.strategy.value, exposed.replicas
    elif config is None and f"{name}.sharing-strategy" in node_labels:  # no ConfigMap: what GFD says
        label = node_labels[f"{name}.sharing-strategy"]
        strategy = "exclusive" if label in ("none", "") else label
        replicas = as_int(node_labels.get(f"{name}.replicas"))
    mps = None
    if strategy == "mps" and replicas:
        memory = _memory_label(node_labels, name)
        mps = MpsLimits(None if memory is None else memory // replicas, 100 // replicas)
    capacity, allocatable = advertised
    return ResourceUse(name, as_quantity(capacity.get(name, 0)), as_quantity(allocatable.get(name, 0)), requested,
                       strategy, replicas, mps)


def _node_config(labels: Mapping[str, str], sharing: SharingIndex | None) -> tuple[NodeConfig | None, list[str]]:
    if sharing is None:
        return None, []
    chosen = labels.get(sharing.label)
    if chosen is None:
        return sharing.configs[sharing.default], []
    if chosen in sharing.configs:
        return sharing.configs[chosen], []
    return sharing.configs[sharing.default], [
        f"{sharing.label}={chosen} names no config; the device plugin falls back to {sharing.default!r}"]


def _node_notes(labels: Mapping[str, str], resources: Iterable[ResourceUse],
                holding: Mapping[str, Sequence[str]]) -> list[str]:
    """`holding`: resource -> namespace/name of the node's pods that hold some of it (every namespace)."""
    notes = []
    state = labels.get("nvidia.com/mig.config.state")
    if state and state != "success":
        notes.append(f"MIG reconfiguration to {labels.get('nvidia.com/mig.config', '?')!r} is {state}")
    for res in resources:
        if res.free < 0:
            notes.append(f"{res.name}: pods request {res.requested}, {res.allocatable} allocatable")
        if res.unhealthy:
            pods = holding.get(res.name, ())
            gone = " (or its device plugin no longer advertises it)" if res.allocatable == 0 else ""
            held = (f"still held by {', '.join(pods)} (the API does not say which pod has which device)" if pods
                    else "no pod holds one")
            notes.append(f"{res.name}: {res.unhealthy} of {res.capacity} unhealthy{gone}; {held}")
    return notes


def build_report(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
                 sharing: SharingIndex | None = None, *, gpu_resources: GpuResources | None = None,
                 holder_namespace: str | None = None, notes: Iterable[str] = (),
                 dashboards: Dashboards | None = None, resource_slices: Iterable[Mapping[str, Any]] = (),
                 resource_claims: Iterable[Mapping[str, Any]] = ()) -> Report:
    """One record per GPU node, sorted by name. Pods on nodes not given are ignored; with
    `holder_namespace` only that namespace's pods are listed as holders (all pods still count)."""
    # Names a sharing config gives (renames, <name>.shared) are GPUs too, as for the webhook's rules.
    is_gpu = (gpu_resources.is_gpu if gpu_resources is not None else
              sharing.is_gpu if sharing is not None else GpuResources().is_gpu)
    by_node: dict[str, list[Mapping[str, Any]]] = {}
    for pod in pods:
        node_name = as_dict(pod.get("spec")).get("nodeName")
        if node_name and as_dict(pod.get("status")).get("phase") not in FINISHED_PHASES:
            by_node.setdefault(node_name, []).append(pod)
    dra = dra_devices(resource_slices, resource_claims)
    records, other = [], 0
    for node in sorted(nodes, key=lambda n: str(as_dict(n.get("metadata")).get("name", ""))):
        meta, status = as_dict(node.get("metadata")), as_dict(node.get("status"))
        labels = {str(k): str(v) for k, v in as_dict(meta.get("labels")).items()}
        capacity, allocatable = as_dict(status.get("capacity")), as_dict(status.get("allocatable"))
        name = str(meta.get("name", ""))
        requested: dict[str, int] = {}
        holding: dict[str, list[str]] = {}
        holders: list[Holder] = []
        for pod in sorted(by_node.get(name, []), key=_pod_key):
            pmeta, spec = as_dict(pod.get("metadata")), as_dict(pod.get("spec"))
            for res, amount in pod_requests(spec, is_gpu).items():
                requested[res] = requested.get(res, 0) + amount
                holding.setdefault(res, []).append(f"{pmeta.get('namespace', '')}/{pmeta.get('name', '')}")
            if holder_namespace is not None and pmeta.get("namespace") != holder_namespace:
                continue
            phase = str(as_dict(pod.get("status")).get("phase") or "Unknown")
            holders.extend(
                Holder(str(pmeta.get("namespace", "")), str(pmeta.get("name", "")), cname, kind, res, amount, phase)
                for kind, cname, reqs in _containers(spec) for res, amount in reqs.items() if is_gpu(res) and amount)
        names = sorted({n for n in (*capacity, *allocatable) if is_gpu(n)} | set(requested))
        if not _is_gpu_node(labels, names) and name not in dra:
            other += 1
            continue
        config, node_notes = _node_config(labels, sharing)
        resources = tuple(_resource_use(n, labels, (capacity, allocatable), requested.get(n, 0), config) for n in names)
        records.append(NodeRecord(
            name=name,
            product=labels.get(f"{GPU}.product"),
            memory_mib=as_int(labels.get(f"{GPU}.memory")),
            gpu_count=as_int(labels.get(f"{GPU}.count")),
            sharing_strategy=labels.get(f"{GPU}.sharing-strategy"),
            replicas=as_int(labels.get(f"{GPU}.replicas")),
            config_label=labels.get(CONFIG_LABEL),
            config=config.name if config is not None else None,
            mig_strategy=labels.get("nvidia.com/mig.strategy"),
            mig_config=labels.get("nvidia.com/mig.config"),
            mig_state=labels.get("nvidia.com/mig.config.state"),
            resources=resources,
            holders=tuple(holders),
            notes=tuple(node_notes + _node_notes(labels, resources, holding)),
            dra=tuple(dra.get(name, ())),
        ))
    return Report(nodes=tuple(records), other_nodes=other, notes=tuple(notes), holder_namespace=holder_namespace,
                  dashboards=dashboards)


def _pod_key(pod: Mapping[str, Any]) -> tuple[str, str]:
    meta = as_dict(pod.get("metadata"))
    return str(meta.get("namespace", "")), str(meta.get("name", ""))
