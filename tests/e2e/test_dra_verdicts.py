"""GPUs from Dynamic Resource Allocation through real kubectl and a real API server (resource.k8s.io/v1):
the NVIDIA DRA driver's DeviceClasses created here, the chart installed with MPS sharing and a default MPS
memory limit in its DRA policy, the live webhook reading ResourceClaims/Templates as the chart's
ServiceAccount (its ClusterRole's `get`). Refusals carry our text; an MPS claim is stored with the default."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from gpu_stack_dev.e2e.e2elib import E2ECluster, LiveWebhook, Release, Releases

from .test_lookups import create
from .test_tls_selfmanaged import sa_kubeconfig

DENIED = 'Error from server (Forbidden): error when creating "STDIN": admission webhook "validate.gpu-stack.io" ' \
         "denied the request: "
# kubernetes-sigs/dra-driver-nvidia-gpu v0.4.1 deployments/helm/dra-driver-nvidia-gpu/templates/deviceclass-*.yaml
# (tests/webhook/test_dra_upstream.py pins them).
_TYPES = (("gpu.nvidia.com", "gpu"), ("mig.nvidia.com", "mig"), ("vfio.gpu.nvidia.com", "vfio"))
DEVICE_CLASSES = {name: f"device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == '{t}'"
                  for name, t in _TYPES}
DRA_POLICY = {"webhook.policy.dra.sharingStrategies": ["MPS"],
              "webhook.policy.dra.mpsDefaultPinnedDeviceMemoryLimit": "8Gi"}


def device_classes() -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
         "spec": {"selectors": [{"cel": {"expression": expression}}]}}
        for name, expression in DEVICE_CLASSES.items()]})


def template(name: str, sharing: dict[str, Any] | None = None, kind: str = "ResourceClaimTemplate",
             **request: Any) -> str:
    spec: dict[str, Any] = {"devices": {"requests": [
        {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", **request}}]}}
    if sharing is not None:
        spec["devices"]["config"] = [{"requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {
            "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": sharing}}}]
    body = {"spec": spec} if kind == "ResourceClaimTemplate" else spec
    return json.dumps({"apiVersion": "resource.k8s.io/v1", "kind": kind, "metadata": {"name": name}, "spec": body})


def container(name: str, *, claim: bool = False, security: dict[str, Any] | None = None,
              limits: dict[str, Any] | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "busybox"}
    resources: dict[str, Any] = {}
    if claim:
        resources["claims"] = [{"name": "gpu"}]
    if limits:
        resources["limits"] = limits
    if resources:
        c["resources"] = resources
    if security:
        c["securityContext"] = security
    return c


def pod(name: str, *containers: dict[str, Any], claim_template: str | None = "one-gpu") -> str:
    spec: dict[str, Any] = {"containers": list(containers)}
    if claim_template:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": claim_template}]
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})


class Dra:
    def __init__(self, cluster: E2ECluster, release: Release, hook: LiveWebhook, namespace: str) -> None:
        self.cluster, self.release, self.hook, self.namespace = cluster, release, hook, namespace

    def create(self, manifest: str, namespace: str | None = None) -> tuple[int, str, str]:
        return create(self.cluster, namespace or self.namespace, manifest)


@pytest.fixture(scope="module")
def dra(cluster: E2ECluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dra]:
    releases = Releases(cluster)
    workdir = tmp_path_factory.mktemp("dra-webhook")
    hook = LiveWebhook(cluster, workdir / "webhook")
    cluster.kubectl("create", "-f", "-", input=device_classes())
    try:
        release, _ = releases.install(set_json=DRA_POLICY)
        namespace = cluster.create_namespace()
        releases.namespaces.append(namespace)
        kubeconfig = sa_kubeconfig(cluster, release, workdir / "sa.kubeconfig")
        hook.start(release, extra_args=["--kubeconfig", str(kubeconfig), "--cluster-lookups"],
                   probe_namespace=namespace)
        yield Dra(cluster, release, hook, namespace)
    finally:
        hook.stop()
        releases.cleanup()
        cluster.kubectl("delete", "deviceclass", *DEVICE_CLASSES, "--ignore-not-found", check=False)


def test_a_gpu_claim_template_and_a_plain_pod_are_admitted(dra: Dra) -> None:
    assert dra.create(template("one-gpu")) == (0, "resourceclaimtemplate.resource.k8s.io/one-gpu created", "")
    assert dra.create(pod("plain", container("main", claim=True))) == (0, "pod/plain created", "")


def test_a_privileged_container_with_a_gpu_claim_is_refused(dra: Dra) -> None:
    dra.create(template("one-gpu"))
    code, _, err = dra.create(pod("priv", container("main", claim=True, security={"privileged": True})))
    assert (code, err) == (1, DENIED + 'GPU003 container "main" is privileged in a pod holding GPUs by claim "gpu" '
                           '(ResourceClaimTemplate "one-gpu") and would see every GPU on the node; remove '
                           "securityContext.privileged (spec.containers[0].securityContext.privileged)")


def test_a_sys_admin_sidecar_without_a_claim_is_refused(dra: Dra) -> None:
    dra.create(template("one-gpu"))
    code, _, err = dra.create(pod("sidecar", container("main", claim=True),
                                  container("side", security={"capabilities": {"add": ["SYS_ADMIN"]}})))
    assert code == 1
    assert err.startswith(DENIED + 'GPU003 container "side" adds capability SYS_ADMIN in a pod holding GPUs by '
                          'claim "gpu" (ResourceClaimTemplate "one-gpu") without a GPU of its own'), err


def test_a_deployment_is_judged_at_apply_through_its_template_claim(dra: Dra) -> None:
    dra.create(template("one-gpu"))
    spec = json.loads(pod("x", container("main", claim=True, security={"privileged": True})))["spec"]
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "priv"}, "spec": {
        "selector": {"matchLabels": {"app": "priv"}},
        "template": {"metadata": {"labels": {"app": "priv"}}, "spec": spec}}}
    code, _, err = dra.create(json.dumps(deployment))
    assert code == 1 and 'GPU003 container "main" is privileged in a pod holding GPUs by claim "gpu"' in err, err


def test_a_deviceclass_extended_resource_with_privileged_is_refused(dra: Dra) -> None:
    manifest = pod("ext", container("main", security={"privileged": True},
                                    limits={"deviceclass.resource.kubernetes.io/gpu.nvidia.com": 1}),
                   claim_template=None)
    code, _, err = dra.create(manifest)
    assert (code, err) == (1, DENIED + 'GPU003 container "main" is privileged in a pod holding GPUs by '
                           "deviceclass.resource.kubernetes.io/gpu.nvidia.com and would see every GPU on the node; "
                           "remove securityContext.privileged (spec.containers[0].securityContext.privileged)")


def test_admin_access_outside_the_policys_namespaces_is_refused(dra: Dra) -> None:
    # The API server's own requirement is met (the namespace label); the policy names no namespace.
    labelled = dra.cluster.create_namespace(labels={"resource.kubernetes.io/admin-access": "true"})
    code, _, err = dra.create(template("admin", kind="ResourceClaim", adminAccess=True), labelled)
    assert (code, err) == (1, DENIED + 'GPU009 request "gpu" asks for adminAccess to DeviceClass gpu.nvidia.com, '
                           f"which reaches GPUs other pods hold, in namespace {labelled}; allowed only in the "
                           "namespaces of policy dra.adminAccessNamespaces "
                           "(spec.devices.requests[0].exactly.adminAccess)")
    dra.cluster.kubectl("delete", "namespace", labelled, "--wait=false")


def test_an_mps_claim_is_stored_with_the_default_memory_limit(dra: Dra) -> None:
    code, out, err = dra.create(template("mps", {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}},
                                         kind="ResourceClaim"))
    assert (code, out) == (0, "resourceclaim.resource.k8s.io/mps created"), err
    assert err == ("Warning: gpu-stack GPU009: MPS claim: set mpsConfig.defaultPinnedDeviceMemoryLimit=8Gi "
                   "(policy default)")
    stored = json.loads(dra.cluster.kubectl("get", "resourceclaim", "mps", "-n", dra.namespace, "-o", "json").stdout)
    parameters = stored["spec"]["devices"]["config"][0]["opaque"]["parameters"]
    assert parameters["sharing"]["mpsConfig"] == {"defaultActiveThreadPercentage": 50,
                                                  "defaultPinnedDeviceMemoryLimit": "8Gi"}


def test_a_sharing_strategy_the_chart_did_not_enable_is_refused_with_the_values_key(dra: Dra) -> None:
    code, _, err = dra.create(template("ts", {"strategy": "TimeSlicing"}))
    assert code == 1 and err.startswith(DENIED + "GPU009 GPU sharing strategy TimeSlicing is not enabled for the "
                                        "NVIDIA DRA driver; set webhook.policy.dra.sharingStrategies to include "
                                        "TimeSlicing"), err
