"""The CEL admission policies on a real API server (v1.36 serves Validating- and MutatingAdmissionPolicy v1).

- `cel` for both modes: the chart renders no webhook at all and installs without a webhook image; bad
  manifests (env, privileged, CDI, device mount, Pod and Deployment) are refused with the rules' messages by
  the policies, good ones are created, an MPS pod is stored with hostIPC and the MPS toleration, a
  requests-only GPU pod with its limit.
- `both`: the same manifests get the same verdicts from the policies and from the (live) webhook.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from gpu_stack_dev.e2e.admission_policies import wait_not_enforced
from gpu_stack_dev.e2e.e2elib import ROOT, E2ECluster, Release, Releases

DEMO = ROOT / "hack" / "demo" / "manifests"
ALL_CEL = {"webhook.validation.mode": "cel", "webhook.mutation.mode": "cel"}


def _pod(name: str, container: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, **meta},
            "spec": {"containers": [{"name": "main", "image": "busybox", **container}]}}


def _deployment(name: str, pod: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}, **pod["metadata"]}, "spec": pod["spec"]}}}


def _claim(name: str, exactly: dict[str, Any], *, template: bool = False,
           sharing: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}
    if sharing:
        spec["devices"]["config"] = [{"opaque": {"driver": "gpu.nvidia.com", "parameters": {
            "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": sharing}}}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate" if template else "ResourceClaim",
            "metadata": {"name": name}, "spec": {"spec": spec} if template else spec}


GPU = {"resources": {"limits": {"nvidia.com/gpu": 1}}}
# A GPU pod: in the chart's default runtime-class layout only GPU pods run under the NVIDIA runtime (GPU002).
ENV = {"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}], **GPU}
# (manifest, the text the refusal must contain)
BAD: dict[str, tuple[dict[str, Any], str]] = {
    "env-pod": (_pod("env", ENV), 'GPU002 container "main" sets NVIDIA_VISIBLE_DEVICES explicitly; GPUs are '
                "assigned by the device plugin, request nvidia.com/gpu instead (spec.containers[0].env[0])"),
    "env-deployment": (_deployment("env", _pod("env", ENV)),
                       'GPU002 container "main" sets NVIDIA_VISIBLE_DEVICES explicitly; GPUs are assigned by the '
                       "device plugin, request nvidia.com/gpu instead (spec.template.spec.containers[0].env[0])"),
    "privileged-pod": (_pod("priv", {**GPU, "securityContext": {"privileged": True}}),
                       'GPU003 container "main" is privileged in a GPU pod and would see every GPU on the node; '
                       "remove securityContext.privileged (spec.containers[0].securityContext.privileged)"),
    "privileged-deployment": (_deployment("priv", _pod("priv", {**GPU, "securityContext": {"privileged": True}})),
                              'GPU003 container "main" is privileged in a GPU pod'),
    "cdi-pod": (_pod("cdi", {}, annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=all"}),
                'GPU007 annotation "cdi.k8s.io/gpu" requests CDI devices directly; request nvidia.com/gpu instead '
                "(metadata.annotations[cdi.k8s.io/gpu])"),
    "cdi-deployment": (_deployment("cdi", _pod("cdi", {}, annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=all"})),
                       "GPU007 annotation \"cdi.k8s.io/gpu\" requests CDI devices directly"),
    # DRA: what CEL can see of a pod (a deviceclass resource of a GPU class) and GPU009 on the claims.
    "deviceclass-privileged-pod": (
        _pod("dcpriv", {"resources": {"limits": {"deviceclass.resource.kubernetes.io/gpu.nvidia.com": 1}},
                        "securityContext": {"privileged": True}}),
        'GPU003 container "main" is privileged in a pod holding GPUs by '
        "deviceclass.resource.kubernetes.io/gpu.nvidia.com and would see every GPU on the node"),
    "allocation-all-claim": (
        _claim("all", {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}),
        'GPU009 request "gpu" asks for allocationMode All of DeviceClass gpu.nvidia.com (every matching GPU of a '
        "node)"),
    "mps-claim-template": (
        _claim("mps", {"deviceClassName": "mig.nvidia.com"}, template=True, sharing={"strategy": "MPS"}),
        "GPU009 GPU sharing strategy MPS is not enabled for the NVIDIA DRA driver; set "
        "webhook.policy.dra.sharingStrategies to include MPS"),
}
GOOD = {
    "gpu-claim": _claim("one", {"deviceClassName": "gpu.nvidia.com"}),
    "gpu-pod": _pod("gpu", GPU),
    "gpu-deployment": _deployment("gpu", _pod("gpu", GPU)),
    "plain-pod": _pod("plain", {"env": [{"name": "CUDA_VISIBLE_DEVICES", "value": "0"}]}),
}


def _apply(cluster: E2ECluster, namespace: str, obj: dict[str, Any]) -> Any:
    return cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(obj), check=False)


def _wait_enforced(cluster: E2ECluster, namespace: str, timeout: float = 60) -> None:
    """Policies take effect once the API server's policy informers have them."""
    deadline = time.monotonic() + timeout
    probe = _pod("probe", ENV)
    while "GPU002" not in (proc := cluster.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-",
                                                     input=json.dumps(probe), check=False)).stderr:
        assert time.monotonic() < deadline, f"the policies are not enforced: {proc.stderr}"
        time.sleep(0.5)


def _wait_refused(cluster: E2ECluster, namespace: str, obj: dict[str, Any], timeout: float = 60) -> None:
    """Policies and bindings reach the API server's admission plugin one informer event at a time, so one
    policy enforced (_wait_enforced) does not mean every one is: wait for this object's, by dry-run."""
    deadline = time.monotonic() + timeout
    while "ValidatingAdmissionPolicy" not in (proc := cluster.kubectl(
            "create", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(obj), check=False)).stderr:
        assert time.monotonic() < deadline, f"not refused by a policy in {timeout} s: {proc.stdout}{proc.stderr}"
        time.sleep(0.5)


@pytest.fixture(autouse=True)
def policies_gone_after_each_test(cluster: E2ECluster, releases: Releases) -> Iterator[None]:
    yield
    releases.cleanup()
    wait_not_enforced(cluster)


def _install_cel(cluster: E2ECluster, releases: Releases, overlay: str | None = None) -> str:
    release, _ = releases.install(overlay, set_json=ALL_CEL, webhook_image=None)  # no webhook pod: no image
    return _no_webhook_and_enforced(cluster, release)


def _no_webhook_and_enforced(cluster: E2ECluster, release: Release) -> str:
    for kind in ("deployment", "service", "secret"):
        names = cluster.kubectl("get", kind, "-n", release.namespace, "-l", "app.kubernetes.io/component=webhook",
                                "-o", "name").stdout.split()
        assert names == [], f"a webhook {kind} in cel mode: {names}"
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        assert cluster.kubectl("get", kind, "-l", release.selector, "-o", "name").stdout.split() == []
    namespace = cluster.create_namespace()
    _wait_enforced(cluster, namespace)
    return namespace


def test_cel_only_install_needs_no_webhook_image(cluster: E2ECluster, releases: Releases) -> None:
    """README, "Install on a cluster": without an image, the two modes set and nothing else."""
    release, _ = releases.install(webhook_image=None, extra=["--set", "webhook.validation.mode=cel",
                                                             "--set", "webhook.mutation.mode=cel"])
    status = json.loads(cluster.helm("status", release.name, "-n", release.namespace, "-o", "json").stdout)
    assert status["info"]["status"] == "deployed"
    supplied = json.loads(cluster.helm("get", "values", release.name, "-n", release.namespace, "-o", "json").stdout)
    assert supplied == {"webhook": {"validation": {"mode": "cel"}, "mutation": {"mode": "cel"}}}
    _no_webhook_and_enforced(cluster, release)


def test_cel_mode_refuses_bad_manifests_with_the_rules_messages_and_admits_good_ones(
        cluster: E2ECluster, releases: Releases) -> None:
    assert_cel_verdicts(cluster, _install_cel(cluster, releases))


def assert_cel_verdicts(cluster: E2ECluster, namespace: str) -> None:
    """Every BAD manifest refused by its ValidatingAdmissionPolicy with the rule's message, every GOOD one admitted
    (tests/e2e/test_kubernetes_minors.py asks the same of each minor)."""
    for case, (manifest, message) in BAD.items():
        _wait_refused(cluster, namespace, manifest)
        proc = _apply(cluster, namespace, manifest)
        assert proc.returncode == 1, (case, proc.stdout)
        assert "ValidatingAdmissionPolicy" in proc.stderr and message in proc.stderr, (case, proc.stderr)
    for case, manifest in GOOD.items():
        proc = _apply(cluster, namespace, manifest)
        assert proc.returncode == 0, (case, proc.stderr)


def test_cel_mode_mismatch_is_refused_before_the_policies(cluster: E2ECluster, releases: Releases) -> None:
    """request != limit: the API server's own validation (after mutation, before validating admission)
    refuses it; the webhook's early GPU001 denial has no CEL counterpart (README)."""
    namespace = _install_cel(cluster, releases)
    manifest = yaml.safe_load((DEMO / "14-gpu-request-limit-mismatch.yaml").read_text())
    proc = _apply(cluster, namespace, manifest)
    assert proc.returncode == 1
    assert "must be equal to nvidia.com/gpu limit of 1" in proc.stderr, proc.stderr


def test_cel_mutations_fill_the_limit_and_inject_mps(cluster: E2ECluster, releases: Releases) -> None:
    # per-node-configs: MPS beside exclusive configs (on mps-x10 every config is MPS, so every GPU pod is an
    # MPS pod, tests/e2e/test_placement.py)
    namespace = _install_cel(cluster, releases, "per-node-configs.yaml")
    request_only = yaml.safe_load((DEMO / "13-gpu-request-only.yaml").read_text())
    _apply(cluster, namespace, request_only).check_returncode()
    stored = cluster.get_json("pod", request_only["metadata"]["name"], "-n", namespace)
    assert stored["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert "hostIPC" not in stored["spec"]  # it could land on the exclusive "default" config: not an MPS pod
    mps_pod = yaml.safe_load((DEMO / "03-nvidia-mps-pod.yaml").read_text())  # selects the mps-x10 config
    _apply(cluster, namespace, mps_pod).check_returncode()
    stored = cluster.get_json("pod", mps_pod["metadata"]["name"], "-n", namespace)
    assert stored["spec"]["hostIPC"] is True
    assert {"key": "gpu-stack.io/mps", "operator": "Exists", "effect": "NoSchedule"} in stored["spec"]["tolerations"]
    opt_in = yaml.safe_load((DEMO / "15-mps-opt-in-annotation.yaml").read_text())
    _apply(cluster, namespace, opt_in).check_returncode()
    stored = cluster.get_json("pod", opt_in["metadata"]["name"], "-n", namespace)
    assert stored["spec"]["nodeSelector"]["nvidia.com/mps.capable"] == "true"
    assert stored["spec"]["hostIPC"] is True


def test_both_mode_gives_the_same_verdicts_from_policies_and_webhook(cluster: E2ECluster, releases: Releases,
                                                                    live_webhook: Any) -> None:
    release, _ = releases.install(set_json={"webhook.validation.mode": "both"})
    namespace = cluster.create_namespace()
    live_webhook(release)
    _wait_enforced(cluster, namespace)
    # The webhook is called once a requests-only GPU pod passes: its /mutate fills the limit that the
    # API server's validation would otherwise miss.
    deadline = time.monotonic() + 60
    while cluster.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-", check=False, input=json.dumps(
            _pod("probe", {"resources": {"requests": {"nvidia.com/gpu": 1}}}))).returncode:
        assert time.monotonic() < deadline, "the API server does not call the live webhook"
        time.sleep(0.5)
    # The policies answer first (ValidatingAdmissionPolicy runs before the validating webhooks) ...
    for case, (manifest, message) in BAD.items():
        proc = _apply(cluster, namespace, {**manifest, "metadata": {**manifest["metadata"], "name": f"{case}-1"}})
        assert proc.returncode == 1 and "ValidatingAdmissionPolicy" in proc.stderr, (case, proc.stderr)
        assert message in proc.stderr, (case, proc.stderr)
    # ... and without their bindings the webhook refuses the same manifests with the same messages.
    cluster.kubectl("delete", "validatingadmissionpolicybinding", "-l", release.selector)

    def still_enforced() -> list[str]:
        """The cases a policy still denies: the API server drops each deleted binding on its own watch
        event, so one policy can still answer after another has gone."""
        return [case for case, (manifest, _) in BAD.items()
                if "ValidatingAdmissionPolicy" in cluster.kubectl("create", "--dry-run=server", "-n", namespace,
                                                                   "-f", "-", input=json.dumps(manifest),
                                                                   check=False).stderr]

    deadline = time.monotonic() + 60
    while enforced := still_enforced():
        assert time.monotonic() < deadline, f"the policy bindings are still enforced for {enforced}"
        time.sleep(0.5)
    for case, (manifest, message) in BAD.items():
        proc = _apply(cluster, namespace, {**manifest, "metadata": {**manifest["metadata"], "name": f"{case}-2"}})
        assert proc.returncode == 1, (case, proc.stdout)
        assert 'admission webhook "validate.gpu-stack.io" denied the request' in proc.stderr, (case, proc.stderr)
        assert message in proc.stderr, (case, proc.stderr)
    for case, manifest in GOOD.items():
        assert _apply(cluster, namespace, manifest).returncode == 0, case


def test_cel_mutation_gives_an_mps_claim_the_default_memory_limit(cluster: E2ECluster, releases: Releases) -> None:
    """GPU009's MutatingAdmissionPolicy on resource.k8s.io/v1 claims, read back from the API server."""
    settings = {**ALL_CEL, "webhook.policy.dra.sharingStrategies": ["MPS"],
                "webhook.policy.dra.mpsDefaultPinnedDeviceMemoryLimit": "4Gi"}
    release, _ = releases.install(set_json=settings, webhook_image=None)
    namespace = _no_webhook_and_enforced(cluster, release)
    claim = _claim("mps", {"deviceClassName": "gpu.nvidia.com"}, sharing={"strategy": "MPS"})
    deadline = time.monotonic() + 60
    while True:  # the mutating policy takes effect once the API server's informers have it
        cluster.kubectl("delete", "resourceclaim", "mps", "-n", namespace, "--ignore-not-found")
        _apply(cluster, namespace, claim).check_returncode()
        stored = cluster.get_json("resourceclaim", "mps", "-n", namespace)
        sharing = stored["spec"]["devices"]["config"][0]["opaque"]["parameters"]["sharing"]
        if "mpsConfig" in sharing or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert sharing == {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "4Gi"}}
