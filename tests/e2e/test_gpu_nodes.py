"""GPU-node wiring against a real API server and its DaemonSet controller (no kubelet: pods stay Pending,
but the controller still creates and deletes each node's DaemonSet pods as the node's labels change).

- The MIG manager's pause -> resume contract (mig-parted v0.15.0 pkg/mig/reconfigure/reconfigure.go,
  see tests/chart/test_mig_contract.py): merge-patching nvidia.com/gpu.deploy.* to paused-for-mig-change
  makes the DaemonSet controller delete exactly the GPU clients, found by the app= labels the MIG
  manager polls; setting them back to "true" brings them back.
- The MIG manager's and GFD's RBAC, asked of the real authorizer (kubectl auth can-i --as).
- The chart's NodeFeatureRules are accepted by the NFD v0.19.0 CRDs in crds/.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from gpu_stack_dev.e2e.e2elib import E2ECluster, Releases, unique

PAUSED = "paused-for-mig-change"
DEPLOY_LABELS = [f"nvidia.com/gpu.deploy.{c}" for c in
                 ("device-plugin", "gpu-feature-discovery", "dcgm-exporter", "dcgm", "nvsm")]
# No kubelet: the node keeps the node.kubernetes.io/not-ready taint the API server adds at creation;
# tolerate everything so the DaemonSet controller keeps placing pods there.
TOLERATE_ALL = {"gpuNodes.tolerations": [{"operator": "Exists"}]}


@pytest.fixture
def gpu_node(cluster: E2ECluster) -> Iterator[str]:
    name = unique("gpu-node")
    node = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                  "feature.node.kubernetes.io/pci-10de.present": "true"}}}
    cluster.kubectl("create", "-f", "-", input=json.dumps(node))
    yield name
    cluster.kubectl("delete", "node", name, "--ignore-not-found", "--wait=false", check=False)


def components_on(cluster: E2ECluster, namespace: str, node: str) -> dict[str, str]:
    """component -> app label of the DaemonSet pods the controller made for this node."""
    pods = cluster.get_json("pods", "-n", namespace)["items"]
    out = {}
    for pod in pods:
        if pod["metadata"].get("deletionTimestamp"):
            continue
        terms = (pod["spec"].get("affinity", {}).get("nodeAffinity", {})
                 .get("requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms", []))
        fields = [f for t in terms for f in t.get("matchFields", [])]
        if any(f["key"] == "metadata.name" and node in f["values"] for f in fields):
            labels = pod["metadata"]["labels"]
            out[labels["app.kubernetes.io/component"]] = labels.get("app", "")
    return out


def eventually(check, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"gave up waiting: {what}"
        time.sleep(2)


def patch_labels(cluster: E2ECluster, node: str, labels: dict[str, str]) -> None:
    # A JSON merge patch of metadata.labels, as the MIG manager's setNodeLabels sends it.
    cluster.kubectl("patch", "node", node, "--type=merge", "-p", json.dumps({"metadata": {"labels": labels}}))


def test_the_mig_manager_finds_our_gpu_clients_by_their_app_labels(
        cluster: E2ECluster, releases: Releases, gpu_node: str) -> None:
    """The DaemonSet controller makes one pod per GPU node; the app= selectors the MIG manager polls in
    the release namespace find exactly the device plugin, GFD and DCGM exporter. (The pause itself,
    DaemonSet pods leaving a node whose deploy label is paused-for-mig-change, needs scheduled pods:
    this kubelet-less plane leaves its unscheduled pods in place when node labels change, so it is
    checked against the rendered node affinity in tests/chart/test_mig_contract.py.)"""
    release, _ = releases.install("mig-mixed-all-balanced.yaml", set_json=TOLERATE_ALL)
    ns = release.namespace
    clients = {"device-plugin": "nvidia-device-plugin-daemonset", "gpu-feature-discovery": "gpu-feature-discovery",
               "dcgm-exporter": "nvidia-dcgm-exporter"}
    stay = {"mig-manager", "container-toolkit"}
    eventually(lambda: set(clients) | stay <= set(components_on(cluster, ns, gpu_node)), "every agent on the node")
    on = components_on(cluster, ns, gpu_node)
    assert {c: on[c] for c in clients} == clients
    for component, app in clients.items():
        found = cluster.get_json("pods", "-n", ns, "-l", f"app={app}")["items"]
        assert [p["metadata"]["labels"]["app.kubernetes.io/component"] for p in found] == [component]
    # The MIG manager's merge patch of its labels is accepted as it sends it.
    patch_labels(cluster, gpu_node, dict.fromkeys(DEPLOY_LABELS, PAUSED))
    labels = cluster.get_json("node", gpu_node)["metadata"]["labels"]
    assert all(labels[k] == PAUSED for k in DEPLOY_LABELS)


def can_i(cluster: E2ECluster, sa: str, *args: str) -> bool:
    proc = cluster.kubectl("auth", "can-i", *args, f"--as={sa}", check=False)
    return proc.stdout.strip() == "yes"


def test_mig_manager_and_gfd_rbac_on_the_real_authorizer(cluster: E2ECluster, releases: Releases) -> None:
    release, _ = releases.install("mig-mixed-all-balanced.yaml")
    ns = release.namespace
    mig = f"system:serviceaccount:{ns}:{release.fullname}-mig-manager"
    assert can_i(cluster, mig, "list", "pods", "--all-namespaces")  # waitForPodsWithNodeSelector
    assert can_i(cluster, mig, "delete", "pods", "-n", ns)
    for verb in ("get", "list", "watch", "patch"):
        assert can_i(cluster, mig, verb, "nodes"), verb
    assert not can_i(cluster, mig, "deletecollection", "pods", "-n", ns)
    assert not can_i(cluster, mig, "update", "nodes")
    assert not can_i(cluster, mig, "delete", "pods", "-n", "kube-system")

    gfd = f"system:serviceaccount:{ns}:{release.fullname}-gpu-feature-discovery"
    for verb in ("get", "create", "update"):
        assert can_i(cluster, gfd, verb, "nodefeatures.nfd.k8s-sigs.io", "-n", ns), verb
    assert can_i(cluster, gfd, "get", "pods", "-n", ns)
    assert not can_i(cluster, gfd, "create", "nodefeatures.nfd.k8s-sigs.io", "-n", "default")
    assert not can_i(cluster, gfd, "delete", "nodefeatures.nfd.k8s-sigs.io", "-n", ns)


def test_the_nfd_crds_accept_the_chart_rules(cluster: E2ECluster, releases: Releases) -> None:
    release, _ = releases.install("mig-single-all-1g.yaml")
    present = cluster.get_json("nodefeaturerule", f"{release.fullname}-gpu-present")
    (rule,) = present["spec"]["rules"]
    assert rule["labels"] == {"nvidia.com/gpu.present": "true"}
    assert rule["matchFeatures"][0]["matchExpressions"]["class"] == {"op": "In", "value": ["0300", "0302"]}
    mig = cluster.get_json("nodefeaturerule", f"{release.fullname}-mig-default-config")
    (rule,) = mig["spec"]["rules"]
    assert rule["labels"] == {"nvidia.com/mig.config": "all-1g"}
    devices = set(rule["matchFeatures"][0]["matchExpressions"]["device"]["value"])
    assert {"20b0", "20b2", "20b7", "2335", "2901"} <= devices


def test_driver_option_installs(cluster: E2ECluster, releases: Releases) -> None:
    release, _ = releases.install(set_json={"driver.enabled": True})
    ds = cluster.get_json("daemonset", f"{release.fullname}-driver", "-n", release.namespace)
    assert ds["spec"]["updateStrategy"]["type"] == "OnDelete"
    toolkit = cluster.get_json("daemonset", f"{release.fullname}-container-toolkit", "-n", release.namespace)
    assert [c["name"] for c in toolkit["spec"]["template"]["spec"]["initContainers"]] == ["driver-validation"]
