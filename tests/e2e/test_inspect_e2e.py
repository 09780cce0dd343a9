"""`kubectl gpu-stack inspect` against a real API server: the 4-node GPU cluster of
gpu_stack_dev.inspect_cluster created through the API (Nodes with GFD labels and device plugin
capacity/allocatable, Pods bound with spec.nodeName, the chart's device plugin ConfigMap and its Grafana
dashboard ConfigMaps in namespace gpu-stack); the printed table and JSON are the ones the unit tests and
README.md show, byte for byte."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpu_stack_dev.e2e.e2elib import E2ECluster
from gpu_stack_dev.inspect_cluster import (
    FINISHED_PODS,
    NODES,
    PENDING_POD,
    PODS,
    chart_configmap,
    chart_dashboards,
    render_chart,
)

from .inspect_api import (
    api_client,
    apply_configmap,
    create_all,
    create_objects,
    create_pod,
    delete_objects,
    inspect,
    service_account_kubeconfig,
)

pytestmark = pytest.mark.e2e
EXPECTED = Path(__file__).resolve().parents[1] / "inspect"
LABEL = {"gpu-stack.io/e2e": "inspect"}
SELECTOR = "gpu-stack.io/e2e=inspect"
CONFIGMAP_NAMESPACE = "inspect-e2e"
DASHBOARDS_NAMESPACE = "gpu-stack"  # as rendered (no e2e release is installed into this namespace)
ARGS = ("-l", SELECTOR, "--configmap-namespace", CONFIGMAP_NAMESPACE, "--dashboards-namespace", DASHBOARDS_NAMESPACE)


@pytest.fixture(scope="module")
def four_nodes(cluster: E2ECluster) -> Iterator[Path]:
    kubeconfig = Path(cluster.kubeconfig)
    api = api_client(kubeconfig)
    configmap = chart_configmap()
    configmap["metadata"]["namespace"] = CONFIGMAP_NAMESPACE
    apply_configmap(api, configmap)
    dashboards = chart_dashboards()
    for dashboard in dashboards:
        apply_configmap(api, dashboard)
    create_all(api, NODES, [*PODS, *FINISHED_PODS], LABEL)
    create_pod(api, PENDING_POD)  # never bound: filtered out by the server
    yield kubeconfig
    for dashboard in dashboards:
        cluster.kubectl("delete", "configmap", dashboard["metadata"]["name"], "-n", DASHBOARDS_NAMESPACE,
                        "--ignore-not-found")
    # Cluster-scoped leftovers would meet later tests' releases (their DaemonSets select GPU nodes).
    cluster.kubectl("delete", "nodes", "-l", SELECTOR, "--wait=false", check=False)


def test_table_is_exact(four_nodes: Path) -> None:
    result = inspect(*ARGS, kubeconfig=four_nodes)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == (EXPECTED / "expected-4node.txt").read_text()


def test_json_is_exact(four_nodes: Path) -> None:
    result = inspect(*ARGS, "-o", "json", kubeconfig=four_nodes)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == (EXPECTED / "expected-4node.json").read_text()


def test_as_a_kubectl_plugin(four_nodes: Path, cluster: E2ECluster) -> None:
    # The real kubectl finds kubectl-gpu_stack on PATH and runs it for `kubectl gpu-stack`.
    result = inspect(*ARGS, kubeconfig=four_nodes, kubectl=cluster.kubectl_bin)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == (EXPECTED / "expected-4node.txt").read_text()


def test_one_node_one_namespace(four_nodes: Path) -> None:
    result = inspect("--node", "gpu-t4-timesliced", "-n", "vision", "-o", "yaml",
                     "--configmap-namespace", CONFIGMAP_NAMESPACE, kubeconfig=four_nodes)
    assert result.returncode == 0, result.stderr
    doc: dict[str, Any] = yaml.safe_load(result.stdout)
    (node,) = doc["nodes"]
    assert node["name"] == "gpu-t4-timesliced"
    assert [(r["requested"], r["free"]) for r in node["resources"]] == [(4, 4)]  # all namespaces count
    assert [(p["name"], p["container"]) for p in node["pods"]] == [("detector", "infer"), ("detector", "tracker")]
    assert doc["summary"]["holderNamespace"] == "vision"


def test_unknown_node(four_nodes: Path) -> None:
    result = inspect("--node", "gpu-nope", kubeconfig=four_nodes)
    assert (result.returncode, result.stdout, result.stderr) == (1, "", "error: node not found: gpu-nope\n")


def test_rbac_names_verb_and_resource_then_the_chart_role_is_enough(four_nodes: Path, tmp_path: Path) -> None:
    api = api_client(four_nodes)
    user = service_account_kubeconfig(api, four_nodes, CONFIGMAP_NAMESPACE, "gpu-viewer", tmp_path / "sa")
    denied = inspect(*ARGS, kubeconfig=user)
    assert denied.returncode == 1
    assert denied.stdout == ""
    assert denied.stderr == (
        'error: forbidden: you cannot list nodes at the cluster scope (nodes is forbidden: User '
        f'"system:serviceaccount:{CONFIGMAP_NAMESPACE}:gpu-viewer" cannot list resource "nodes" in API group "" '
        "at the cluster scope); the chart's read-only ClusterRole and Role (inspect.rbac.create) grant what "
        "inspect needs\n")

    # The chart's ClusterRole and Role, bound through inspect.rbac.subjects, are all the command needs; the Role
    # where monitoring.dashboards.namespace puts the dashboards.
    subject = {"kind": "ServiceAccount", "name": "gpu-viewer", "namespace": CONFIGMAP_NAMESPACE}
    objects = render_chart(["--set-json", f"inspect.rbac.subjects={json.dumps([subject])}",
                            "--set", "monitoring.dashboards.enabled=true",
                            "--set", f"monitoring.dashboards.namespace={DASHBOARDS_NAMESPACE}",
                            "--show-only", "templates/inspect/clusterrole.yaml",
                            "--show-only", "templates/inspect/clusterrolebinding.yaml",
                            "--show-only", "templates/inspect/role.yaml",
                            "--show-only", "templates/inspect/rolebinding.yaml"], namespace=CONFIGMAP_NAMESPACE)
    assert sorted(o["kind"] for o in objects) == ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"]
    create_objects(api, objects)
    try:
        allowed = _until_allowed(user)
    finally:
        # Named like a release called gpu-stack's own ClusterRole: left behind, it would block that install.
        delete_objects(api, objects)
    assert allowed.stdout == (EXPECTED / "expected-4node.txt").read_text()


def _until_allowed(kubeconfig: Path) -> Any:
    for _ in range(50):  # RBAC changes reach the authorizer's cache within moments
        result = inspect(*ARGS, kubeconfig=kubeconfig)
        if result.returncode == 0:
            return result
        time.sleep(0.2)
    raise AssertionError(result.stderr)


def test_small_pages_give_the_same_output(four_nodes: Path) -> None:
    # Two objects per request: several pages of nodes and pods, each next page asked for while the
    # previous one is parsed (inspect_kube.Reader.list_all).
    result = inspect(*ARGS, "--chunk-size", "2", "-v", kubeconfig=four_nodes)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (EXPECTED / "expected-4node.txt").read_text()
    found = re.fullmatch(r"read (\d+) nodes and (\d+) pods in (\d+) requests, [\d.]+ s\n", result.stderr)
    assert found, result.stderr
    nodes, pods, requests = map(int, found.groups())
    assert (nodes, pods) == (5, 10)  # the finished and the unbound pods are filtered out by the server
    # + the device plugin ConfigMap, the 3 dashboard ConfigMaps, the GrafanaDashboards (404: no such API), the
    # DRA ResourceSlices (none here; the claims are listed only when there are slices)
    pages = math.ceil(nodes / 2) + math.ceil(pods / 2) + 1 + math.ceil(3 / 2) + 1 + 1
    assert pages <= requests <= pages + 2
