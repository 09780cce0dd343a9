"""GPUs from Dynamic Resource Allocation on the real kube-scheduler: the chart's DeviceClasses (from its
render with dra.enabled), DRA GPU nodes with the ResourceSlices the driver's kubelet plugin publishes
(dra_fleet.py), and pods written as Chart-values-examples/dra.yaml shows. The kube-controller-manager's
resourceclaim controller makes each pod's claim from its template, the scheduler allocates devices and
binds. Then the chart's ResourceSlice admission policy, run by the API server for the kubelet plugin's
ServiceAccount. Nothing asserts on timing: the pods' PodScheduled condition is polled with a timeout."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from gpu_stack_dev.e2e.dra_fleet import DRIVER, DraFleet, DraNodeSpec, devices, slice_manifest
from gpu_stack_dev.e2e.e2elib import CHART, E2ECluster, unique, values_args
from gpu_stack_dev.e2e.fleet import delete_pods, wait_scheduled
from gpu_stack_dev.paths import TEMPLATE_API_VERSIONS

CUDA_IMAGE = "nvcr.io/nvidia/cuda:12.9.1-base-ubuntu24.04"
WHOLE, MIG = "dra-whole", "dra-mig"
SPECS = (DraNodeSpec(WHOLE, gpus=2), DraNodeSpec(MIG, gpus=1, mig={0: ("1g.5gb", "1g.5gb")}))


def chart_objects(cluster: E2ECluster, namespace: str, *templates: str) -> list[dict[str, Any]]:
    out = cluster.helm("template", "gpu-stack", str(CHART), "-n", namespace, *TEMPLATE_API_VERSIONS,
                       *values_args("dra.yaml", set_json={"webhook.image.repository": "registry.invalid/dra"}),
                       *(arg for t in templates for arg in ("--show-only", f"templates/dra/{t}"))).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.fixture(scope="module")
def fleet(cluster: E2ECluster) -> Iterator[DraFleet]:
    """The chart's DeviceClasses (created here unless already there) and the DRA fleet, for the module."""
    created = []
    for obj in chart_objects(cluster, "gpu-stack", "deviceclass.yaml"):
        name = obj["metadata"]["name"]
        if not cluster.kubectl("get", "deviceclass", name, "--ignore-not-found", "-o", "name").stdout.strip():
            cluster.kubectl("create", "-f", "-", input=json.dumps(obj))
            created.append(name)
    try:
        with DraFleet(cluster, SPECS) as published:
            yield published
    finally:
        if created:
            cluster.kubectl("delete", "deviceclass", *created, "--ignore-not-found")


@pytest.fixture
def dra(cluster: E2ECluster, fleet: DraFleet) -> Iterator[tuple[str, DraFleet]]:
    """A namespace of one test's pods on the fleet; the pods go at the end (their claims, owned by them, with
    them), so each test finds every device free."""
    namespace = cluster.create_namespace()
    try:
        yield namespace, fleet
    finally:
        delete_pods(cluster, namespace)
        cluster.kubectl("delete", "namespace", namespace, "--wait=false")


def claim_pod(fleet: DraFleet, name: str, template: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "tolerations": [fleet.toleration],
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
                     "containers": [{"name": "cuda", "image": CUDA_IMAGE, "command": ["nvidia-smi", "-L"],
                                     "resources": {"claims": [{"name": "gpu"}]}}]}}


def run(cluster: E2ECluster, fleet: DraFleet, namespace: str, device_class: str,
        count: int = 1) -> tuple[str, tuple[str, str, str]]:
    """A claim template asking `count` devices of the class and a pod using it; (pod, PodScheduled) once
    the scheduler has bound it, or as it stands after the timeout."""
    name = unique("claim")
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
                "spec": {"spec": {"devices": {"requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": device_class, "count": count}}]}}}}
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(template))
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(claim_pod(fleet, name, name)))
    return name, wait_scheduled(cluster, namespace, name)


def allocation(cluster: E2ECluster, namespace: str, pod: str) -> list[dict[str, Any]]:
    """The device results of the pod's claim (the claim the resourceclaim controller made from the template)."""
    statuses = cluster.get_json("pod", pod, "-n", namespace)["status"]["resourceClaimStatuses"]
    (claim,) = [s["resourceClaimName"] for s in statuses if s["name"] == "gpu"]
    obj = cluster.get_json("resourceclaim", claim, "-n", namespace)
    assert {"resource": "pods", "name": pod} == {k: obj["status"]["reservedFor"][0][k] for k in ("resource", "name")}
    return list(obj["status"]["allocation"]["devices"]["results"])


def test_the_fleet_publishes_what_the_driver_publishes(cluster: E2ECluster, dra: tuple[str, DraFleet]) -> None:
    slices = {s["spec"]["nodeName"]: s for s in cluster.get_json("resourceslice")["items"]
              if s["spec"]["driver"] == DRIVER and s["spec"]["nodeName"] in (WHOLE, MIG)}
    assert {n: [d["name"] for d in s["spec"]["devices"]] for n, s in slices.items()} == {
        WHOLE: ["gpu-0", "gpu-1"], MIG: ["gpu-0-mig-1g5gb-19-0", "gpu-0-mig-1g5gb-19-1"]}
    # Stored as published (the API server keeps every attribute and capacity).
    assert slices[MIG]["spec"]["devices"] == devices(SPECS[1])
    assert slices[WHOLE]["spec"]["devices"][0]["capacity"]["memory"]["value"] == "40Gi"


def test_a_pod_with_a_gpu_claim_template_is_allocated_a_gpu_and_bound(
        cluster: E2ECluster, dra: tuple[str, DraFleet]) -> None:
    namespace, fleet = dra
    pod, (status, message, node) = run(cluster, fleet, namespace, "gpu.nvidia.com")
    assert (status, node) == ("True", WHOLE), message
    (result,) = allocation(cluster, namespace, pod)
    assert (result["driver"], result["pool"], result["request"]) == (DRIVER, WHOLE, "gpu")
    assert result["device"] in ("gpu-0", "gpu-1")


def test_a_mig_claim_gets_a_mig_device(cluster: E2ECluster, dra: tuple[str, DraFleet]) -> None:
    namespace, fleet = dra
    pod, (status, message, node) = run(cluster, fleet, namespace, "mig.nvidia.com")
    assert (status, node) == ("True", MIG), message
    (result,) = allocation(cluster, namespace, pod)
    assert (result["driver"], result["pool"]) == (DRIVER, MIG)
    assert result["device"].startswith("gpu-0-mig-1g5gb-19-")


def test_more_gpus_than_a_node_publishes_stays_pending_with_the_schedulers_reason(
        cluster: E2ECluster, dra: tuple[str, DraFleet]) -> None:
    namespace, fleet = dra
    pod, (status, message, node) = run(cluster, fleet, namespace, "gpu.nvidia.com", count=3)
    assert (status, node) == ("False", ""), message
    assert "cannot allocate all claims" in message, message
    assert cluster.get_json("pod", pod, "-n", namespace)["status"]["phase"] == "Pending"


def test_the_kubelet_plugin_may_write_only_its_own_nodes_resourceslices(
        cluster: E2ECluster, dra: tuple[str, DraFleet]) -> None:
    """The chart's ValidatingAdmissionPolicy and the plugin's RBAC, applied for a release namespace; requests
    as the plugin's ServiceAccount, whose bound token carries its pod's node (impersonated here)."""
    namespace = cluster.create_namespace()
    objs = chart_objects(cluster, namespace, "rbac.yaml", "validatingadmissionpolicy.yaml")
    try:
        for obj in objs:
            cluster.kubectl("create", "-f", "-", input=json.dumps(obj))
        (sa,) = [o["metadata"]["name"] for o in objs if o["kind"] == "ServiceAccount"]
        whole_uid = cluster.get_json("node", WHOLE)["metadata"]["uid"]
        own, other = slice_manifest(SPECS[0], whole_uid), slice_manifest(SPECS[0], whole_uid)
        own["spec"]["pool"]["name"] = other["spec"]["pool"]["name"] = unique("pool")
        all_nodes = json.loads(json.dumps(own))
        del all_nodes["spec"]["nodeName"], all_nodes["metadata"]["ownerReferences"]
        all_nodes["spec"]["allNodes"] = True

        def create_as(node: str, obj: dict[str, Any]) -> Any:
            return cluster.kubectl("create", "--dry-run=server", "-f", "-",
                                   f"--as=system:serviceaccount:{namespace}:{sa}",
                                   f"--as-user-extra=authentication.kubernetes.io/node-name={node}",
                                   input=json.dumps(obj), check=False)

        # The policy is enforced once the API server has loaded it: poll until the foreign slice is refused.
        deadline = time.monotonic() + 60
        while (denied := create_as(MIG, other)).returncode == 0 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert denied.returncode != 0
        assert f"this user running on node '{MIG}' may not modify cluster or node resourceslices" in denied.stderr
        allowed = create_as(WHOLE, own)
        assert allowed.returncode == 0, allowed.stderr
        # Hardened beyond upstream: no slice for all nodes from a node's plugin.
        refused = create_as(WHOLE, all_nodes)
        assert refused.returncode != 0 and "may not modify cluster or node resourceslices" in refused.stderr
        # A token of the plugin's account without its pod's node (ServiceAccountTokenPodNodeInfo off): nothing.
        anonymous = cluster.kubectl("create", "--dry-run=server", "-f", "-",
                                    f"--as=system:serviceaccount:{namespace}:{sa}",
                                    "--as-user-extra=authentication.kubernetes.io/pod-name=plugin",
                                    input=json.dumps(own), check=False)
        assert anonymous.returncode != 0 and "no node association found for user" in anonymous.stderr
    finally:
        for obj in reversed(objs):
            cluster.kubectl("delete", obj["kind"].lower(), obj["metadata"]["name"], "-n", namespace,
                            "--ignore-not-found", check=False)
        cluster.kubectl("delete", "namespace", namespace, "--wait=false")


def test_the_implicit_extended_resource_of_the_gpu_class_is_served_by_the_dra_gpus(
        cluster: E2ECluster, dra: tuple[str, DraFleet]) -> None:
    """KEP-5004 (DRAExtendedResource, beta and on by default in 1.36, as hack/controlplane.py leaves it): a pod
    asking deviceclass.resource.kubernetes.io/gpu.nvidia.com gets a device of that class from the slices."""
    namespace, fleet = dra
    pod = claim_pod(fleet, unique("ext"), "unused")
    del pod["spec"]["resourceClaims"]
    pod["spec"]["containers"][0]["resources"] = {"limits": {"deviceclass.resource.kubernetes.io/gpu.nvidia.com": 1}}
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(pod))
    status, message, node = wait_scheduled(cluster, namespace, pod["metadata"]["name"])
    assert (status, node) == ("True", WHOLE), message
    claim = cluster.get_json("pod", pod["metadata"]["name"], "-n", namespace)["status"]["extendedResourceClaimStatus"]
    results = cluster.get_json("resourceclaim", claim["resourceClaimName"], "-n", namespace)[
        "status"]["allocation"]["devices"]["results"]
    assert [(r["driver"], r["pool"]) for r in results] == [(DRIVER, WHOLE)]


def test_admin_access_claims_are_served(cluster: E2ECluster, dra: tuple[str, DraFleet]) -> None:
    """DRAAdminAccess is on (hack/controlplane.py sets no gate): the API server keeps adminAccess in a claim
    of a namespace labelled resource.kubernetes.io/admin-access=true (dry run)."""
    namespace = cluster.create_namespace(labels={"resource.kubernetes.io/admin-access": "true"})
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "admin"},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                 "deviceClassName": "gpu.nvidia.com", "allocationMode": "All", "adminAccess": True}}]}}}
    stored = json.loads(cluster.kubectl("create", "--dry-run=server", "-o", "json", "-n", namespace, "-f", "-",
                                        input=json.dumps(claim)).stdout)
    assert stored["spec"]["devices"]["requests"][0]["exactly"]["adminAccess"] is True
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")


def test_a_pod_bound_token_carries_its_node_as_the_resourceslice_policy_expects(
        cluster: E2ECluster, dra: tuple[str, DraFleet]) -> None:
    """The policy reads the node from the token's extra authentication.kubernetes.io/node-name
    (ServiceAccountTokenPodNodeInfo, on by default: hack/controlplane.py sets no gate): a token bound to a pod
    the scheduler placed on a DRA node says that node (TokenReview)."""
    namespace, fleet = dra
    pod = unique("token")
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod},
        "spec": {"tolerations": [fleet.toleration], "nodeSelector": {"kubernetes.io/hostname": WHOLE},
                 "containers": [{"name": "main", "image": CUDA_IMAGE}]}}))
    status, message, node = wait_scheduled(cluster, namespace, pod)
    assert (status, node) == ("True", WHOLE), message
    uid = cluster.get_json("pod", pod, "-n", namespace)["metadata"]["uid"]
    token = cluster.kubectl("create", "token", "default", "-n", namespace, "--bound-object-kind=Pod",
                            f"--bound-object-name={pod}", f"--bound-object-uid={uid}").stdout.strip()
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
    status_ = json.loads(cluster.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(review)).stdout)["status"]
    assert status_["authenticated"] is True
    assert status_["user"]["extra"]["authentication.kubernetes.io/node-name"] == [WHOLE]
