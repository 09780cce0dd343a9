"""Every pod template the chart renders (Deployments, DaemonSets, helm test Pods; defaults and every
overlay) against the Pod Security Standards (pss.py). Prints which component needs which exception and
why; the webhook must meet `restricted`; no component may break a check the table below does not
document, so a new privilege fails this test until it is explained here."""

from __future__ import annotations

from typing import Any

import pytest
from gpu_stack_dev.chartlib import FULLNAME, overlays, render

from . import pss

# component -> {violated check: why it is needed}. Written from the templates and the upstream projects.
EXCEPTIONS: dict[str, dict[str, str]] = {
    "DaemonSet/container-toolkit": {
        "privileged": "installs the NVIDIA runtime on the host and restarts containerd/CRI-O",
        "host namespaces": "hostPID to signal the host's container runtime after changing its config",
        "hostPath volumes": "writes the runtime config and toolkit binaries on the host, reads the driver root",
    },
    "DaemonSet/device-plugin": {
        "privileged": "enumerates /dev/nvidia* and health-checks GPUs (upstream runs it privileged)",
        "hostPath volumes": "the kubelet device-plugin socket dir, the driver root, MPS pipe/shm dirs",
    },
    "DaemonSet/gpu-feature-discovery": {
        "privileged": "reads GPU properties through NVML on every device",
        "hostPath volumes": "writes NFD feature files (/etc/kubernetes/node-feature-discovery/features.d), driver root",
    },
    "DaemonSet/dcgm-exporter": {
        "privileged": "DCGM profiling metrics need access to every GPU",
        "hostPath volumes": "the kubelet pod-resources socket (GPU to pod mapping)",
    },
    "DaemonSet/mig-manager": {
        "privileged": "repartitions GPUs (MIG mode, GPU/compute instances)",
        "host namespaces": "hostPID to find and stop GPU clients on the host before a reconfiguration",
        "hostPath volumes": "driver root, host systemd/containerd to stop and restart GPU clients",
    },
    "DaemonSet/mps-control-daemon": {
        "privileged": "runs nvidia-cuda-mps-control for every GPU of the node",
        "host namespaces": "hostIPC/hostPID: MPS clients in other pods talk to the daemon over host IPC",
        "hostPath volumes": "the MPS pipe and shm directories shared with client pods (mpsRoot)",
    },
    "DaemonSet/dra-kubelet-plugin": {
        "privileged": "enumerates the GPUs through NVML, creates device nodes and prepares claimed devices "
                      "(dra-driver-nvidia-gpu chart and GPU Operator v26.7.0 run it privileged)",
        "hostPath volumes": "the kubelet plugin and registration dirs, /var/run/cdi for the claims' CDI specs, "
                            "driver root",
    },
    "DaemonSet/nfd-worker": {
        "hostPath volumes": "reads host /proc, /sys, /etc/os-release, /usr/lib for node features",
    },
}


def pod_templates() -> dict[str, list[tuple[str, dict[str, Any], dict[str, str]]]]:
    """component -> [(overlay, pod spec, pod annotations)] over the defaults and every overlay."""
    found: dict[str, list[tuple[str, dict[str, Any], dict[str, str]]]] = {}
    # The webhook denial test is rendered only with a helm test namespace the webhook covers.
    renders = [(overlay, render(3, overlay)) for overlay in overlays()]
    renders.append(("helm-tests-namespace", render(3, set_json={"webhook.helmTests.namespace": "gpu-check"})))
    for overlay, rendered in renders:
        for obj in rendered.objects():
            kind = obj.get("kind")
            if kind in ("Deployment", "DaemonSet", "StatefulSet", "Job", "ReplicaSet"):
                template = obj["spec"]["template"]
            elif kind == "CronJob":
                template = obj["spec"]["jobTemplate"]["spec"]["template"]
            elif kind == "Pod":
                template = obj
            else:
                continue
            name = f"{kind}/{obj['metadata']['name'].removeprefix(FULLNAME + '-')}"
            annotations = (template.get("metadata") or {}).get("annotations") or {}
            found.setdefault(name, []).append((overlay, template["spec"], annotations))
    return found


@pytest.fixture(scope="module")
def templates() -> dict[str, list[tuple[str, dict[str, Any], dict[str, str]]]]:
    return pod_templates()


def test_checker_catches_each_check() -> None:
    bad = {"hostPID": True, "volumes": [{"name": "h", "hostPath": {"path": "/"}}],
           "securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]},
           "containers": [{"name": "c", "ports": [{"containerPort": 1, "hostPort": 1}], "securityContext": {
               "privileged": True, "procMount": "Unmasked", "capabilities": {"add": ["SYS_ADMIN"]},
               "seLinuxOptions": {"type": "spc_t"}, "seccompProfile": {"type": "Unconfined"},
               "appArmorProfile": {"type": "Unconfined"}, "windowsOptions": {"hostProcess": True}}}]}
    checks = {c for _, c, _ in pss.check(bad)}
    assert checks >= {"host namespaces", "hostPath volumes", "sysctls", "hostPorts", "privileged", "/proc mount",
                      "capabilities", "SELinux", "seccomp", "AppArmor", "hostProcess", "volume types",
                      "privilege escalation", "runAsNonRoot"}
    assert pss.level(pss.check(bad)) == "privileged"
    assert pss.level(pss.check({"containers": [{"name": "c"}]})) == "baseline"


def test_pod_security_table(templates: dict[str, list[tuple[str, dict[str, Any], dict[str, str]]]]) -> None:
    rows = []
    problems = []
    for component, renders in sorted(templates.items()):
        violations = [v for _, spec, ann in renders for v in pss.check(spec, ann)]
        baseline_checks = sorted({c for lvl, c, _ in violations if lvl == "baseline"})
        restricted_checks = sorted({c for lvl, c, _ in violations if lvl == "restricted"})
        documented = EXCEPTIONS.get(component, {})
        # The documented exceptions are the baseline checks a component breaks (restricted follows from
        # them: a privileged container cannot drop ALL capabilities), or single restricted ones.
        explained = set(documented)
        undocumented = (set(baseline_checks) - explained) if baseline_checks else (set(restricted_checks) - explained)
        if undocumented:
            problems.append(f"{component} breaks {sorted(undocumented)} without an entry in EXCEPTIONS")
        rows.append((component, pss.level(violations), ", ".join(baseline_checks or restricted_checks) or "-",
                     "; ".join(f"{k}: {v}" for k, v in documented.items()) or "-"))
    print("\nPod Security Standards per component (defaults and every overlay):")
    print(f"{'component':34} {'meets':11} {'violated checks':48} why")
    for row in rows:
        print(f"{row[0]:34} {row[1]:11} {row[2]:48} {row[3]}")
    assert not problems, problems
    stale = set(EXCEPTIONS) - set(templates)
    assert not stale, f"EXCEPTIONS for components the chart no longer renders: {stale}"


def test_webhook_and_helm_test_kubectl_pod_meet_restricted(
        templates: dict[str, list[tuple[str, dict[str, Any], dict[str, str]]]]) -> None:
    for component in ("Deployment/webhook", "Pod/test-webhook", "Deployment/nfd-master", "Deployment/nfd-gc"):
        assert component in templates, sorted(templates)
        for overlay, spec, ann in templates[component]:
            assert pss.check(spec, ann) == [], f"{component} ({overlay})"
