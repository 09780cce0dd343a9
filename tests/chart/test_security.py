"""Hardening of every workload the chart renders (defaults, every overlay, and a helm test namespace) and the
scanner exceptions it declares: each `checkov.io/skipN` annotation names a check ALLOWED to be skipped
(gpu_stack_dev.generate.chart_security), carries a reason, and only where that kind of exception applies to the object.
`make lint` runs checkov itself (hack/chart-scan.py); these tests need only helm."""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from typing import Any

import pytest
from gpu_stack_dev.chartlib import FULLNAME, NAMESPACE, overlays, render
from gpu_stack_dev.generate import chart_security as security

EXTRA_SCENARIOS: dict[str, dict[str, Any]] = {
    "helm-tests-namespace": {"webhook.helmTests.namespace": "gpu-check"},  # renders the webhook denial test
    "driver-container": {"driver.enabled": True},
}
SCENARIOS = [*overlays(), *EXTRA_SCENARIOS]


@cache
def scenario_objects(name: str) -> tuple[dict[str, Any], ...]:
    extra = EXTRA_SCENARIOS.get(name)
    return tuple((render(3, set_json=extra) if extra else render(3, name)).objects())


def workloads(objs: tuple[dict[str, Any], ...]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(object, pod template {metadata, spec}) of every workload."""
    for obj in objs:
        if obj["kind"] == "Pod":
            yield obj, obj
        elif obj["kind"] in ("Deployment", "DaemonSet", "StatefulSet", "Job"):
            yield obj, obj["spec"]["template"]


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def name_of(obj: dict[str, Any]) -> str:
    return f"{obj['kind']}/{obj['metadata']['name'].removeprefix(FULLNAME + '-')}"


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def gets_gpus(container: dict[str, Any]) -> bool:
    """The NVIDIA runtime injects the driver: the container asks for GPUs by env or by resource."""
    limits = (container.get("resources") or {}).get("limits") or {}
    visible = env_of(container).get("NVIDIA_VISIBLE_DEVICES")
    return any(k.startswith("nvidia.com/") for k in limits) or (visible is not None and visible != "void")


def exports_its_root(container: dict[str, Any]) -> bool:
    """The driver container: its root filesystem becomes the host's /run/nvidia/driver (Bidirectional mount)."""
    return any(m.get("mountPropagation") == "Bidirectional" and m["mountPath"] == "/run/nvidia"
               for m in container.get("volumeMounts", []))


def privileged(container: dict[str, Any]) -> bool:
    return bool((container.get("securityContext") or {}).get("privileged"))


def bound_service_accounts(objs: tuple[dict[str, Any], ...]) -> set[str]:
    return {s["name"] for o in objs if o["kind"] in ("RoleBinding", "ClusterRoleBinding")
            for s in o.get("subjects") or [] if s.get("kind") == "ServiceAccount"}


def applies(check: str, obj: dict[str, Any], objs: tuple[dict[str, Any], ...]) -> bool:
    """Does the inherent kind of exception behind `check` fit this object?"""
    if check == "CKV_K8S_155":
        return obj["kind"] == "ClusterRole" and any(
            "admissionregistration.k8s.io" in r.get("apiGroups", []) and r.get("resourceNames")
            for r in obj.get("rules", []))
    template = obj if obj["kind"] == "Pod" else (obj.get("spec") or {}).get("template")
    if not template:
        return False
    spec, cs = template["spec"], containers(template["spec"])
    is_test_pod = obj["kind"] == "Pod" and obj["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"
    rules = {
        "CKV_K8S_11": True, "CKV_K8S_15": True, "CKV_K8S_43": True,
        "CKV_K8S_16": any(map(privileged, cs)), "CKV_K8S_20": any(map(privileged, cs)),
        "CKV_K8S_28": any(map(privileged, cs)), "CKV_K8S_37": any(map(privileged, cs)),
        "CKV_K8S_39": any(map(privileged, cs)),
        "CKV_K8S_23": any(map(privileged, cs)), "CKV_K8S_40": any(map(privileged, cs)),
        "CKV_K8S_17": bool(spec.get("hostPID")), "CKV_K8S_18": bool(spec.get("hostIPC")),
        "CKV_K8S_19": bool(spec.get("hostNetwork")), "CKV2_K8S_6": bool(spec.get("hostNetwork")),
        "CKV_K8S_22": any((gets_gpus(c) or exports_its_root(c))
                          and not (c.get("securityContext") or {}).get("readOnlyRootFilesystem") for c in cs),
        "CKV_K8S_38": spec.get("automountServiceAccountToken") is not False
        and spec.get("serviceAccountName", "default") in bound_service_accounts(objs),
        "CKV_K8S_8": is_test_pod and spec.get("restartPolicy") == "Never",
        "CKV_K8S_9": is_test_pod and spec.get("restartPolicy") == "Never",
    }
    return rules.get(check, False)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_skip_names_an_allowed_check_with_a_reason_that_applies(scenario: str) -> None:
    objs = scenario_objects(scenario)
    problems = []
    for obj in objs:
        seen = set()
        for key, check, reason in security.skips(obj):
            where = f"{name_of(obj)} {key}"
            if not check:
                problems.append(f"{where}: not CKV_K8S_<id>=<reason>: {reason!r}")
                continue
            if check not in security.ALLOWED:
                problems.append(f"{where}: {check} is not an allowed exception")
            if len(reason.strip()) < 20 or "=" in reason or reason == "No comment provided":
                problems.append(f"{where}: {check} needs a reason without '=' (checkov splits on it): {reason!r}")
            if not applies(check, obj, objs):
                problems.append(f"{where}: {check} is skipped but its kind of exception does not fit the object")
            if check in seen:
                problems.append(f"{where}: {check} skipped twice")
            seen.add(check)
    assert problems == []


def test_the_allowed_list_is_the_inherent_kinds_only() -> None:
    # The inherent kinds: privileged/escalation/capabilities/root/host namespaces/host paths for GPU and runtime agents,
    # tokens for API callers, CPU limits, digests and pull policy, NetworkPolicy for host-network agents,
    # probes on one-shot test pods, the webhook's rights on its own configurations. Nothing else.
    assert set(security.ALLOWED) == {
        "CKV_K8S_16", "CKV_K8S_17", "CKV_K8S_18", "CKV_K8S_19", "CKV_K8S_20", "CKV_K8S_23", "CKV_K8S_40",
        "CKV_K8S_28", "CKV_K8S_37", "CKV_K8S_39", "CKV_K8S_22", "CKV_K8S_38", "CKV_K8S_11", "CKV_K8S_15",
        "CKV_K8S_43", "CKV2_K8S_6", "CKV_K8S_8", "CKV_K8S_9", "CKV_K8S_155"}


def test_a_reason_with_an_equals_sign_or_an_unknown_check_is_caught() -> None:
    obj = {"kind": "Pod", "metadata": {"name": "x", "annotations": {
        "checkov.io/skip1": "CKV_K8S_16", "checkov.io/skip2": "CKV_K8S_99=some long enough reason here"}}}
    found = list(security.skips(obj))
    assert found[0] == ("checkov.io/skip1", "", "CKV_K8S_16")
    assert found[1][1] == "CKV_K8S_99" and found[1][1] not in security.ALLOWED


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_workload_is_hardened(scenario: str) -> None:
    objs = scenario_objects(scenario)
    selected = [p["spec"]["podSelector"].get("matchLabels", {}) for p in objs if p["kind"] == "NetworkPolicy"]
    problems = []
    for obj, template in workloads(objs):
        spec, where = template["spec"], name_of(obj)
        if obj["metadata"].get("namespace") == "default":
            problems.append(f"{where} is in the default namespace")
        if (spec.get("securityContext") or {}).get("seccompProfile", {}).get("type") != "RuntimeDefault":
            problems.append(f"{where}: no pod-level seccomp RuntimeDefault")
        labels = template["metadata"].get("labels", {})
        if not any(all(labels.get(k) == v for k, v in sel.items()) for sel in selected):
            problems.append(f"{where}: no NetworkPolicy selects its pods")
        for c in containers(spec):
            resources = c.get("resources") or {}
            requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
            if not {"cpu", "memory"} <= set(requests) or "memory" not in limits:
                problems.append(f"{where}/{c['name']}: needs cpu+memory requests and a memory limit")
            sc = c.get("securityContext") or {}
            if not privileged(c):
                if not (sc.get("readOnlyRootFilesystem") or gets_gpus(c) or exports_its_root(c)):
                    problems.append(f"{where}/{c['name']}: unprivileged, no GPUs, but a writable root filesystem")
                if sc.get("allowPrivilegeEscalation") is not False or sc.get("capabilities", {}).get("drop") != ["ALL"]:
                    problems.append(f"{where}/{c['name']}: unprivileged but may escalate or keeps capabilities")
        long_running = obj["kind"] != "Pod"
        for c in spec.get("containers", []) if long_running else []:
            if "livenessProbe" not in c or "readinessProbe" not in c:
                problems.append(f"{where}/{c['name']}: no liveness/readiness probe")
    assert problems == []


def _one_workload(objs: tuple[dict[str, Any], ...], kind: str, component: str) -> dict[str, Any]:
    (obj,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == f"{FULLNAME}-{component}"]
    return obj["spec"]["template"]["spec"]


def test_tokens_only_in_the_containers_that_call_the_api() -> None:
    # Upstream v0.20.0: only cmd/config-manager and GFD (NodeFeature API) build a Kubernetes client
    # (internal/flags/kubeclient.go callers); cmd/mps-control-daemon and cmd/nvidia-device-plugin have none.
    objs = scenario_objects("mps-x10.yaml")
    for component in ("device-plugin", "gpu-feature-discovery", "mps-control-daemon"):
        spec = _one_workload(objs, "DaemonSet", component)
        assert spec["automountServiceAccountToken"] is False, component
        for c in containers(spec):
            mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
            has_token = "/var/run/secrets/kubernetes.io/serviceaccount" in mounts
            calls_api = c["command"][0] in ("config-manager", "gpu-feature-discovery")
            assert has_token == calls_api, f"{component}/{c['name']}"


def test_config_manager_is_read_only_without_gpus_and_root_only_to_signal() -> None:
    spec = _one_workload(scenario_objects("default"), "DaemonSet", "device-plugin")
    init, sidecar = spec["initContainers"][0], spec["containers"][0]
    for c in (init, sidecar):
        assert env_of(c)["NVIDIA_VISIBLE_DEVICES"] == "void"
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
    # The one-shot init container writes a symlink into an emptyDir: no root needed.
    assert init["securityContext"]["runAsUser"] == 65532 and init["securityContext"]["runAsNonRoot"] is True
    # The sidecar SIGHUPs the plugin (root, shared process namespace): kill(2) needs the same UID or CAP_KILL,
    # and Kubernetes gives a non-root process no capabilities, so it stays UID 0 with none.
    assert sidecar["securityContext"]["runAsUser"] == 0 and sidecar["securityContext"]["capabilities"] == {
        "drop": ["ALL"]}


def test_nfd_runs_as_the_image_user_explicitly() -> None:
    # node-feature-discovery v0.19.0 Dockerfile: USER 65534:65534 (both the full and the minimal image).
    objs = scenario_objects("default")
    for kind, component in (("Deployment", "nfd-master"), ("Deployment", "nfd-gc"), ("DaemonSet", "nfd-worker")):
        spec = _one_workload(objs, kind, component)
        for c in spec["containers"]:
            sc = {**(spec.get("securityContext") or {}), **(c.get("securityContext") or {})}
            assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 65534 and sc["runAsGroup"] == 65534, component


def test_probes_check_what_the_agent_does() -> None:
    objs = scenario_objects("mps-x10.yaml")

    def probe(component: str, container: str, kind: str = "livenessProbe") -> str:
        spec = _one_workload(objs, "DaemonSet", component)
        (c,) = [c for c in spec["containers"] if c["name"] == container]
        return " ".join(c[kind]["exec"]["command"])

    # Upstream internal/plugin/server.go (v0.20.0): the plugin serves on <kubelet dir>/nvidia-<resource>.sock.
    assert "/var/lib/kubelet/device-plugins/nvidia-*.sock" in probe("device-plugin", "nvidia-device-plugin")
    assert "-S" in probe("device-plugin", "nvidia-device-plugin")
    # GFD labels from NVML: the driver must answer (nvidia-smi, injected with the `utility` capability).
    assert "nvidia-smi -L" in probe("gpu-feature-discovery", "gpu-feature-discovery")
    # cmd/mps-control-daemon/main.go creates /mps/.ready once its daemons started; the device plugin checks a
    # daemon with get_default_active_thread_percentage on its pipe (mps.Daemon.AssertHealthy).
    assert probe("mps-control-daemon", "mps-control-daemon", "readinessProbe").endswith("test -f /mps/.ready")
    assert "get_default_active_thread_percentage" in probe("mps-control-daemon", "mps-control-daemon")
    # The toolkit: pid file (nvidia-ctk-installer initialize), installed runtime, runtime config naming it.
    toolkit = probe("container-toolkit", "nvidia-container-toolkit", "readinessProbe")
    assert "toolkit.pid" in toolkit and "nvidia-container-runtime" in toolkit and "runtimes.nvidia" in toolkit
    exporter = _one_workload(objs, "DaemonSet", "dcgm-exporter")["containers"][0]
    assert exporter["livenessProbe"]["httpGet"]["path"] == "/health"


def test_helm_test_namespace_objects_never_default() -> None:
    for scenario in SCENARIOS:
        namespaces = {o["metadata"].get("namespace") for o in scenario_objects(scenario)}
        assert "default" not in namespaces, scenario
    assert NAMESPACE in {o["metadata"].get("namespace") for o in scenario_objects("default")}
