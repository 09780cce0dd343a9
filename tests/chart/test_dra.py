"""The DRA driver option (dra.*): what the chart renders is what upstream deploys, pinned here against the
upstream files it comes from, and a node's GPUs get one provider, chosen by the node label.

Upstream sources (read at these tags/commits; the facts below are copied from them):
- GPU-OP: NVIDIA/gpu-operator tag v26.7.0 — deployments/gpu-operator/values.yaml (draDriver),
  manifests/state-dra-driver/*.yaml, internal/state/dra_driver.go, and the golden render
  internal/state/testdata/golden/gpucluster-dra-driver-gpus-only.yaml.
- DRIVER: kubernetes-sigs/dra-driver-nvidia-gpu main at 95932046 (VERSION v0.5.0-dev; the stored
  mirror has no v0.5.0 tag, its newest release tag is v0.4.1) — deployments/helm/dra-driver-nvidia-gpu/
  templates/{kubeletplugin,deviceclass-*,rbac-kubeletplugin,validatingadmissionpolicy}.yaml,
  cmd/gpu-kubelet-plugin/main.go, pkg/featuregates/featuregates.go.
"""

from __future__ import annotations

from typing import Any

import pytest
from gpu_stack_dev.chartlib import FULLNAME, NAMESPACE, find, one, render

from .nodematch import runs_on

DRA = {"dra.enabled": True}
PLUGIN = f"{FULLNAME}-dra-kubelet-plugin"
PROVIDER_LABEL = "gpu-stack.io/gpu-provider"


def objects(set_json: dict[str, Any] | None = None, overlay: str = "default") -> list[dict[str, Any]]:
    return render(3, overlay, set_json={**DRA, **(set_json or {})}).objects()


def plugin_spec(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(objs, "DaemonSet", PLUGIN)["spec"]["template"]["spec"]


def gpus_container(objs: list[dict[str, Any]]) -> dict[str, Any]:
    (c,) = [c for c in plugin_spec(objs)["containers"] if c["name"] == "gpus"]
    return c


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_nothing_dra_is_rendered_by_default() -> None:
    objs = render(3).objects()
    assert find(objs, "DeviceClass") == []
    assert [o for o in objs if "dra" in o["metadata"]["name"]] == []
    # ... and the GPU agents' affinity has no provider term (unchanged for clusters without DRA).
    dp = one(objs, "DaemonSet", f"{FULLNAME}-device-plugin")["spec"]["template"]["spec"]
    terms = dp["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert all(e["key"] != PROVIDER_LABEL for t in terms for e in t["matchExpressions"])


def test_device_classes_are_upstreams() -> None:
    # GPU-OP manifests/state-dra-driver/0400_deviceclass-gpu.yaml, 0410_deviceclass-mig.yaml,
    # 0430_deviceclass-vfio-gpu.yaml (the same selectors in DRIVER templates/deviceclass-{gpu,mig,vfio-gpu}.yaml).
    classes = {o["metadata"]["name"]: o for o in find(objects(), "DeviceClass")}
    assert {name: (o["apiVersion"], o["spec"]) for name, o in classes.items()} == {
        "gpu.nvidia.com": ("resource.k8s.io/v1", {"selectors": [{"cel": {"expression":
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]}),
        "mig.nvidia.com": ("resource.k8s.io/v1", {"selectors": [{"cel": {"expression":
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"}}]}),
        "vfio.gpu.nvidia.com": ("resource.k8s.io/v1", {"selectors": [{"cel": {"expression":
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'vfio'"}}]}),
    }


def test_image_is_the_one_gpu_operator_v26_7_0_pins() -> None:
    # GPU-OP deployments/gpu-operator/values.yaml: draDriver {repository: nvcr.io/nvidia,
    # image: dra-driver-nvidia-gpu, version: v0.5.0}.
    c = gpus_container(objects())
    assert c["image"] == "nvcr.io/nvidia/dra-driver-nvidia-gpu:v0.5.0"
    # The plugin hands its own image to the MPS control daemon Deployments it creates (DRIVER kubeletplugin.yaml).
    assert env_of(c)["IMAGE_NAME"] == c["image"]


def test_kubelet_plugin_container_is_upstreams() -> None:
    c = gpus_container(objects())
    # GPU-OP 0500_daemonset.yaml / DRIVER kubeletplugin.yaml: container `gpus`, bash -c, exec gpu-kubelet-plugin.
    assert c["command"] == ["bash", "-c"]
    assert c["args"][0].rstrip().endswith('gpu-kubelet-plugin -v "${LOG_VERBOSITY}"')
    assert c["securityContext"]["privileged"] is True
    env = env_of(c)
    # The env both upstream renders set for the gpus container, with their values.
    assert {k: env[k] for k in ("HTTP_ENDPOINT", "METRICS_PATH", "LOG_VERBOSITY", "MASK_NVIDIA_DRIVER_PARAMS",
                                "NVIDIA_VISIBLE_DEVICES", "CDI_ROOT", "NVIDIA_MIG_CONFIG_DEVICES",
                                "KUBELET_REGISTRAR_DIRECTORY_PATH", "KUBELET_PLUGINS_DIRECTORY_PATH",
                                "HEALTHCHECK_PORT")} == {
        "HTTP_ENDPOINT": ":8080", "METRICS_PATH": "/metrics", "LOG_VERBOSITY": "4", "MASK_NVIDIA_DRIVER_PARAMS": "",
        "NVIDIA_VISIBLE_DEVICES": "void", "CDI_ROOT": "/var/run/cdi", "NVIDIA_MIG_CONFIG_DEVICES": "all",
        "KUBELET_REGISTRAR_DIRECTORY_PATH": "/var/lib/kubelet/plugins_registry",
        "KUBELET_PLUGINS_DIRECTORY_PATH": "/var/lib/kubelet/plugins", "HEALTHCHECK_PORT": "51516"}
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    # DRIVER kubeletplugin.yaml: NVIDIA_DRIVER_ROOT (the host's driver root) mounted at /driver-root.
    assert env["NVIDIA_DRIVER_ROOT"] == "/"
    assert env_of(gpus_container(objects({"driver.enabled": True})))["NVIDIA_DRIVER_ROOT"] == "/run/nvidia/driver"
    # Probes: gRPC health service `liveness` on HEALTHCHECK_PORT (GPU-OP dra_driver.go defaultGPUsHealthcheckPort
    # 51516); startup 600 x 1 s, liveness 3 x 30 s, as upstream. Readiness is ours (same service).
    assert c["startupProbe"] == {"grpc": {"port": 51516, "service": "liveness"}, "failureThreshold": 600,
                                 "periodSeconds": 1, "timeoutSeconds": 10}
    assert c["livenessProbe"] == {"grpc": {"port": 51516, "service": "liveness"}, "failureThreshold": 3,
                                  "periodSeconds": 30, "timeoutSeconds": 10}
    assert c["readinessProbe"]["grpc"] == {"port": 51516, "service": "liveness"}
    port = gpus_container(objects({"dra.kubeletPlugin.healthcheckPort": 51600}))
    assert env_of(port)["HEALTHCHECK_PORT"] == "51600" and port["livenessProbe"]["grpc"]["port"] == 51600


def test_kubelet_plugin_mounts_are_upstreams() -> None:
    objs = objects()
    spec, c = plugin_spec(objs), gpus_container(objs)
    mounts = {m["mountPath"]: (m["name"], m.get("mountPropagation")) for m in c["volumeMounts"]}
    # GPU-OP 0500_daemonset.yaml / DRIVER kubeletplugin.yaml: the kubelet's plugin registration and plugin dirs
    # (Bidirectional: the plugin's sockets), the CDI spec dir, the driver root (HostToContainer).
    assert mounts["/var/lib/kubelet/plugins_registry"] == ("plugins-registry", None)
    assert mounts["/var/lib/kubelet/plugins"] == ("plugins", "Bidirectional")
    assert mounts["/var/run/cdi"] == ("cdi", None)
    assert mounts["/driver-root"] == ("driver-root", "HostToContainer")
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert host["plugins-registry"] == "/var/lib/kubelet/plugins_registry"
    assert host["plugins"] == "/var/lib/kubelet/plugins"
    assert host["cdi"] == "/var/run/cdi"
    assert host["driver-root"] == "/"
    # Not mounted: the PassthroughSupport host mounts (/sys, /proc Bidirectional, /lib/modules, host root).
    assert not {"/sys/", "/proc/", "/lib/modules/", "/host", "/host-root"} & set(mounts)



@pytest.mark.parametrize(("root_dir", "kubelet_dir"), [
    ("/var/lib/k0s/kubelet", "/var/lib/k0s/kubelet"),
    ("/var/snap/microk8s/common/var/lib/kubelet/", "/var/snap/microk8s/common/var/lib/kubelet"),
])
def test_a_kubelet_root_dir_of_its_own_moves_both_plugin_directories(root_dir: str, kubelet_dir: str) -> None:
    # The kubelet watches <--root-dir>/plugins_registry (kubernetes pkg/kubelet/kubelet_getters.go
    # getPluginsRegistrationDir), and the driver's kubeletplugin helper wants both directories at the same path
    # inside and outside its container (vendor/k8s.io/dynamic-resource-allocation/kubeletplugin/draplugin.go
    # RegistrarDirectoryPath, PluginDataDirectoryPath at DRIVER v0.4.1), as DRIVER kubeletplugin.yaml mounts them.
    objs = objects({"dra.kubeletPlugin.kubeletRootDir": root_dir})
    spec, c = plugin_spec(objs), gpus_container(objs)
    registrar, plugins = f"{kubelet_dir}/plugins_registry", f"{kubelet_dir}/plugins"
    env = env_of(c)
    assert (env["KUBELET_REGISTRAR_DIRECTORY_PATH"], env["KUBELET_PLUGINS_DIRECTORY_PATH"]) == (registrar, plugins)
    mounts = {m["name"]: (m["mountPath"], m.get("mountPropagation")) for m in c["volumeMounts"]}
    assert mounts["plugins-registry"] == (registrar, None)
    assert mounts["plugins"] == (plugins, "Bidirectional")
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert (host["plugins-registry"], host["plugins"]) == (registrar, plugins)


def test_a_relative_kubelet_root_dir_is_refused() -> None:
    result = render(3, set_json={**DRA, "dra.kubeletPlugin.kubeletRootDir": "var/lib/kubelet"})
    assert not result.ok and "kubeletRootDir" in result.stderr

def test_hardening_beyond_upstream() -> None:
    objs = objects()
    spec, c = plugin_spec(objs), gpus_container(objs)
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert spec["automountServiceAccountToken"] is False
    token = [m for m in c["volumeMounts"] if m["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount"]
    assert token and token[0]["readOnly"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not spec.get("hostPID") and not spec.get("hostIPC") and not spec.get("hostNetwork")


@pytest.mark.parametrize(("gates", "env"), [
    ({}, None),
    ({"MPSSupport": True}, "MPSSupport=true"),
    ({"TimeSlicingSettings": True, "MPSSupport": False}, "MPSSupport=false,TimeSlicingSettings=true"),
])
def test_feature_gates_render_as_upstreams_feature_gates_env(gates: dict[str, bool], env: str | None) -> None:
    # DRIVER kubeletplugin.yaml renders FEATURE_GATES as Name=value pairs, comma-separated (pkg/flags/featuregates.go).
    assert env_of(gpus_container(objects({"dra.featureGates": gates}))).get("FEATURE_GATES") == env


def test_feature_gates_schema_lists_the_gpu_plugins_gates() -> None:
    # DRIVER pkg/featuregates/featuregates.go: TimeSlicingSettings, MPSSupport, NVMLDeviceHealthCheck, DynamicMIG,
    # DeviceMetadata, DRAListTypeAttributes, ConsumableShares are the GPU plugin's; PassthroughSupport needs host
    # mounts this chart does not render, the IMEX/ComputeDomain/FabricManager gates concern the ComputeDomain
    # plugin this chart does not deploy.
    bad = render(3, set_json={**DRA, "dra.featureGates": {"PassthroughSupport": True}})
    assert not bad.ok and "PassthroughSupport" in bad.stderr
    typo = render(3, set_json={**DRA, "dra.featureGates": {"MPSSuport": True}})
    assert not typo.ok and "MPSSuport" in typo.stderr
    for gate in ("TimeSlicingSettings", "MPSSupport", "NVMLDeviceHealthCheck", "DynamicMIG", "DeviceMetadata",
                 "DRAListTypeAttributes", "ConsumableShares"):
        assert render(3, set_json={**DRA, "dra.featureGates": {gate: True}}).ok, gate


def test_no_controller_for_the_gpu_plugin() -> None:
    # GPU-OP: the controller Deployment (manifests/state-dra-driver/0600_controller-deployment.yaml) serves
    # ComputeDomains only; the gpus-only golden render has none. Neither has this chart.
    objs = objects(overlay="dra-mps-memory-slices.yaml")
    assert [o["metadata"]["name"] for o in objs if o["kind"] == "Deployment" and "dra" in o["metadata"]["name"]] == []
    assert [o["metadata"]["name"] for o in objs if o["kind"] == "DaemonSet" and "dra" in o["metadata"]["name"]] == [
        PLUGIN]


def rules(obj: dict[str, Any]) -> list[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]]:
    return [(tuple(r["apiGroups"]), tuple(r["resources"]), tuple(r["verbs"])) for r in obj["rules"]]


def test_rbac_is_upstreams_for_the_gpu_plugin() -> None:
    objs = objects()
    # GPU-OP 0200_kubeletplugin-clusterrole.yaml (= DRIVER rbac-kubeletplugin.yaml) without `computedomains`.
    assert rules(one(objs, "ClusterRole", PLUGIN)) == [
        (("resource.k8s.io",), ("resourceclaims",), ("get", "list", "watch")),
        (("resource.k8s.io",), ("resourceslices",), ("get", "list", "watch", "create", "update", "delete")),
        (("",), ("nodes",), ("get", "list", "watch", "update", "patch")),
        (("",), ("pods",), ("get", "list", "watch")),
    ]
    binding = one(objs, "ClusterRoleBinding", PLUGIN)
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": PLUGIN, "namespace": NAMESPACE}]
    assert plugin_spec(objs)["serviceAccountName"] == PLUGIN
    # GPU-OP 0140_kubeletplugin-mps-role.yaml: Deployments in the driver's namespace, only with MPSSupport.
    assert find(objs, "Role", f"{PLUGIN}-mps") == []
    mps = objects(overlay="dra-mps-memory-slices.yaml")
    role = one(mps, "Role", f"{PLUGIN}-mps")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert rules(role) == [(("apps",), ("deployments",),
                            ("get", "list", "watch", "create", "update", "patch", "delete"))]
    assert one(mps, "RoleBinding", f"{PLUGIN}-mps")["subjects"][0]["name"] == PLUGIN


def test_resourceslice_policy_is_upstreams_and_node_local_only() -> None:
    objs = objects()
    (policy,) = find(objs, "ValidatingAdmissionPolicy", f"{FULLNAME}-dra-resourceslices")
    spec = policy["spec"]
    # GPU-OP 0700_resourceslices-policy.yaml (= DRIVER validatingadmissionpolicy.yaml).
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [{
        "apiGroups": ["resource.k8s.io"], "apiVersions": ["v1", "v1beta1", "v1beta2"],
        "operations": ["CREATE", "UPDATE", "DELETE"], "resources": ["resourceslices"]}]
    assert spec["matchConditions"] == [{"name": "isRestrictedUser", "expression":
        f'request.userInfo.username == "system:serviceaccount:{NAMESPACE}:{PLUGIN}"'}]
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert variables["userNodeName"] == (
        "request.userInfo.extra[?'authentication.kubernetes.io/node-name'][0].orValue('')")
    assert variables["objectNodeName"] == (
        '(request.operation == "DELETE" ? oldObject : object).spec.?nodeName.orValue("")')
    first, second = spec["validations"]
    assert first["expression"] == 'variables.userNodeName != ""'
    assert first["message"].startswith("no node association found for user")
    # Hardened: upstream's `|| variables.allNodesValue == true || variables.nodeSelectorValue != null` is gone;
    # a slice the plugin writes must name the plugin's own node (tests/e2e/test_dra_scheduler.py runs it).
    assert second["expression"] == "variables.userNodeName == variables.objectNodeName"
    assert "may not modify cluster or node resourceslices" in second["messageExpression"]
    (binding,) = find(objs, "ValidatingAdmissionPolicyBinding", f"{FULLNAME}-dra-resourceslices")
    assert binding["spec"] == {"policyName": f"{FULLNAME}-dra-resourceslices", "validationActions": ["Deny"]}


GPU_NODE = {"feature.node.kubernetes.io/pci-10de.present": "true", "nvidia.com/gpu.present": "true",
            "nvidia.com/mps.capable": "true"}
ONE_PROVIDER = ("device-plugin", "gpu-feature-discovery", "mps-control-daemon")
EVERY_NODE = ("container-toolkit", "dcgm-exporter")


def daemonset_specs(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"].removeprefix(FULLNAME + "-"): o["spec"]["template"]["spec"]
            for o in objs if o["kind"] == "DaemonSet"}


@pytest.mark.parametrize("overlay", ["dra.yaml", "dra-mps-memory-slices.yaml"])
def test_a_node_gets_one_gpu_provider_chosen_by_the_node_label(overlay: str) -> None:
    specs = daemonset_specs(render(3, overlay, set_json={
        "sharing.configs.mps": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}).objects())
    assert set(ONE_PROVIDER) | set(EVERY_NODE) | {"dra-kubelet-plugin"} <= set(specs)
    dra_node = {**GPU_NODE, PROVIDER_LABEL: "dra"}
    for name in ONE_PROVIDER:
        assert runs_on(specs[name], GPU_NODE), name
        assert not runs_on(specs[name], dra_node), name
    assert runs_on(specs["dra-kubelet-plugin"], dra_node)
    assert not runs_on(specs["dra-kubelet-plugin"], GPU_NODE)
    assert not runs_on(specs["dra-kubelet-plugin"], {PROVIDER_LABEL: "dra"})  # a GPU node only
    for name in EVERY_NODE:  # the runtime and the metrics serve both kinds of GPU nodes
        assert runs_on(specs[name], GPU_NODE) and runs_on(specs[name], dra_node), name


@pytest.mark.parametrize("section", ["devicePlugin", "gfd", "mpsControlDaemon"])
def test_an_affinity_value_that_would_drop_the_provider_term_is_refused(section: str) -> None:
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "example.com/gpu", "operator": "Exists"}]}]}}}
    bad = render(3, set_json={**DRA, f"{section}.affinity": affinity})
    assert not bad.ok
    assert f"gpu-stack: {section}.affinity is set while dra.enabled=true" in bad.stderr
    assert render(3, set_json={f"{section}.affinity": affinity}).ok
