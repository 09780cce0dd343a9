"""The API-server suite on every Kubernetes minor the chart claims (Chart.yaml kubeVersion >=1.32.0-0): 1.32, 1.34
and 1.36, each with the kubectl and Helm its users have (1.32: kubectl v1.32.3 + Helm v3.17.2; 1.34: kubectl
v1.34.5 + Helm v4.1.4; 1.36: kubectl v1.36.3 + Helm v4.2.3; hack/envtest-assets.sh [--minor]).

Per minor: the chart's defaults and every overlay installed from nothing and uninstalled (nothing of the release
left, a pod the webhook would deny then admitted); an overlay whose API the server lacks stops with its
`gpu-stack:` message and creates nothing (DRA below 1.34, CEL mutation below 1.36); the webhook's verdicts on the
demo manifests through the API server; the CEL policies where served; `kubectl gpu-stack inspect`; an upgrade
to the next chart version that rolls no pod.

Also per minor: the webhook's live readers as the chart runs them (its flags, its ServiceAccount; minors_readers.py
reads what it asked from its own debug log): claims and RuntimeClasses with lookups on, the ClusterPolicy in
policy-only mode where the GPU Operator's CRD is absent (GPU010 naming it, one ERROR line, asked once per follow
interval); the real GPU Operator v26.7.0 with policy only beside it (on 1.36: test_gpu_operator_policy.py). And
once, a 1.32 plane with DRA's beta switched on: the DRA overlays refused naming v1beta1, the webhook's v1 claim
reads not served (one request per API, one WARNING per API and rule, a privileged container beside a claim
refused as where a claim cannot be read).

1.36 is the session's plane (tests/e2e/conftest.py, the one every other module uses); 1.32 and 1.34 are started
here, one at a time, each for its own tests (etcd + API server + controller manager of that minor, no
scheduler: the v1.36.2 one must not run against an older server; nothing here needs pods bound). The node suite
(tests/e2e/node) stays on 1.36: a kubelet newer than its API server is outside Kubernetes' version skew policy.

`--wait`: every minor installs as test_install.py does on 1.36, without `helm install --wait`, and uninstalls
with `helm uninstall --wait`. No plane here has a kubelet, so the pods the chart expects (its Deployments: the
webhook, NFD's master and gc) are created but never Ready, and `--wait` could only time out; its DaemonSets want
a pod per GPU node, and there is none. What can honestly be waited for is (test_install.assert_workload_pods_created):
each workload's pods made by that minor's controller manager through that minor's admission and pod validation
(a field an older server refuses would show as a FailedCreate). The chart has no Job and no install hook; its
`helm test` pods need a node (tests/e2e/node runs them, and `--wait`, on 1.36).

Cost (--durations=0, 2026-11-29, on the repository's 2-core machine shared with three other engineers' test runs,
load average about 6: an upper bound for CI's 2 cores, within the 6 minutes each added minor may cost): 1.32
4 min 07 s, 1.34 4 min 04 s (plane start 13 s, the 17 overlays 1 min 50 s / 2 min 15 s, the real GPU Operator
beside policy only 48 s / 28 s, the live readers 39 s / 34 s, the rest about 35 s); the 1.36 column 1 min 29 s
(its plane, overlays and operator are other modules'); the 1.32 plane with DRA's beta 21 s. Sharing: the plane
start is 5 % of a minor, and on 2 cores planes or installs side by side compete for the same CPUs (the two minors
side by side saved no time), so the minors run one after the other (docs/kubernetes-versions.md, "Cost").

What each minor gave is kubernetes-minors.json beside this file: every test here asserts its outcome is the one
recorded there, and `make generate` renders the support table of docs/kubernetes-versions.md and the README
from it (tests/test_generated.py: stale while they differ). After a deliberate change, record the new outcomes
with GPU_STACK_E2E_RECORD=1 and regenerate.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpu_stack_dev import controlplane
from gpu_stack_dev.chartlib import next_chart_version
from gpu_stack_dev.e2e import gpu_operator
from gpu_stack_dev.e2e.e2elib import POLICY_ONLY_NAMESPACE, E2ECluster, LiveWebhook, Releases, overlays, unique
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

from . import minors_readers as readers
from . import minors_results
from .inspect_api import api_client, apply_configmap, create_all, inspect
from .test_cel_policies import _apply, _wait_enforced, assert_cel_verdicts
from .test_gpu_operator_policy import Stack as OperatorStack
from .test_gpu_operator_policy import test_installed_before_the_operator_its_pods_are_admitted as its_pods_are_admitted
from .test_gpu_operator_policy import test_the_operators_objects_cannot_be_borrowed as its_objects_cannot_be_borrowed
from .test_install import (
    STANDINS,
    apply_crds,
    assert_nothing_left,
    assert_pods_not_blocked,
    assert_workload_pods_created,
    manifest_objects,
    present,
)
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
def releases_on_beta(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Releases]:
    """A 1.32 plane with DRA's beta switched on, as a user would (the feature gate and --runtime-config)."""
    if os.environ.get("GPU_STACK_E2E_CLUSTER") == "existing":
        pytest.skip("a 1.32 plane of its own beside a throwaway 1.36 plane only")
    try:
        assets = controlplane.minor_assets("1.32")
    except controlplane.ControlPlaneError as exc:
        skip_or_fail(str(exc))
    beta = ("--feature-gates=DynamicResourceAllocation=true", "--runtime-config=resource.k8s.io/v1beta1=true")
    with controlplane.ControlPlane(assets, scheduler=False, apiserver_args=beta) as running:
        base = E2ECluster.from_controlplane(running, tmp_path_factory.mktemp("helm-home-1.32-dra-beta"))
        helper = Releases(replace(base, helm3_bin=base.helm4_bin))
        try:
            yield helper
        finally:
            helper.cleanup()


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
        assert any(assert_workload_pods_created(cluster, release).values())  # as test_install.py's lifecycle
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
        assert not readers.not_found_lines(hook.log()), hook.log()
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
        # the ResourceSlices it reads: below 1.34 none are served, and the report says so
        not_served = ["DRA devices not read: the API server does not serve resource.k8s.io/v1 resourceslices "
                      "(Kubernetes before 1.34, or DRA switched off)"]
        assert [n for n in got["notes"] if n.startswith("DRA ")] == ([] if minor.at_least("1.34") else not_served)
    finally:
        cluster.kubectl("delete", "pods", "-A", "-l", "gpu-stack.io/e2e=inspect-minor", "--wait=false", check=False)
        cluster.kubectl("delete", "nodes", "-l", "gpu-stack.io/e2e=inspect-minor", "--wait=false", check=False)
    record(minor, "inspect", "yes")


@pytest.mark.older_minors_only  # on 1.36: tests/e2e/test_gpu_operator_policy.py (which records that column)
def test_policy_only_beside_the_real_gpu_operator(minor: Minor, releases_on: Releases, tmp_path: Path) -> None:
    """The real GPU Operator v26.7.0 on this minor (its chart's kubeVersion is ">= 1.16.0-0", and it discovers which
    resource.k8s.io version the server serves, if any: deployments/gpu-operator/Chart.yaml and
    controllers/clusterinfo/clusterinfo.go at v26.7.0), gpu-stack policy only beside it: the operator's own pods,
    the validator's among them, admitted; its objects not borrowed (test_gpu_operator_policy.py's two cases)."""
    if gpu_operator.source_dir() is None:
        skip_or_fail("no GPU Operator build (../shared/gpu-operator or GPU_STACK_GPU_OPERATOR_SRC)")
    with gpu_operator.GpuOperator(minor.cluster, tmp_path / "operator", namespace=unique("nv-operator")) as running:
        (tmp_path / "stack").mkdir()
        stack = OperatorStack(running, releases_on, tmp_path / "stack")
        try:
            its_pods_are_admitted(stack)
            its_objects_cannot_be_borrowed(stack)
        finally:
            stack.stop()
    record(minor, "beside the GPU Operator", "yes")


def test_every_overlay_is_covered() -> None:
    """NEEDS_CRDS (the upgrade module's) and STANDINS name the same overlays: each gets its stand-in here."""
    assert set(NEEDS_CRDS) == set(STANDINS)


def test_live_readers_read_what_the_server_serves(minor: Minor, releases_on: Releases, tmp_path: Path) -> None:
    """The webhook as the chart runs it with lookups (webhook.lookups.enabled: claims read, RuntimeClasses followed),
    on this minor's API server. On 1.32 (DRA off) the API server itself drops a pod's resourceClaims, so the webhook
    never sees one and asks nothing of resource.k8s.io: the pods are plain pods, and judged so. Where claims are
    served a missing claim is read once (cached) and a privileged container beside it refused (GPU003)."""
    cluster = minor.cluster
    release, _ = releases_on.install(set_json={"webhook.lookups.enabled": True})
    namespace = cluster.create_namespace()
    releases_on.namespaces.append(namespace)
    nvidia = unique("e2e-nvidia")
    cluster.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                                                          "metadata": {"name": nvidia}, "handler": "nvidia"}))
    workload = readers.workload(nvidia)
    try:
        hook = readers.start_as_the_chart_runs_it(cluster, release, tmp_path / "lookups", namespace)
        try:
            seen = [{name: readers.verdict(cluster, namespace, obj)[0] for name, obj in workload.items()}
                    for _ in range(2)]
            stored = json.loads(cluster.kubectl("create", "--dry-run=server", "-n", namespace, "-o", "json", "-f", "-",
                                                input=json.dumps(workload["claim"])).stdout)
        finally:
            hook.stop()
    finally:
        cluster.kubectl("delete", "runtimeclass", nvidia, "--ignore-not-found", check=False)
    log = hook.log()
    dra = minor.at_least("1.34")
    assert seen == [readers.expected_verdicts(dra_served=dra)] * 2
    assert ("resourceClaims" in stored["spec"]) is dra
    # each claim read once (the second round is the lookup cache's), nothing where the server dropped them
    claims = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/"
    assert readers.api_requests(log, "/apis/resource.k8s.io/") == (
        [("GET", claims + "one-gpu", 404), ("GET", claims + "other-gpu", 404)] if dra else [])
    assert readers.api_requests(log, "/apis/node.k8s.io/v1/runtimeclasses")  # the live RuntimeClasses, read
    assert (readers.ours(log, "WARNING"), readers.ours(log, "ERROR")) == ([], [])
    releases_on.uninstall(release)
    record(minor, "webhook lookups", "yes")


def test_policy_only_without_the_operators_crd_says_so(minor: Minor, releases_on: Releases, tmp_path: Path) -> None:
    """policy-only-gpu-operator.yaml on a cluster without the GPU Operator (no ClusterPolicy CRD): GPU pods refused
    (GPU010) naming what is missing, others admitted; one ERROR line; the ClusterPolicy asked once per follow
    interval (--policy-source-interval 1s), not in a retry loop."""
    cluster = minor.cluster
    # On the session's plane another module's operator may have just removed it (its deletion ends in moments).
    cluster.kubectl("wait", "--for=delete", "crd/clusterpolicies.nvidia.com", "--timeout=60s", check=False)
    assert cluster.kubectl("get", "crd", "clusterpolicies.nvidia.com", "--ignore-not-found", "-o", "name").stdout == ""
    release, _ = releases_on.install("policy-only-gpu-operator.yaml")
    namespace = cluster.create_namespace()
    releases_on.namespaces.append(namespace)
    hook = readers.start_as_the_chart_runs_it(cluster, release, tmp_path / "operator", namespace)
    try:
        gpu = readers.verdict(cluster, namespace, readers.pod("gpu", gpus=1))
        plain = readers.verdict(cluster, namespace, readers.pod("plain"))
        time.sleep(5)  # a few follow intervals
    finally:
        hook.stop()
    assert gpu[1].endswith(readers.DENIED + readers.NO_CLUSTER_POLICY), gpu[1]
    assert plain == ("allowed", "")
    log = hook.log()
    assert readers.ours(log, "ERROR") == ["GPU pods are denied: GPU Operator ClusterPolicy cluster-policy and the "
                                          "cluster's RuntimeClasses cannot be read"]
    asked = readers.request_times(log, "/apis/nvidia.com/v1/clusterpolicies/cluster-policy")
    assert len(asked) >= 3, asked
    gaps = [later - earlier for earlier, later in itertools.pairwise(asked)]
    assert min(gaps) >= 0.5, gaps  # once per 1 s interval (a retry loop asks within milliseconds)


def test_dra_beta_switched_on_is_not_used(releases_on_beta: Releases, tmp_path: Path) -> None:
    """Kubernetes 1.32 with DRA's beta switched on (DynamicResourceAllocation gate, resource.k8s.io/v1beta1): the
    DRA overlays stop with the message naming v1beta1; the webhook, reading claims as v1, gets "404 page not found"
    (not served): a privileged container beside a claim is refused as where the claim cannot be read (GPU003, the
    note saying why), each API is asked once however many pods name claims, one WARNING per API and rule."""
    cluster = releases_on_beta.cluster
    release, proc = releases_on_beta.install("dra.yaml", check=False)
    server = _version(cluster)["serverVersion"]["gitVersion"]
    found = (f"Kubernetes {server}, which serves resource.k8s.io DeviceClass only as v1beta1, which the chart does "
             "not use")
    assert_stopped_with(cluster, release, proc.returncode, proc.stderr, DRA + found + DRA_ALTERNATIVES)
    release, _ = releases_on_beta.install(set_json={"webhook.lookups.enabled": True})
    namespace = cluster.create_namespace()
    releases_on_beta.namespaces.append(namespace)
    hook = readers.start_as_the_chart_runs_it(cluster, release, tmp_path / "lookups", namespace)
    try:
        seen = [readers.verdict(cluster, namespace, readers.pod(f"p{i}", claim=f"claim-{i}", privileged=True))
                for i in range(3)]
        template = readers.pod("t", claim="one-gpu", privileged=True)
        template["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
        seen.append(readers.verdict(cluster, namespace, template))
    finally:
        hook.stop()
    not_served = "the API server does not serve resource.k8s.io/v1 {0}, so the rule cannot read {0}"
    for i, (outcome, printed) in enumerate(seen[:3]):
        assert outcome == "denied: GPU003", printed
        assert f'(claim "gpu" (ResourceClaim "claim-{i}"): {not_served.format("resourceclaims")})' in printed, printed
    assert seen[3][0] == "denied: GPU003" and not_served.format("resourceclaimtemplates") in seen[3][1], seen[3]
    log = hook.log()
    assert [path.rsplit("/", 2)[1] for _, path, _ in readers.api_requests(log, "/apis/resource.k8s.io/")] == [
        "resourceclaims", "resourceclaimtemplates"]
    # once per API and rule that asked (GPU002 and GPU003 read these pods' claims), however many pods
    assert readers.ours(log, "WARNING") == [
        f"the API server does not serve resource.k8s.io/v1 {what}: rule {rule} cannot be applied to the pods' {what} "
        "on this API server" for what in ("resourceclaims", "resourceclaimtemplates") for rule in ("GPU002", "GPU003")]
