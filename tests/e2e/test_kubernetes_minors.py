"""The API-server suite on every Kubernetes minor the chart claims (Chart.yaml kubeVersion >=1.32.0-0): 1.32, 1.34
and 1.36, each with the kubectl and Helm its users have (1.32: kubectl v1.32.3 + Helm v3.17.2; 1.34: kubectl
v1.34.5 + Helm v4.1.4; 1.36: kubectl v1.36.3 + Helm v4.2.3; hack/envtest-assets.sh [--minor]).

Per minor: the chart's defaults and every overlay installed from nothing and uninstalled (nothing of the release
left, a pod the webhook would deny then admitted); an overlay whose API the server lacks stops with its
`gpu-stack:` message and creates nothing (DRA below 1.34, CEL mutation below 1.36); the webhook's verdicts on the
demo manifests through the API server; the CEL policies where served; `kubectl gpu-stack inspect`; an upgrade
to the next chart version that rolls no pod.

1.36 is the session's plane (tests/e2e/conftest.py, the one every other module uses); 1.32 and 1.34 are started
here, one at a time, each for its own tests (etcd + API server + controller manager of that minor, no
scheduler: the v1.36.2 one must not run against an older server; nothing here needs pods bound). The node suite
(tests/e2e/node) stays on 1.36.

What each minor gave is kubernetes-minors.json beside this file: every test here asserts its outcome is the one
recorded there, and `make generate` renders the support table of docs/kubernetes-versions.md and the README
from it (tests/test_generated.py: stale while they differ). After a deliberate change, record the new outcomes
with GPU_STACK_E2E_RECORD=1 and regenerate.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpu_stack_dev import controlplane
from gpu_stack_dev.chartlib import next_chart_version
from gpu_stack_dev.e2e.e2elib import POLICY_ONLY_NAMESPACE, E2ECluster, LiveWebhook, Releases, overlays
from gpu_stack_dev.inspect_cluster import NODES, PODS, chart_configmap

from tests.chart.test_kubernetes_versions import (
    CEL_LISTS,
    CEL_LISTS_REST,
    DRA,
    DRA_ALTERNATIVES,
    MAP,
    MAP_ALTERNATIVES,
)
from tests.require import skip_or_fail

from . import minors_results
from .inspect_api import api_client, apply_configmap, create_all, inspect
from .test_cel_policies import _apply, _wait_enforced, assert_cel_verdicts
from .test_install import STANDINS, apply_crds, assert_nothing_left, assert_pods_not_blocked, manifest_objects, present
from .test_prerequisites import assert_stopped_with
from .test_upgrade_rollouts import NEEDS_CRDS, changed, workloads
from .test_verdicts import MANIFESTS, Stack
from .test_verdicts import test_demo_manifest_verdict as judge_demo_manifest

MINORS = ("1.32", "1.34", "1.36")
# The kubectl and Helm each minor's users have (their minor versions).
TOOLS = {"1.32": ("v1.32.", "v3.17."), "1.34": ("v1.34.", "v4.1."), "1.36": ("v1.36.", "v4.2.")}
DRA_OVERLAYS = ("dra.yaml", "dra-mps-memory-slices.yaml")


@dataclass(frozen=True)
class Minor:
    minor: str
    cluster: E2ECluster
    server: str  # the API server's gitVersion
    probe_namespace: str  # where a pod the webhook would deny is created (dry run) after each uninstall

    def at_least(self, minor: str) -> bool:
        return tuple(map(int, self.minor.split("."))) >= tuple(map(int, minor.split(".")))


def record(minor: Minor, key: str, outcome: str) -> None:
    minors_results.record(minor.minor, key, outcome)


def _version(cluster: E2ECluster) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    return out


@pytest.fixture(scope="module", params=MINORS, ids=[f"k8s-{m}" for m in MINORS])
def minor(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Minor]:
    if request.param == "1.36":
        cluster: E2ECluster = request.getfixturevalue("cluster")
        yield Minor("1.36", cluster, _version(cluster)["serverVersion"]["gitVersion"], cluster.create_namespace())
        return
    if os.environ.get("GPU_STACK_E2E_CLUSTER") == "existing":
        pytest.skip("an older minor's plane beside a throwaway 1.36 plane only (an existing cluster has one version)")
    try:
        assets = controlplane.minor_assets(request.param)
    except controlplane.ControlPlaneError as exc:
        skip_or_fail(str(exc))
    started = time.monotonic()
    with controlplane.ControlPlane(assets, scheduler=False) as running:
        print(f"Kubernetes {request.param}: plane up in {time.monotonic() - started:.1f}s")
        base = E2ECluster.from_controlplane(running, tmp_path_factory.mktemp(f"helm-home-{request.param}"))
        # Helm 3 on 1.32 (3.17.2), Helm 4 on 1.34 (4.1.4): the one of the minor for every release.
        cluster = replace(base, helm3_bin=base.helm4_bin)
        server = _version(cluster)["serverVersion"]["gitVersion"]
        yield Minor(request.param, cluster, server, cluster.create_namespace())


@pytest.fixture
def releases_on(minor: Minor) -> Iterator[Releases]:
    helper = Releases(minor.cluster)
    try:
        yield helper
    finally:
        helper.cleanup()


def test_the_plane_and_the_tools_are_the_minors(minor: Minor) -> None:
    version = _version(minor.cluster)
    kubectl_prefix, helm_prefix = TOOLS[minor.minor]
    assert version["serverVersion"]["gitVersion"].startswith(f"v{minor.minor}.")
    assert version["clientVersion"]["gitVersion"].startswith(kubectl_prefix)
    helm = minor.cluster.helm("version", "--template", "{{ .Version }}").stdout
    assert helm.startswith(helm_prefix), helm
    kubectl = version["clientVersion"]["gitVersion"]
    if minors_results.RECORD:
        minors_results.write(minor.minor, lambda entry: entry.update(server=minor.server, kubectl=kubectl, helm=helm))
    entry = minors_results.recorded()[minor.minor]
    assert (entry["server"], entry["kubectl"], entry["helm"]) == (minor.server, kubectl, helm)


def dra_refusal(minor: Minor) -> str:
    return DRA + f"Kubernetes {minor.server}, which serves no resource.k8s.io DeviceClass" + DRA_ALTERNATIVES


@pytest.mark.older_minors_only  # on the session's 1.36 plane test_install.py installs every overlay (and records it)
@pytest.mark.parametrize("overlay", overlays())
def test_overlay_installs_and_uninstalls_or_stops_with_our_message(minor: Minor, releases_on: Releases,
                                                                   overlay: str) -> None:
    cluster = minor.cluster
    standins: list[str] = []
    try:
        if overlay in STANDINS:
            standins = apply_crds(cluster, STANDINS[overlay][0])
        release, proc = releases_on.install(overlay, check=False)
        if overlay in DRA_OVERLAYS and not minor.at_least("1.34"):
            assert_stopped_with(cluster, release, proc.returncode, proc.stderr, dra_refusal(minor))
            record(minor, f"install {overlay}", "refused")
            return
        assert proc.returncode == 0, proc.stdout + proc.stderr
        objects = manifest_objects(cluster, release)
        assert len(present(cluster, release, objects)) == len(objects)
        kinds = {kind for kind, _, _ in objects}
        assert {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"} <= kinds
        assert ("DaemonSet" in kinds) is (overlay not in POLICY_ONLY_NAMESPACE)
        if overlay in DRA_OVERLAYS:
            assert "DeviceClass" in kinds
        releases_on.uninstall(release)
        assert_nothing_left(cluster, release, objects)
        assert_pods_not_blocked(cluster, minor.probe_namespace)
        record(minor, f"install {overlay}", "yes")
    finally:
        if standins:
            cluster.kubectl("delete", "crd", *standins, "--ignore-not-found", "--wait=true", "--timeout=60s")


def test_upgrade_to_the_next_chart_version_rolls_no_pod(minor: Minor, releases_on: Releases, tmp_path: Path) -> None:
    release, _ = releases_on.install()
    before = workloads(minor.cluster, release.namespace)
    chart = next_chart_version(tmp_path)
    releases_on.upgrade(release, chart=chart, set_json={"webhook.timeoutSeconds": 7})
    history = json.loads(minor.cluster.helm("history", release.name, "-n", release.namespace, "-o", "json").stdout)
    assert [(h["revision"], h["status"]) for h in history] == [(1, "superseded"), (2, "deployed")]
    assert history[-1]["chart"] == f"gpu-stack-{yaml.safe_load((chart / 'Chart.yaml').read_text())['version']}"
    assert changed(before, workloads(minor.cluster, release.namespace)) == set()
    record(minor, "upgrade", "yes")


def test_webhook_verdicts_through_the_api_server(minor: Minor, releases_on: Releases, tmp_path: Path) -> None:
    """The demo manifests (hack/demo/manifests, each with its expected verdict) against the live webhook."""
    cluster = minor.cluster
    release, _ = releases_on.install("per-node-configs.yaml")
    namespace = cluster.create_namespace()
    releases_on.namespaces.append(namespace)
    hook = LiveWebhook(cluster, tmp_path / "webhook")
    try:
        hook.start(release, probe_namespace=namespace)
        stack = Stack(cluster, release, hook, namespace)
        for manifest in sorted(p.name for p in MANIFESTS.glob("*.yaml")):
            judge_demo_manifest(stack, manifest)
        assert not re.search(r"\b404\b", hook.log()), hook.log()
    finally:
        hook.stop()
    record(minor, "webhook mode", "yes")


def test_cel_validation(minor: Minor, releases_on: Releases, tmp_path: Path) -> None:
    """ValidatingAdmissionPolicy v1 is served on every minor here, but the policies' CEL (the lists extension)
    compiles on 1.36 only: below, the install stops with our message (v1.32.13 and v1.34.9 themselves refused the
    policies half way, "undeclared reference to 'lists'"). On 1.36 the policies refuse the bad manifests with the
    rules' messages and the live webhook mutates."""
    cluster = minor.cluster
    release, proc = releases_on.install(set_json={"webhook.validation.mode": "cel"}, check=False)
    if not minor.at_least("1.36"):
        assert_stopped_with(cluster, release, proc.returncode, proc.stderr, CEL_LISTS + minor.server + CEL_LISTS_REST)
        record(minor, "CEL validation", "refused")
        return
    assert proc.returncode == 0, proc.stderr
    namespace = cluster.create_namespace()
    releases_on.namespaces.append(namespace)
    hook = LiveWebhook(cluster, tmp_path / "webhook")
    try:
        hook.start(release)
        _wait_enforced(cluster, namespace)
        assert_cel_verdicts(cluster, namespace)
    finally:
        hook.stop()
    record(minor, "CEL validation", "yes")


def test_cel_mutation(minor: Minor, releases_on: Releases) -> None:
    """Below 1.36 (no MutatingAdmissionPolicy v1) the install stops with the message naming what was found."""
    cluster = minor.cluster
    release, proc = releases_on.install(set_json={"webhook.validation.mode": "cel", "webhook.mutation.mode": "cel"},
                                        webhook_image=None, check=False)
    if not minor.at_least("1.36"):
        found = f"Kubernetes {minor.server}, which serves no admissionregistration.k8s.io MutatingAdmissionPolicy"
        assert_stopped_with(cluster, release, proc.returncode, proc.stderr, MAP + found + MAP_ALTERNATIVES)
        record(minor, "CEL mutation", "refused")
        return
    assert proc.returncode == 0, proc.stderr
    namespace = cluster.create_namespace()
    releases_on.namespaces.append(namespace)
    _wait_enforced(cluster, namespace)
    request_only = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "request-only"},
                    "spec": {"containers": [{"name": "main", "image": "busybox",
                                             "resources": {"requests": {"nvidia.com/gpu": 1}}}]}}
    deadline = time.monotonic() + 60
    while _apply(cluster, namespace, request_only).returncode:  # the mutating policy takes effect a little later
        assert time.monotonic() < deadline, "the MutatingAdmissionPolicy never filled the limit"
        time.sleep(0.5)
    stored = cluster.get_json("pod", "request-only", "-n", namespace)
    assert stored["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    record(minor, "CEL mutation", "yes")
    # The API server drops an uninstalled MutatingAdmissionPolicy a little later: until it does, the next test's
    # GPU pods would still get runtimeClassName nvidia (GPU008's twin) on a plane without that RuntimeClass.
    releases_on.uninstall(release)
    one_gpu = {"nvidia.com/gpu": 1}
    probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "after-uninstall"},
             "spec": {"containers": [{"name": "main", "image": "busybox",
                                      "resources": {"requests": one_gpu, "limits": one_gpu}}]}}
    deadline = time.monotonic() + 60
    while True:
        proc = cluster.kubectl("create", "--dry-run=server", "-n", namespace, "-o", "json", "-f", "-",
                               input=json.dumps(probe), check=False)
        if proc.returncode == 0 and "runtimeClassName" not in json.loads(proc.stdout)["spec"]:
            break
        assert time.monotonic() < deadline, f"the MutatingAdmissionPolicies still act after uninstall: {proc.stderr}"
        time.sleep(0.5)


def test_inspect_as_a_kubectl_plugin(minor: Minor) -> None:
    """The 4-node cluster of tests/e2e/test_inspect_e2e.py, read by `kubectl gpu-stack inspect` (the minor's
    kubectl finds the plugin on PATH)."""
    cluster = minor.cluster
    api = api_client(cluster.kubeconfig)
    label = {"gpu-stack.io/e2e": "inspect-minor"}
    configmap = chart_configmap()
    configmap["metadata"]["namespace"] = "inspect-e2e"
    apply_configmap(api, configmap)
    create_all(api, NODES, PODS, label)
    try:
        result = inspect("-l", "gpu-stack.io/e2e=inspect-minor", "--configmap-namespace", "inspect-e2e",
                         "-o", "json", kubeconfig=Path(cluster.kubeconfig), kubectl=cluster.kubectl_bin)
        assert (result.returncode, result.stderr) == (0, "")
        # the GPU nodes and what they hold, as tests/e2e/test_inspect_e2e.py's exact output has them
        expected = json.loads((Path(__file__).parents[1] / "inspect" / "expected-4node.json").read_text())
        got = json.loads(result.stdout)
        assert [(n["name"], n.get("pods")) for n in got["nodes"]] == \
            [(n["name"], n.get("pods")) for n in expected["nodes"]]
    finally:
        cluster.kubectl("delete", "pods", "-A", "-l", "gpu-stack.io/e2e=inspect-minor", "--wait=false", check=False)
        cluster.kubectl("delete", "nodes", "-l", "gpu-stack.io/e2e=inspect-minor", "--wait=false", check=False)
    record(minor, "inspect", "yes")


def test_every_overlay_is_covered() -> None:
    """NEEDS_CRDS (the upgrade module's) and STANDINS name the same overlays: each gets its stand-in here."""
    assert set(NEEDS_CRDS) == set(STANDINS)
