"""`kubectl gpu-stack inspect` shows the scheduler's truth on a fleet the real kube-scheduler binds pods to.

A fleet (fleet.py) published as the chart's agents would for Chart-values-examples/per-node-configs.yaml:
an exclusive node, a time-sliced node (nvidia.com/gpu x4 replicas), a time-sliced node of a release with
renameByDefault (nvidia.com/gpu.shared), and, published by hand here because fleet.py does not model MIG
(its FleetError), a node advertising MIG mixed-strategy resources. Pods are pinned to a node each (a
nodeSelector on kubernetes.io/hostname) with init containers, a sidecar, limits alone, requests and limits,
a RuntimeClass overhead; the scheduler binds the ones that fit and leaves the others Pending
("Insufficient ..."); one is bound and then finished (status.phase Succeeded, as a kubelet would report).

What inspect prints per node and resource (table and `-o json`) must equal what `scheduler_view` computes
from the API objects as the scheduler does (allocatable minus the effective requests of the bound,
unfinished pods; k8s.io/component-helpers resource/helpers.go PodRequests, written out again here so the
test does not check the model against itself), and agree with the scheduler's own verdicts: every pod it
left Pending asks for more than inspect says is free; no Pending or finished pod is listed anywhere.

DRA: a node whose GPUs come only from a ResourceSlice of the NVIDIA DRA driver, a DeviceClass, and a pod with a
ResourceClaimTemplate: the controller manager makes the claim, the scheduler allocates a device and binds the
pod, and inspect shows that device with the claim and the pod, the other one free."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from gpu_stack_dev.e2e.e2elib import E2ECluster, unique
from gpu_stack_dev.e2e.fleet import (
    NODE_BASE,
    ChartSharing,
    Fleet,
    NodeSpec,
    PublishedNode,
    delete_pods,
    plan,
    wait_scheduled,
)
from kubernetes import client

from .inspect_api import inspect

pytestmark = pytest.mark.e2e
GPU, SHARED = "nvidia.com/gpu", "nvidia.com/gpu.shared"
MIG_1G, MIG_2G, MIG_3G = "nvidia.com/mig-1g.5gb", "nvidia.com/mig-2g.10gb", "nvidia.com/mig-3g.20gb"
OVERLAY = "per-node-configs.yaml"
IMAGE = "nvcr.io/nvidia/cuda:12.9.1-base-ubuntu24.04"


def mig_node(name: str) -> PublishedNode:
    """An A100 40GB under the chart's mig-mixed config with the MIG manager's all-balanced layout (2x 1g.5gb,
    1x 2g.10gb, 1x 3g.20gb), as gpu_stack_dev.inspect_cluster describes it (GFD mixed-strategy labels,
    k8s-device-plugin v0.20.0 internal/lm/resource.go; the MIG-enabled GPU is not advertised as nvidia.com/gpu)."""
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
              "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
              "nvidia.com/gpu.count": "1", "nvidia.com/gpu.memory": "40960", "nvidia.com/mig.capable": "true",
              "nvidia.com/mig.strategy": "mixed", "nvidia.com/device-plugin.config": "mig-mixed",
              "nvidia.com/mig.config": "all-balanced", "nvidia.com/mig.config.state": "success"}
    for resource, count in ((MIG_1G, 2), (MIG_2G, 1), (MIG_3G, 1)):
        labels[f"{resource}.count"] = str(count)
    return PublishedNode(name, labels, (), {**NODE_BASE, MIG_1G: "2", MIG_2G: "1", MIG_3G: "1"})


# --- the scheduler's arithmetic, from the API objects -------------------------------------------------


def effective_request(pod: Mapping[str, Any], resource: str) -> int:
    """component-helpers resource/helpers.go PodRequests for one extended resource: app containers and
    restartable (sidecar) init containers add up; each other init container runs beside the sidecars
    started before it; the larger of the two, then spec.overhead on top. The API server has already
    defaulted a limit alone into the request (extended resources: request == limit)."""
    spec = pod["spec"]

    def amount(container: Mapping[str, Any]) -> int:
        return int((container.get("resources") or {}).get("requests", {}).get(resource, 0))

    total = sum(amount(c) for c in spec["containers"])
    sidecars = peak = 0
    for init in spec.get("initContainers") or []:
        if init.get("restartPolicy") == "Always":
            total += amount(init)
            sidecars += amount(init)
        else:
            peak = max(peak, amount(init) + sidecars)
    return max(total, peak) + int((spec.get("overhead") or {}).get(resource, 0))


def scheduler_view(nodes: Mapping[str, Mapping[str, Any]], pods: list[Mapping[str, Any]]
                   ) -> dict[str, dict[str, tuple[int, int, int, int]]]:
    """node -> resource -> (capacity, allocatable, requested, free) for the nvidia.com/ resources."""
    view: dict[str, dict[str, tuple[int, int, int, int]]] = {}
    for name, node in nodes.items():
        capacity, allocatable = node["status"]["capacity"], node["status"]["allocatable"]
        bound = [p for p in pods if p["spec"].get("nodeName") == name
                 and p["status"].get("phase") not in ("Succeeded", "Failed")]
        view[name] = {}
        for resource in sorted(r for r in allocatable if r.startswith("nvidia.com/")):
            requested = sum(effective_request(p, resource) for p in bound)
            view[name][resource] = (int(capacity[resource]), int(allocatable[resource]), requested,
                                    int(allocatable[resource]) - requested)
    return view


def table_view(table: str) -> dict[str, dict[str, tuple[int, int, int, int]]]:
    """The same, read from inspect's table: a section per node, its RESOURCE rows."""
    view: dict[str, dict[str, tuple[int, int, int, int]]] = {}
    for section in table.split("\n\n"):
        lines = section.splitlines()
        if not lines or lines[0].startswith(" ") or len(lines) < 3:
            continue
        rows: dict[str, tuple[int, int, int, int]] = {}
        in_resources = False
        for line in lines[1:]:
            cells = line.split()
            if cells[:1] == ["RESOURCE"]:
                in_resources = True
            elif in_resources and len(cells) == 5 and cells[0].startswith("nvidia.com/"):
                rows[cells[0]] = (int(cells[1]), int(cells[2]), int(cells[3]), int(cells[4]))
            else:
                in_resources = False
        view[lines[0].split()[0]] = rows
    return view


def json_view(doc: Mapping[str, Any]) -> dict[str, dict[str, tuple[int, int, int, int]]]:
    return {n["name"]: {r["name"]: (r["capacity"], r["allocatable"], r["requested"], r["free"])
                        for r in n["resources"]} for n in doc["nodes"]}


# --- the pods ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Want:
    pod: dict[str, Any]
    bound: bool  # what the scheduler must decide


def container(name: str, limits: Mapping[str, int] | None = None, requests: bool = False,
              restart_always: bool = False) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": IMAGE}
    if limits:
        quantities = {k: str(v) for k, v in limits.items()}
        c["resources"] = {"limits": quantities, **({"requests": dict(quantities)} if requests else {})}
    if restart_always:
        c["restartPolicy"] = "Always"
    return c


def pinned(fleet: Fleet, name: str, node: str, containers: list[dict[str, Any]],
           init: list[dict[str, Any]] | None = None, runtime_class: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"restartPolicy": "Never", "tolerations": [fleet.toleration],
                            "nodeSelector": {"kubernetes.io/hostname": node}, "containers": containers}
    if init:
        spec["initContainers"] = init
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


@dataclass(frozen=True)
class Plane:
    namespace: str
    fleet: Fleet
    nodes: dict[str, str]  # role -> node name
    pending: tuple[str, ...]
    finished: str


@pytest.fixture(scope="module")
def bound_fleet(cluster: E2ECluster) -> Iterator[Plane]:
    names = {role: unique(f"insp-{role}") for role in ("ex", "ts", "sh", "mig")}
    sharing = ChartSharing.render(cluster.helm, OVERLAY)
    renamed = ChartSharing.render(cluster.helm, OVERLAY,
                                  set_json={"sharing.configs.ts-x4.timeSlicing.renameByDefault": True})
    specs = [NodeSpec(names["ex"], gpus=3), NodeSpec(names["ts"], gpus=1, config="ts-x4")]
    namespace = cluster.create_namespace()
    runtime_class = unique("insp-overhead")
    with Fleet(cluster, sharing, specs) as fleet:
        try:
            fleet.publish(plan(NodeSpec(names["sh"], gpus=1, config="ts-x4"), renamed))
            fleet.publish(mig_node(names["mig"]))
            # A RuntimeClass whose fixed pod overhead includes a GPU: the RuntimeClass admission plugin
            # copies it into spec.overhead, and the scheduler adds it after the init-container maximum.
            cluster.kubectl("create", "-f", "-", input=json.dumps({
                "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": runtime_class},
                "handler": "runc", "overhead": {"podFixed": {GPU: "1", "cpu": "100m"}}}))
            yield _schedule(cluster, namespace, fleet, names, runtime_class)
        finally:
            delete_pods(cluster, namespace)
            cluster.kubectl("delete", "namespace", namespace, "--wait=false")
            cluster.kubectl("delete", "runtimeclass", runtime_class, "--ignore-not-found")


def _create(cluster: E2ECluster, namespace: str, pod: Mapping[str, Any]) -> None:
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(pod))


def _schedule(cluster: E2ECluster, namespace: str, fleet: Fleet, names: Mapping[str, str],
              runtime_class: str) -> Plane:
    ex, ts, sh, mig = (names[r] for r in ("ex", "ts", "sh", "mig"))
    # Bound first, then finished as its kubelet would report: it holds nothing any more.
    _create(cluster, namespace, pinned(fleet, "ex-done", ex, [container("job", {GPU: 2})]))
    assert wait_scheduled(cluster, namespace, "ex-done")[0] == "True"
    client.CoreV1Api(cluster.kubernetes).patch_namespaced_pod_status(
        "ex-done", namespace, {"status": {"phase": "Succeeded"}})
    wants = [
        # ex, 3 exclusive GPUs: an init container of 2 beside 1 app GPU counts 2, plus the overhead's 1 = 3.
        Want(pinned(fleet, "ex-overhead", ex, [container("main", {GPU: 1})], init=[container("setup", {GPU: 2})],
                    runtime_class=runtime_class), bound=True),
        # ts, 1 T4 x4 replicas: 1 + (sidecar 1 + app 1, the init container's 1 runs alone) + 1 = 4, full.
        Want(pinned(fleet, "ts-one", ts, [container("c", {GPU: 1})]), bound=True),
        Want(pinned(fleet, "ts-sidecar", ts, [container("app", {GPU: 1})],
                    init=[container("fetch", {GPU: 1}), container("proxy", {GPU: 1}, restart_always=True)]),
             bound=True),
        Want(pinned(fleet, "ts-two", ts, [container("c", {GPU: 1}, requests=True)]), bound=True),
        # sh, 1 T4 x4 as nvidia.com/gpu.shared: 3 taken, 1 free.
        Want(pinned(fleet, "sh-three", sh, [container("a", {SHARED: 2}), container("b", {SHARED: 1})]), bound=True),
        # mig: one 1g.5gb and the 3g.20gb in one pod, the 2g.10gb in another.
        Want(pinned(fleet, "mig-a", mig, [container("small", {MIG_1G: 1}), container("big", {MIG_3G: 1})]),
             bound=True),
        Want(pinned(fleet, "mig-b", mig, [container("mid", {MIG_2G: 1}, requests=True)]), bound=True),
    ]
    pending = [
        Want(pinned(fleet, "ex-wait", ex, [container("c", {GPU: 1})]), bound=False),
        Want(pinned(fleet, "ts-wait", ts, [container("c", {GPU: 1})]), bound=False),
        Want(pinned(fleet, "sh-wait", sh, [container("c", {SHARED: 2})]), bound=False),
        Want(pinned(fleet, "mig-wait", mig, [container("c", {MIG_3G: 1})]), bound=False),
    ]
    for want in wants:  # every bound pod in place before the ones that must wait are created
        _create(cluster, namespace, want.pod)
    for want in wants:
        status, message, _ = wait_scheduled(cluster, namespace, want.pod["metadata"]["name"])
        assert status == "True", (want.pod["metadata"]["name"], message)
    for want in pending:
        _create(cluster, namespace, want.pod)
    for want in pending:
        status, message, node = wait_scheduled(cluster, namespace, want.pod["metadata"]["name"], want="False")
        assert (status, node) == ("False", ""), (want.pod["metadata"]["name"], message)
        assert "Insufficient nvidia.com/" in message, message
    return Plane(namespace, fleet, dict(names), tuple(w.pod["metadata"]["name"] for w in pending), "ex-done")


def _api_objects(cluster: E2ECluster, plane: Plane) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    nodes = {n: cluster.get_json("node", n) for n in plane.nodes.values()}
    pods = cluster.get_json("pods", "--all-namespaces")["items"]
    return nodes, pods


def _inspect_args(plane: Plane) -> list[str]:
    return [arg for name in plane.nodes.values() for arg in ("--node", name)]


def test_table_and_json_are_the_schedulers_arithmetic(cluster: E2ECluster, bound_fleet: Plane) -> None:
    nodes, pods = _api_objects(cluster, bound_fleet)
    expected = scheduler_view(nodes, pods)
    n = bound_fleet.nodes
    # The numbers the pods above were written for (so a wrong scheduler_view cannot pass unnoticed).
    assert expected == {
        n["ex"]: {GPU: (3, 3, 3, 0)},
        n["ts"]: {GPU: (4, 4, 4, 0)},
        n["sh"]: {SHARED: (4, 4, 3, 1)},
        n["mig"]: {MIG_1G: (2, 2, 1, 1), MIG_2G: (1, 1, 1, 0), MIG_3G: (1, 1, 1, 0)},
    }
    table = inspect(*_inspect_args(bound_fleet), kubeconfig=cluster.kubeconfig)
    assert table.returncode == 0, table.stderr
    assert table_view(table.stdout) == expected, table.stdout
    as_json = inspect(*_inspect_args(bound_fleet), "-o", "json", kubeconfig=cluster.kubeconfig)
    assert as_json.returncode == 0, as_json.stderr
    doc = json.loads(as_json.stdout)
    assert json_view(doc) == expected
    totals = {r["name"]: (r["allocatable"], r["requested"], r["free"]) for r in doc["summary"]["resources"]}
    assert totals == {GPU: (7, 7, 0), SHARED: (4, 3, 1), MIG_1G: (2, 1, 1), MIG_2G: (1, 1, 0), MIG_3G: (1, 1, 0)}


def test_pending_and_finished_pods_count_nowhere(cluster: E2ECluster, bound_fleet: Plane) -> None:
    result = inspect(*_inspect_args(bound_fleet), "-o", "json", kubeconfig=cluster.kubeconfig)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    holders = {n["name"]: sorted({p["name"] for p in n["pods"]}) for n in doc["nodes"]}
    n = bound_fleet.nodes
    assert holders == {n["ex"]: ["ex-overhead"], n["ts"]: ["ts-one", "ts-sidecar", "ts-two"],
                       n["sh"]: ["sh-three"], n["mig"]: ["mig-a", "mig-b"]}
    # The scheduler's own verdicts agree with inspect's free: each pod it left Pending asks for more than
    # inspect says is free on the node it is pinned to.
    free = json_view(doc)
    _, pods = _api_objects(cluster, bound_fleet)
    for pod in (p for p in pods if p["metadata"]["name"] in bound_fleet.pending
                and p["metadata"]["namespace"] == bound_fleet.namespace):
        node = pod["spec"]["nodeSelector"]["kubernetes.io/hostname"]
        asked = {r: effective_request(pod, r) for r in free[node]}
        assert any(amount > free[node][r][3] for r, amount in asked.items() if amount), (pod["metadata"]["name"],
                                                                                        free[node])
    done = next(p for p in pods if p["metadata"]["name"] == bound_fleet.finished
                and p["metadata"]["namespace"] == bound_fleet.namespace)
    assert (done["spec"]["nodeName"], done["status"]["phase"]) == (n["ex"], "Succeeded")


# --- DRA: a GPU the scheduler allocates through a ResourceClaim -------------------------------------------

DRA_DRIVER = "gpu.nvidia.com"
DEVICE_CLASS = "gpu.nvidia.com"
GPU_SELECTOR = f'device.driver == "{DRA_DRIVER}" && device.attributes["{DRA_DRIVER}"].type == "gpu"'


def dra_slice(node: str) -> dict[str, Any]:
    """What kubernetes-sigs/dra-driver-nvidia-gpu's gpu-kubelet-plugin publishes for a node with two A100s
    (main at 0.5.0-dev, the newest the source snapshot here has; no v0.5.0 tag yet): DynamicMIG off, one
    ResourceSlice, pool named after the node (cmd/gpu-kubelet-plugin/driver.go publishResources), devices
    gpu-<minor> with the attributes of deviceinfo.go GpuInfo.Attributes and the memory capacity of
    partitions.go fullGpuCapacity."""
    def gpu(minor: int) -> dict[str, Any]:
        return {"name": f"gpu-{minor}",
                "attributes": {"type": {"string": "gpu"}, "uuid": {"string": f"GPU-{uuid_of(node, minor)}"},
                               "productName": {"string": "NVIDIA A100-SXM4-40GB"}, "brand": {"string": "Nvidia"},
                               "architecture": {"string": "Ampere"}, "cudaComputeCapability": {"version": "8.0.0"},
                               "driverVersion": {"version": "580.95.5"}, "cudaDriverVersion": {"version": "13.0.0"}},
                "capacity": {"memory": {"value": "40Gi"}}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"generateName": f"{node}-{DRA_DRIVER}-"},
            "spec": {"driver": DRA_DRIVER, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [gpu(0), gpu(1)]}}


def uuid_of(node: str, minor: int) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{node}/{minor}"))


@dataclass(frozen=True)
class DraPlane:
    namespace: str
    node: str
    pod: str


@pytest.fixture(scope="module")
def dra_pod(cluster: E2ECluster) -> Iterator[DraPlane]:
    node = unique("insp-dra")
    namespace = cluster.create_namespace()
    sharing = ChartSharing.render(cluster.helm, OVERLAY)
    made_class = False
    with Fleet(cluster, sharing, [NodeSpec(node)]) as fleet:  # no device plugin: its GPUs come through DRA
        slice_name = ""
        try:
            # The DeviceClass the driver's chart ships (deployments/helm/.../deviceclass-gpu.yaml), without its
            # extendedResourceName: on this shared plane nvidia.com/gpu must stay the device plugin's.
            device_class = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                            "metadata": {"name": DEVICE_CLASS},
                            "spec": {"selectors": [{"cel": {"expression": GPU_SELECTOR}}]}}
            made_class = cluster.kubectl("create", "-f", "-", input=json.dumps(device_class),
                                         check=False).returncode == 0
            slice_name = cluster.kubectl("create", "-o", "name", "-f", "-",
                                         input=json.dumps(dra_slice(node))).stdout.strip()
            template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                        "metadata": {"name": "one-gpu"},
                        "spec": {"spec": {"devices": {"requests": [
                            {"name": "gpu", "exactly": {"deviceClassName": DEVICE_CLASS}}]}}}}
            _create(cluster, namespace, template)
            pod = pinned(fleet, "dra-trainer", node, [{"name": "train", "image": IMAGE,
                                                       "resources": {"claims": [{"name": "gpu"}]}}])
            pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
            _create(cluster, namespace, pod)
            status, message, bound_to = wait_scheduled(cluster, namespace, "dra-trainer")
            assert (status, bound_to) == ("True", node), message
            yield DraPlane(namespace, node, "dra-trainer")
        finally:
            delete_pods(cluster, namespace)
            cluster.kubectl("delete", "namespace", namespace, "--wait=false")
            if slice_name:
                cluster.kubectl("delete", slice_name, "--ignore-not-found")
            if made_class:
                cluster.kubectl("delete", "deviceclass", DEVICE_CLASS, "--ignore-not-found")


def test_dra_gpu_allocated_by_the_scheduler_is_shown_with_its_claim_and_pod(
        cluster: E2ECluster, dra_pod: DraPlane) -> None:
    # The claim the ResourceClaim controller made from the template, as the scheduler allocated it.
    pod = cluster.get_json("pod", dra_pod.pod, "-n", dra_pod.namespace)
    (claim_status,) = pod["status"]["resourceClaimStatuses"]
    claim = cluster.get_json("resourceclaim", claim_status["resourceClaimName"], "-n", dra_pod.namespace)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"]) == (DRA_DRIVER, dra_pod.node)
    assert [r["name"] for r in claim["status"]["reservedFor"]] == [dra_pod.pod]
    claim_name = f"{dra_pod.namespace}/{claim['metadata']['name']}"

    result_json = inspect("--node", dra_pod.node, "-o", "json", kubeconfig=cluster.kubeconfig)
    assert result_json.returncode == 0, result_json.stderr
    doc = json.loads(result_json.stdout)
    (node,) = doc["nodes"]
    expected = [{"driver": DRA_DRIVER, "pool": dra_pod.node, "name": f"gpu-{i}", "type": "gpu",
                 "product": "NVIDIA A100-SXM4-40GB",
                 "claim": claim_name if f"gpu-{i}" == result["device"] else None,
                 "pods": [f"{dra_pod.namespace}/{dra_pod.pod}"] if f"gpu-{i}" == result["device"] else []}
                for i in (0, 1)]
    assert node["draDevices"] == expected
    assert node["resources"] == [] and node["pods"] == []  # nothing through the device plugin
    assert doc["summary"]["draDevices"] == {"published": 2, "allocated": 1, "free": 1}

    table = inspect("--node", dra_pod.node, kubeconfig=cluster.kubeconfig)
    assert table.returncode == 0, table.stderr
    rows = {line.split()[0]: line.split() for line in table.stdout.splitlines() if line.startswith("  gpu-")}
    free = "gpu-1" if result["device"] == "gpu-0" else "gpu-0"
    assert rows[result["device"]][-2:] == [claim_name, f"{dra_pod.namespace}/{dra_pod.pod}"]
    assert rows[free][-2:] == ["free", "-"]
    assert "; DRA devices free: 1/2;" in table.stdout
