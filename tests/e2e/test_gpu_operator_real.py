"""The real NVIDIA GPU Operator v26.7.0 controller on the e2e plane, without gpu-stack (gpu_stack_dev.e2e.gpu_operator):
what it creates for a fake GPU node with the chart's default ClusterPolicy, and what it changes when
spec.cdi.nriPluginEnabled is set. The operator runs as its own ServiceAccount in a namespace that is not
`gpu-operator`; the operand pods are created by the DaemonSet controller through admission, so a webhook test
can read its verdict on them (FailedCreate events).

Upstream facts pinned here (NVIDIA/gpu-operator, tag v26.7.0):
- controllers/object_controls.go setRuntimeClassName (2747-2753): no runtimeClassName on any operand pod when
  the NRI plugin is enabled (else spec.operator.runtimeClass, "nvidia"); the driver and toolkit never get one.
- controllers/state_manager.go isStateEnabled (1009-1010): state "pre-requisites" (the RuntimeClasses) is off in
  NRI mode; object_controls.go RuntimeClasses (5262-5268) then deletes nvidia, nvidia-cdi and nvidia-legacy.
- controllers/object_controls.go setNRIPluginAnnotation (978-992): in NRI mode the pod template annotation
  `nvidia.cdi.k8s.io/container.<name>: management.nvidia.com/gpu=all`, for the first container of GFD (967),
  DCGM exporter (1847), DCGM (2020), MIG manager (2067), for `nvidia-device-plugin` (1596), the MPS control
  daemon's main container (1681) and the validator's `toolkit-validation` init container (2325).
- controllers/object_controls.go transformToolkitCtrForCDI (1272-1273) and transformNRISocketMounts (1405-1418):
  the toolkit gets ENABLE_NRI_PLUGIN=true, NRI_SOCKET=/runtime/nri-sock-dir/nri.sock and a hostPath volume
  `nri-socket` (/var/run/nri).
- controllers/object_controls.go TransformValidatorComponent (2455-2457, 2478-2480): VALIDATOR_RUNTIME_CLASS
  (the validator's cuda and plugin workload pods' class) only while the validator pod has a runtimeClassName.
- controllers/object_controls.go DaemonSet (4727): every operand DaemonSet's controller is the ClusterPolicy;
  api/nvidia/v1/clusterpolicy_types.go SetStatus (2049-2052): status.namespace is the operator's namespace.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from gpu_stack_dev.e2e.e2elib import E2ECluster, unique
from gpu_stack_dev.e2e.gpu_operator import (
    CLUSTER_POLICY,
    RUNTIME_CLASSES,
    GpuOperator,
    GpuOperatorError,
    wait_for,
)

# DaemonSet: (runtimeClassName in CDI mode, serviceAccountName, pods on the fake node) — the smoke test's
# table in ../shared/gpu-operator/README.md. MPS and MIG manager need nvidia.com/mps.capable and a MIG-capable
# product label, which the node does not have.
DAEMONSETS = {
    "nvidia-driver-daemonset": (None, "nvidia-driver", 1),
    "nvidia-container-toolkit-daemonset": (None, "nvidia-container-toolkit", 1),
    "nvidia-operator-validator": ("nvidia", "nvidia-operator-validator", 1),
    "nvidia-device-plugin-daemonset": ("nvidia", "nvidia-device-plugin", 1),
    "nvidia-device-plugin-mps-control-daemon": ("nvidia", "nvidia-device-plugin", 0),
    "nvidia-dcgm-exporter": ("nvidia", "nvidia-dcgm-exporter", 1),
    "gpu-feature-discovery": ("nvidia", "nvidia-gpu-feature-discovery", 1),
    "nvidia-mig-manager": ("nvidia", "nvidia-mig-manager", 0),
}
WITH_PODS = [name for name, (_, _, pods) in DAEMONSETS.items() if pods]
NRI_ANNOTATED = {  # DaemonSet: the container its NRI annotation names
    "gpu-feature-discovery": "gpu-feature-discovery",
    "nvidia-dcgm-exporter": "nvidia-dcgm-exporter",
    "nvidia-device-plugin-daemonset": "nvidia-device-plugin",
    "nvidia-device-plugin-mps-control-daemon": "mps-control-daemon-ctr",
    "nvidia-mig-manager": "nvidia-mig-manager",
    "nvidia-operator-validator": "toolkit-validation",
}
NRI_PREFIX = "nvidia.cdi.k8s.io/container."
NAMESPACE_NAME = "kubernetes.io/metadata.name"


@pytest.fixture(scope="module")
def operator(gpu_operator: GpuOperator) -> GpuOperator:
    """The operator reconciling the chart's default ClusterPolicy, with one fake GPU node."""
    gpu_operator.prepare_node()
    gpu_operator.apply_cluster_policy()
    return gpu_operator


def template(ds: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = ds["spec"]["template"]
    return spec


def nri_annotations(meta: dict[str, Any]) -> dict[str, str]:
    return {k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith(NRI_PREFIX)}


def validator_runtime_class(pod: dict[str, Any]) -> dict[str, str]:
    """VALIDATOR_RUNTIME_CLASS of the validator's init containers (the class its test pods are given)."""
    return {c["name"]: e["value"] for c in pod["spec"]["initContainers"] for e in c.get("env", [])
            if e["name"] == "VALIDATOR_RUNTIME_CLASS"}


def test_cdi_mode_runtime_classes_daemonsets_and_pods(operator: GpuOperator) -> None:
    classes = operator.wait_runtime_classes(present=True)
    assert {name: rc["handler"] for name, rc in classes.items()} == {name: name for name in RUNTIME_CLASSES}
    daemonsets = operator.wait_daemonsets(list(DAEMONSETS))
    policy = operator.cluster_policy()
    for name, (runtime_class, serviceaccount, _) in DAEMONSETS.items():
        ds = daemonsets[name]
        spec = template(ds)["spec"]
        assert (spec.get("runtimeClassName"), spec["serviceAccountName"]) == (runtime_class, serviceaccount), name
        containers = [*spec.get("initContainers", []), *spec["containers"]]
        assert {c["name"]: c["securityContext"].get("privileged") for c in containers} == \
            {c["name"]: True for c in containers}, name
        [owner] = ds["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == \
            ("ClusterPolicy", policy["metadata"]["name"], policy["metadata"]["uid"], True), name
        assert nri_annotations(template(ds)["metadata"]) == {}, name
    pods = operator.wait_pods_created(WITH_PODS)
    for name, created in pods.items():
        [pod] = created
        [owner] = pod["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["controller"]) == ("DaemonSet", name, True)
        assert pod["spec"].get("runtimeClassName") == DAEMONSETS[name][0], name
        assert pod["spec"]["serviceAccountName"] == DAEMONSETS[name][1], name
        # The operator's own labels come from the ClusterPolicy's spec.daemonsets.labels (chart values).
        assert pod["metadata"]["labels"]["app"] == name
        assert pod["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpu-operator"
    assert validator_runtime_class(pods["nvidia-operator-validator"][0]) == {"cuda-validation": "nvidia",
                                                                             "plugin-validation": "nvidia"}
    assert operator.failed_creates() == []
    assert operator.cluster_policy()["status"]["namespace"] == operator.namespace


def test_nri_mode_drops_runtime_classes_and_annotates_management_containers(operator: GpuOperator) -> None:
    operator.wait_pods_created(WITH_PODS)
    operator.switch_to_nri()
    assert operator.wait_runtime_classes(present=False) == {}

    def rewritten(ds: dict[str, Any]) -> bool:
        return "runtimeClassName" not in template(ds)["spec"] and (
            ds["metadata"]["name"] not in NRI_ANNOTATED or bool(nri_annotations(template(ds)["metadata"])))
    daemonsets = operator.wait_daemonsets(list(DAEMONSETS), check=rewritten)
    for name, ds in daemonsets.items():
        want = {f"{NRI_PREFIX}{NRI_ANNOTATED[name]}": "management.nvidia.com/gpu=all"} if name in NRI_ANNOTATED else {}
        assert nri_annotations(template(ds)["metadata"]) == want, name
        assert nri_annotations(ds["metadata"]) == {}, name  # on the pod template only
    toolkit = template(daemonsets["nvidia-container-toolkit-daemonset"])["spec"]
    [main] = toolkit["containers"]
    env = {e["name"]: e.get("value") for e in main["env"]}
    assert (env["ENABLE_NRI_PLUGIN"], env["NRI_SOCKET"]) == ("true", "/runtime/nri-sock-dir/nri.sock")
    nri_socket = {"name": "nri-socket", "hostPath": {"path": "/var/run/nri", "type": "DirectoryOrCreate"}}
    assert nri_socket in toolkit["volumes"]
    pods = operator.wait_pods_created(WITH_PODS, timeout=120)
    for name, [pod] in pods.items():
        assert "runtimeClassName" not in pod["spec"], name
        want = {f"{NRI_PREFIX}{NRI_ANNOTATED[name]}": "management.nvidia.com/gpu=all"} if name in NRI_ANNOTATED else {}
        assert nri_annotations(pod["metadata"]) == want, name
    assert validator_runtime_class(pods["nvidia-operator-validator"][0]) == {}
    assert operator.failed_creates() == []


def test_the_applied_cluster_policy_is_the_builds(operator: GpuOperator) -> None:
    """The harness applies tests/fixtures' copy (a fresh clone has it): the build's own says the same."""
    fixture = yaml.safe_load(CLUSTER_POLICY.read_text())
    assert fixture == yaml.safe_load((operator.source / "clusterpolicy-default.yaml").read_text())
    assert operator.cluster_policy()["spec"]["daemonsets"] == fixture["spec"]["daemonsets"]


def test_operator_runs_as_its_serviceaccount(operator: GpuOperator) -> None:
    kubeconfig = operator.workdir / "gpu-operator.kubeconfig"
    whoami = operator.cluster.kubectl("auth", "whoami", "--kubeconfig", str(kubeconfig), "-o", "json").stdout
    assert json.loads(whoami)["status"]["userInfo"]["username"] == \
        f"system:serviceaccount:{operator.namespace}:gpu-operator"
    assert "forbidden" not in operator.log()


def refuse_pods_labelled(cluster: E2ECluster, namespace: str, app: str) -> str:
    """A ValidatingAdmissionPolicy refusing pods labelled app=<app> in the namespace, once enforced; its name."""
    name = unique("e2e-refuse")
    policy = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
              "metadata": {"name": name}, "spec": {
                  "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                          "operations": ["CREATE"], "resources": ["pods"]}]},
                  "validations": [{"expression": f"object.metadata.?labels[?'app'].orValue('') != '{app}'",
                                   "message": f"e2e refuses {app}"}]}}
    binding = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
               "metadata": {"name": name}, "spec": {
                   "policyName": name, "validationActions": ["Deny"],
                   "matchResources": {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME: namespace}}}}}
    cluster.kubectl("apply", "-f", "-",
                    input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [policy, binding]}))
    probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe", "labels": {"app": app}},
             "spec": {"containers": [{"name": "main", "image": "busybox"}]}}
    wait_for("the policy enforced", lambda: name in cluster.kubectl(
        "create", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(probe), check=False).stderr or None)
    return name


def test_a_refused_operand_pod_is_a_failed_create_event(operator: GpuOperator) -> None:
    """What a webhook test reads when its webhook refuses an operand pod: the DaemonSet controller's FailedCreate
    event carrying the denial (here from a ValidatingAdmissionPolicy, built into the API server)."""
    [pod] = operator.wait_pods_created(["nvidia-dcgm-exporter"])["nvidia-dcgm-exporter"]
    name = refuse_pods_labelled(operator.cluster, operator.namespace, "nvidia-dcgm-exporter")
    try:
        operator.cluster.kubectl("delete", "pod", pod["metadata"]["name"], "-n", operator.namespace)
        with pytest.raises(GpuOperatorError, match=f"nvidia-dcgm-exporter .*{name}.*e2e refuses nvidia-dcgm-exporter"):
            operator.wait_pods_created(["nvidia-dcgm-exporter"], timeout=10)
        [first, *_] = operator.failed_creates("nvidia-dcgm-exporter")
        assert first.daemonset == "nvidia-dcgm-exporter"
        assert first.message.startswith("Error creating: pods ") and "is forbidden: ValidatingAdmissionPolicy " \
            f"'{name}' with binding '{name}' denied request: e2e refuses nvidia-dcgm-exporter" in first.message
    finally:
        operator.cluster.kubectl("delete", "validatingadmissionpolicybinding,validatingadmissionpolicy", name,
                                 "--ignore-not-found", check=False)
