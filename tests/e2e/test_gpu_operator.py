"""Policy only on a GPU Operator cluster (docs/gpu-operator.md), on the real API server: the ClusterPolicy CRD
of GPU Operator v26.7.0 and its default ClusterPolicy (tests/fixtures/gpu-operator-v26.7.0, as the operator's
chart renders them) with a time-slicing device plugin ConfigMap; gpu-stack installed with
Chart-values-examples/policy-only-gpu-operator.yaml; the webhook served on loopback as the chart's
ServiceAccount (its RBAC, not the admin's). The verdicts follow the ClusterPolicy and the ConfigMap as
they change, without a restart, and GPU pods are refused, naming what is missing, while they cannot be read."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpu_stack_dev.e2e.e2elib import ROOT, E2ECluster, Release, Releases, unique
from gpu_stack_dev.e2e.fleet import MPS_TAINT, ChartSharing, Fleet, NodeSpec, delete_pods, wait_scheduled
from gpu_stack_webhook.policy.config import PolicyConfig
from gpu_stack_webhook.policy.live import operator_policy, read_cluster_policy

from .inspect_api import inspect
from .test_tls_selfmanaged import sa_kubeconfig

FIXTURE = ROOT / "tests" / "fixtures" / "gpu-operator-v26.7.0"
CONFIGMAP = "time-slicing-config"
DENIED = '"validate.gpu-stack.io" denied the request: '
TIME_SLICING = """version: v1
sharing:
  timeSlicing:
    failRequestsGreaterThanOne: true
    resources:
      - name: nvidia.com/gpu
        replicas: {replicas}
"""
MIG = "nvidia.com/mig-1g.5gb"
# Seconds the webhook may take to follow a change: it reads every second (--policy-source-interval 1s).
FOLLOW_SECONDS = 30


@pytest.fixture(scope="module")
def clusterpolicy_crd(cluster: E2ECluster) -> Iterator[None]:
    crd = FIXTURE / "nvidia.com_clusterpolicies.yaml"
    cluster.kubectl("apply", "--server-side", "-f", str(crd))
    deadline = time.monotonic() + 60
    while '"Established"' not in cluster.kubectl("get", "crd", "clusterpolicies.nvidia.com", "-o",
                                                 "jsonpath={.status.conditions}", check=False).stdout:
        assert time.monotonic() < deadline, "the ClusterPolicy CRD is not established"
        time.sleep(0.2)
    yield
    cluster.kubectl("delete", "-f", str(crd), "--ignore-not-found", "--wait=false", check=False)


def gpu_pod(name: str, resource: str = "nvidia.com/gpu", count: int = 1) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                       "spec": {"containers": [{"name": "main", "image": "busybox",
                                                "resources": {"limits": {resource: count}}}]}})


class OperatorCluster:
    """One ClusterPolicy (unique name) and the operator's namespace, gpu-stack policy-only beside them."""

    def __init__(self, cluster: E2ECluster, releases: Releases, live_webhook: Any, tmp_path: Path) -> None:
        self.cluster = cluster
        self.name = unique("cluster-policy")
        self.operator_ns = cluster.create_namespace(unique("gpu-operator"))
        self.policy = yaml.safe_load((FIXTURE / "clusterpolicy.yaml").read_text())
        self.policy["metadata"]["name"] = self.name
        self.policy["spec"]["devicePlugin"]["config"] = {"name": CONFIGMAP, "default": "any"}
        self.release, _ = releases.install("policy-only-gpu-operator.yaml", set_json={
            "webhook.policySource.gpuOperator.clusterPolicy": self.name,
            "webhook.policySource.gpuOperator.namespace": self.operator_ns})
        self.workloads = cluster.create_namespace()
        self.live_webhook = live_webhook
        self.tmp_path = tmp_path

    def serve(self) -> None:
        release: Release = self.release
        kubeconfig = sa_kubeconfig(self.cluster, release, self.tmp_path / "sa.kubeconfig")
        self.live_webhook(release, extra_args=[
            "--kubeconfig", str(kubeconfig), "--policy-source", "gpu-operator", "--cluster-policy", self.name,
            "--operator-namespace", self.operator_ns, "--policy-source-interval", "1s"],
            probe_namespace=self.workloads)

    def apply_policy(self, change: Callable[[dict[str, Any]], None] | None = None) -> None:
        if change:
            change(self.policy)
        self.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(self.policy))

    def apply_configmap(self, data: dict[str, str]) -> None:
        manifest = {"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": CONFIGMAP, "namespace": self.operator_ns}, "data": data}
        self.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(manifest))

    def verdict(self, manifest: str) -> str:
        """"allowed", or the API server's denial message."""
        proc = self.cluster.kubectl("create", "--dry-run=server", "-n", self.workloads, "-f", "-", input=manifest,
                                    check=False)
        return "allowed" if proc.returncode == 0 else proc.stderr.strip()

    def until(self, manifest: str, expected: str) -> str:
        """The verdict once it contains `expected` (the webhook follows within seconds); fails with the last."""
        deadline = time.monotonic() + FOLLOW_SECONDS
        while True:
            seen = self.verdict(manifest)
            if expected in seen or time.monotonic() > deadline:
                assert expected in seen, f"after {FOLLOW_SECONDS}s: {seen}"
                return seen
            time.sleep(0.5)


@pytest.fixture
def operator(cluster: E2ECluster, releases: Releases, live_webhook: Any, tmp_path: Path,
             clusterpolicy_crd: None) -> Iterator[OperatorCluster]:
    setup = OperatorCluster(cluster, releases, live_webhook, tmp_path)
    yield setup
    cluster.kubectl("delete", "clusterpolicy", setup.name, "--ignore-not-found", check=False)


def test_verdicts_follow_the_cluster_policy_and_its_configmap(operator: OperatorCluster) -> None:
    operator.apply_policy()  # names a ConfigMap that does not exist yet
    operator.serve()
    two = gpu_pod("two", count=2)
    assert operator.until(two, DENIED + "GPU010 ") == (
        'Error from server (Forbidden): error when creating "STDIN": admission webhook ' + DENIED +
        "GPU010 the GPU configuration this policy follows cannot be read: ConfigMap "
        f"{operator.operator_ns}/{CONFIGMAP} (ClusterPolicy {operator.name} devicePlugin.config.name) does not "
        "exist (spec)")
    assert operator.verdict(json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "cpu"},
                                        "spec": {"containers": [{"name": "main", "image": "busybox"}]}})) == "allowed"

    # Time-slicing that refuses more than one replica per container: two are denied, one is fine.
    operator.apply_configmap({"any": TIME_SLICING.format(replicas=4)})
    assert "GPU004 " in operator.until(two, DENIED + "GPU004 ")
    assert operator.verdict(gpu_pod("one")) == "allowed"
    # The ConfigMap changes (exclusive GPUs): the same pod is allowed, no restart.
    operator.apply_configmap({"any": "version: v1\n"})
    assert operator.until(two, "allowed") == "allowed"

    # mig.strategy single (the operator's default) exposes no MIG resource names; mixed does.
    mig = gpu_pod("mig", resource=MIG)
    assert "GPU005 " in operator.until(mig, DENIED + "GPU005 ")
    operator.apply_policy(lambda p: p["spec"]["mig"].update({"strategy": "mixed"}))
    assert operator.until(mig, "allowed") == "allowed"


def test_refuses_a_cluster_policy_it_cannot_read(operator: OperatorCluster) -> None:
    operator.apply_configmap({"any": TIME_SLICING.format(replicas=2)})
    operator.apply_policy(lambda p: p["metadata"]["labels"].update({"app.kubernetes.io/version": "v27.1.0"}))
    operator.serve()
    one = gpu_pod("one")
    assert (f"GPU010 the GPU configuration this policy follows cannot be read: ClusterPolicy {operator.name}: "
            "GPU Operator version v27.1.0 is not supported") in operator.until(one, DENIED + "GPU010 ")
    operator.apply_policy(lambda p: p["metadata"]["labels"].update({"app.kubernetes.io/version": "v26.7.0"}))
    assert operator.until(one, "allowed") == "allowed"
    # A config the device plugin would reject.
    operator.apply_configmap({"any": TIME_SLICING.format(replicas=0)})
    assert operator.until(one, "would reject").endswith(
        f"GPU010 the GPU configuration this policy follows cannot be read: ConfigMap {operator.operator_ns}/"
        f"{CONFIGMAP}: a config the device plugin would reject: sharing.configs.any.sharing.timeSlicing."
        "resources[0].replicas: Input should be greater than or equal to 1 (spec)")
    # The ClusterPolicy goes away (the operator uninstalled).
    operator.cluster.kubectl("delete", "clusterpolicy", operator.name)
    missing = (f"ClusterPolicy {operator.name} does not exist (is the GPU Operator installed, and is this the name "
               "of its ClusterPolicy?)")
    assert operator.until(one, "does not exist").endswith(
        f"GPU010 the GPU configuration this policy follows cannot be read: {missing} (spec)")
    # inspect reads what the webhook reads and says the same.
    report = inspect("-o", "json", "--policy-source", "gpu-operator", "--cluster-policy", operator.name,
                     "--operator-namespace", operator.operator_ns, kubeconfig=Path(operator.cluster.kubeconfig))
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["notes"] == [
        f"GPU Operator ClusterPolicy {operator.name}: {missing}; the webhook refuses GPU pods until it can read it "
        "(GPU010); sharing is shown as GFD labels it"]


def test_nodes_labelled_as_the_operators_gfd_labels_them_get_the_promised_placement(
        operator: OperatorCluster) -> None:
    """Nodes published as the operator's device plugin and GFD would for its ConfigMap (fleet.py, from the
    configs the webhook derives: the operator's MIG strategy applied); the operator does not taint MPS nodes
    (docs/gpu-operator.md, MPS): an MPS pod that opts in is sent there by the selector GPU006 adds."""
    mps = TIME_SLICING.replace("timeSlicing", "mps").format(replicas=4)
    data = {"any": TIME_SLICING.format(replicas=4), "mps": mps}
    operator.apply_configmap(data)
    # mig.strategy none: the fleet does not model sharing beside a MIG strategy (T4s have no MIG anyway)
    operator.apply_policy(lambda p: p["spec"]["mig"].update({"strategy": "none"}))
    operator.serve()
    derived = operator_policy(PolicyConfig(), read_cluster_policy(operator.policy), data)
    sharing = ChartSharing(configs={n: c.model_dump(by_alias=True, mode="json", exclude_none=True)
                                    for n, c in derived.sharing.configs.items()},
                           default_config=derived.sharing.default_config,
                           config_label=derived.sharing.node_config_label)
    shared, mps_node = unique("ts"), unique("mps")
    specs = [NodeSpec(shared, gpus=1), NodeSpec(mps_node, gpus=1, config="mps", taint_mps=False)]
    with Fleet(operator.cluster, sharing, specs) as fleet:
        assert next(n for n in fleet if n.name == mps_node).labels["nvidia.com/mps.capable"] == "true"
        assert MPS_TAINT["key"] not in [t["key"] for n in fleet for t in n.taints]
        pod = json.loads(gpu_pod("mps-pod"))
        pod["metadata"]["annotations"] = {"gpu-stack.io/mps": "true"}
        pod["spec"]["tolerations"] = [fleet.toleration]
        admitted = json.loads(operator.cluster.kubectl("create", "-n", operator.workloads, "-o", "json", "-f", "-",
                                                       input=json.dumps(pod)).stdout)
        assert admitted["spec"]["hostIPC"] is True
        assert admitted["spec"]["nodeSelector"] == {"nvidia.com/mps.capable": "true"}
        status, message, node = wait_scheduled(operator.cluster, operator.workloads, "mps-pod")
        assert (status, node) == ("True", mps_node), message
        delete_pods(operator.cluster, operator.workloads)
