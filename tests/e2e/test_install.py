"""The chart installed for real: the defaults and every overlay in Chart-values-examples/, from nothing,
upgraded with one value changed, then uninstalled, with Helm 4 (and Helm 3 for the defaults and a MIG
overlay). Overlays that need other projects' CRDs get minimal stand-ins (tests/e2e/crds/) first; without
them the install must stop at once with our own message (tests/e2e/test_prerequisites.py).

No `helm install --wait` here: this plane has no kubelet, so the Deployments' pods (the webhook, NFD's master
and gc) are created but never Ready, and `--wait` would only time out. What it can honestly wait for is done
instead (assert_workload_pods_created): every workload's pods made by the controller manager through this API
server's admission. `helm uninstall --wait` is used (Releases.uninstall): deletion needs no kubelet. With a
kubelet, tests/e2e/node installs with `--wait` and `helm test`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpu_stack_dev.e2e.e2elib import POLICY_ONLY_NAMESPACE, E2ECluster, Release, Releases, overlays, unique

from .minors_results import record_session

CRDS = Path(__file__).parent / "crds"
NFD_CRDS = ("nodefeatures.nfd.k8s-sigs.io", "nodefeaturegroups.nfd.k8s-sigs.io", "nodefeaturerules.nfd.k8s-sigs.io")
# Overlay -> the stand-in CRDs it needs installed first, and the custom objects it then creates.
STANDINS = {
    "monitoring-prometheus-operator.yaml": ("prometheus-operator-standin.yaml", {"ServiceMonitor", "PrometheusRule"}),
    "webhook-cert-manager.yaml": ("cert-manager-standin.yaml", {"Certificate", "Issuer"}),
}
MIG_OVERLAYS = {"mig-single-all-1g.yaml", "mig-mixed-all-balanced.yaml"}
# Pods, ReplicaSets, ... are made by controllers, not Helm, and go away through the garbage collector.
CONTROLLER_MADE = "pods,replicasets,controllerrevisions,jobs"


def remove_nfd_crds(cluster: E2ECluster) -> None:
    """Back to a cluster that never saw the chart: the NFD CRDs (kept by every uninstall) go too."""
    cluster.kubectl("delete", "crd", *NFD_CRDS, "--ignore-not-found", "--wait=true", "--timeout=60s")


def apply_crds(cluster: E2ECluster, file_name: str) -> list[str]:
    path = CRDS / file_name
    names = [d["metadata"]["name"] for d in yaml.safe_load_all(path.read_text()) if d]
    cluster.kubectl("apply", "-f", str(path))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", *(f"crd/{n}" for n in names))
    return names


@pytest.fixture
def standin_crds(cluster: E2ECluster):
    applied: list[str] = []

    def apply(file_name: str) -> None:
        applied.extend(apply_crds(cluster, file_name))

    yield apply
    if applied:
        cluster.kubectl("delete", "crd", *applied, "--ignore-not-found", "--wait=true", "--timeout=60s")


def manifest_objects(cluster: E2ECluster, release: Release) -> list[tuple[str, str, str]]:
    helm = cluster.helm if release.helm_major == 4 else cluster.helm3
    manifest = helm("get", "manifest", release.name, "-n", release.namespace).stdout
    return [(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"])
            for d in yaml.safe_load_all(manifest) if d]


def webhook_timeouts(cluster: E2ECluster, release: Release) -> dict[str, int]:
    return {hook["name"]: hook["timeoutSeconds"]
            for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration")
            for obj in cluster.get_json(kind, "-l", release.selector)["items"] for hook in obj["webhooks"]}


def present(cluster: E2ECluster, release: Release, objects: list[tuple[str, str, str]]) -> list[str]:
    """Which of the manifest's objects exist (one kubectl call per namespace: -n is ignored for cluster-scoped
    kinds; the policy-only overlays' policy-source Role is in the operator's namespace)."""
    assert {namespace for _, namespace, _ in objects} <= {"", release.namespace, *(v for _, v in release.values)}
    got: list[str] = []
    for where in sorted({namespace or release.namespace for _, namespace, _ in objects}):
        names = [f"{kind}/{name}" for kind, namespace, name in objects if (namespace or release.namespace) == where]
        got += cluster.kubectl("get", "-n", where, *names, "--ignore-not-found", "-o", "name").stdout.split()
    return sorted(got)


def assert_workload_pods_created(cluster: E2ECluster, release: Release, timeout: float = 120) -> dict[str, int]:
    """What `helm install --wait` can honestly wait for on a plane without a kubelet: the release's controllers
    have made the pods their workloads want, through this API server's admission and validation (a pod field
    the server refuses shows here as a FailedCreate event). Not that they run: the Deployments' pods (webhook,
    NFD master and gc) stay Pending without a node, so `--wait` itself would time out on them; the DaemonSets
    want a pod per GPU node, none here. Returns each workload's pods (kind/name -> count)."""
    deadline = time.monotonic() + timeout
    while True:
        created, short = {}, []
        for kind in ("deployment", "daemonset"):
            for obj in cluster.get_json(kind, "-n", release.namespace, "-l", release.selector)["items"]:
                name, status = f"{kind}/{obj['metadata']['name']}", obj.get("status") or {}
                observed = status.get("observedGeneration") == obj["metadata"]["generation"]
                want = obj["spec"].get("replicas", 1) if kind == "deployment" else status.get("desiredNumberScheduled")
                selector = ",".join(f"{k}={v}" for k, v in obj["spec"]["selector"]["matchLabels"].items())
                pods = [p for p in cluster.get_json("pods", "-n", release.namespace, "-l", selector)["items"]
                        if not p["metadata"].get("deletionTimestamp")]
                created[name] = len(pods)
                if not observed or want is None or len(pods) != want:
                    short.append(f"{name}: {len(pods)} of {want} pods")
        if not short:
            return created
        failed = cluster.get_json("events", "-n", release.namespace, "--field-selector=reason=FailedCreate")["items"]
        assert not failed, [f"{e['involvedObject']['name']}: {e.get('message')}" for e in failed]
        assert time.monotonic() < deadline, f"the controllers did not make the workloads' pods: {short}"
        time.sleep(1)


def assert_nothing_left(cluster: E2ECluster, release: Release, objects: list[tuple[str, str, str]]) -> None:
    assert present(cluster, release, objects) == [], "still there after helm uninstall"
    deadline = time.monotonic() + 90
    while left := cluster.kubectl("get", CONTROLLER_MADE, "-n", release.namespace, "-l", release.selector,
                                  "-o", "name").stdout.split():
        assert time.monotonic() < deadline, f"the garbage collector left {left}"
        time.sleep(1)


def assert_pods_not_blocked(cluster: E2ECluster, namespace: str = "") -> None:
    """With the webhook gone, even a pod it would deny is admitted (dry run: nothing is stored); in `namespace`
    when given (and kept), else in a fresh one."""
    made = not namespace
    namespace = namespace or cluster.create_namespace()
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "after-uninstall"},
           "spec": {"containers": [{"name": "main", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": 1}},
                                    "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]}}
    proc = cluster.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(pod))
    assert proc.stdout.strip() == "pod/after-uninstall created (server dry run)"
    if made:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false")


def lifecycle(cluster: E2ECluster, releases: Releases, overlay: str, helm_major: int) -> dict[str, Any]:
    remove_nfd_crds(cluster)
    release, proc = releases.install(overlay, helm_major=helm_major)
    helm = cluster.helm if helm_major == 4 else cluster.helm3
    status = json.loads(helm("status", release.name, "-n", release.namespace, "-o", "json").stdout)
    assert status["info"]["status"] == "deployed", proc.stdout + proc.stderr
    cluster.kubectl("get", "crd", *NFD_CRDS)  # from the chart's crds/, created before any template
    objects = manifest_objects(cluster, release)
    assert len(present(cluster, release, objects)) == len(objects)  # every object of the manifest is there
    kinds = {kind for kind, _, _ in objects}
    assert {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"} <= kinds
    # policy only: another project's agents run the GPU nodes (docs/gpu-operator.md)
    assert ("DaemonSet" in kinds) is (overlay not in POLICY_ONLY_NAMESPACE)
    assert set(webhook_timeouts(cluster, release).values()) == {10}
    pods = assert_workload_pods_created(cluster, release)
    assert any(pods.values()), pods  # the webhook's own Deployment at least

    releases.upgrade(release, overlay, set_json={"webhook.timeoutSeconds": 7})
    history = json.loads(helm("history", release.name, "-n", release.namespace, "-o", "json").stdout)
    assert [(h["revision"], h["status"]) for h in history] == [(1, "superseded"), (2, "deployed")]
    assert set(webhook_timeouts(cluster, release).values()) == {7}

    if cluster.kind == "existing":  # the test pods need a node (and the CUDA one a GPU)
        helm("test", release.name, "-n", release.namespace, "--timeout", "5m")

    releases.uninstall(release)
    assert_nothing_left(cluster, release, objects)
    assert_pods_not_blocked(cluster)
    cluster.kubectl("get", "crd", *NFD_CRDS)  # crds/ outlive the release (else every NodeFeatureRule went too)
    return {"kinds": kinds}


@pytest.mark.parametrize("overlay", overlays())
def test_install_upgrade_uninstall_helm4(cluster: E2ECluster, releases: Releases, standin_crds, overlay: str) -> None:
    needs = STANDINS.get(overlay)
    if needs:
        standin_crds(needs[0])
    seen = lifecycle(cluster, releases, overlay, helm_major=4)
    if needs:
        assert needs[1] <= seen["kinds"]
    # the 1.36 column of the support table (tests/e2e/test_kubernetes_minors.py installs on 1.32 and 1.34)
    record_session(cluster, f"install {overlay}", "yes")
    if overlay in MIG_OVERLAYS:
        assert "NodeFeatureRule" in seen["kinds"]


@pytest.mark.parametrize("overlay", ["default", "mig-single-all-1g.yaml"])
def test_install_upgrade_uninstall_helm3(cluster: E2ECluster, releases: Releases, overlay: str) -> None:
    lifecycle(cluster, releases, overlay, helm_major=3)


def test_second_release_reuses_the_nfd_crds(cluster: E2ECluster, releases: Releases) -> None:
    """A cluster that already has the NFD CRDs (NFD installed, or an earlier release): Helm skips crds/."""
    first, _ = releases.install("mig-single-all-1g.yaml", name="first")
    created = cluster.get_json("crd", NFD_CRDS[2])["metadata"]["creationTimestamp"]
    releases.uninstall(first)
    second, _ = releases.install("mig-single-all-1g.yaml", name=unique("second"))
    assert cluster.get_json("crd", NFD_CRDS[2])["metadata"]["creationTimestamp"] == created
    cluster.kubectl("get", "nodefeaturerule", f"{second.fullname}-mig-default-config")
