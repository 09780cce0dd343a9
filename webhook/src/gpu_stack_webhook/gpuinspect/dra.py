"""DRA GPUs as inspect reports them: what the NVIDIA DRA driver publishes for each node in ResourceSlices,
and the ResourceClaim (and its pods) each device is allocated to."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpu_stack_webhook.gpuinspect.fields import as_dict, as_int
from gpu_stack_webhook.gpuinspect.records import DraDevice

# The NVIDIA DRA driver's GPUs (kubernetes-sigs/dra-driver-nvidia-gpu, cmd/gpu-kubelet-plugin: DriverName).
DRA_DRIVERS = ("gpu.nvidia.com",)


def _attribute(device: Mapping[str, Any], name: str) -> str | None:
    value = as_dict(as_dict(device.get("attributes")).get(name))
    for kind in ("string", "version", "int", "bool"):
        if kind in value:
            return str(value[kind])
    return None


def dra_devices(slices: Iterable[Mapping[str, Any]], claims: Iterable[Mapping[str, Any]],
                drivers: Iterable[str] = DRA_DRIVERS) -> dict[str, list[DraDevice]]:
    """node -> the DRA devices of `drivers` published for it, each with the ResourceClaim allocated to it.

    As the scheduler reads them (resource.k8s.io/v1): a slice belongs to a node by spec.nodeName; of a pool
    only the slices of its newest spec.pool.generation count; a device is allocated when a claim's
    status.allocation.devices.results names its driver, pool and device; the claim's status.reservedFor
    lists the pods using it."""
    wanted = set(drivers)
    node_slices = [s for s in slices if as_dict(s.get("spec")).get("driver") in wanted
                   and as_dict(s.get("spec")).get("nodeName")]
    newest: dict[tuple[str, str], int] = {}
    for sl in node_slices:
        spec = as_dict(sl.get("spec"))
        key = (str(spec["driver"]), str(as_dict(spec.get("pool")).get("name", "")))
        newest[key] = max(newest.get(key, 0), as_int(as_dict(spec.get("pool")).get("generation")) or 0)
    holders: dict[tuple[str, str, str], tuple[str, tuple[str, ...]]] = {}
    for claim in claims:
        meta, status = as_dict(claim.get("metadata")), as_dict(claim.get("status"))
        name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        pods = tuple(sorted(f"{meta.get('namespace', '')}/{r.get('name', '')}"
                            for r in status.get("reservedFor") or [] if as_dict(r).get("resource") == "pods"))
        for entry in as_dict(as_dict(status.get("allocation")).get("devices")).get("results") or []:
            result = as_dict(entry)
            holders[(str(result.get("driver")), str(result.get("pool")), str(result.get("device")))] = (name, pods)
    by_node: dict[str, list[DraDevice]] = {}
    for sl in node_slices:
        spec = as_dict(sl.get("spec"))
        driver, pool = str(spec["driver"]), as_dict(spec.get("pool"))
        pool_name = str(pool.get("name", ""))
        if (as_int(pool.get("generation")) or 0) < newest[(driver, pool_name)]:
            continue  # an older generation of the pool, being replaced: the scheduler ignores it
        for entry in spec.get("devices") or []:
            device = as_dict(entry)
            name = str(device.get("name", ""))
            holder, pods = holders.get((driver, pool_name, name), (None, ()))
            by_node.setdefault(str(spec["nodeName"]), []).append(DraDevice(
                driver, pool_name, name, _attribute(device, "type"), _attribute(device, "productName"), holder, pods))
    return {node: sorted(devices, key=lambda d: (d.driver, d.pool, d.name)) for node, devices in by_node.items()}
