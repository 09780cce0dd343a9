"""The MIG manager's pause -> wait -> repartition -> resume contract, checked on the rendered chart.

Upstream facts (NVIDIA/mig-parted v0.15.0, the k8s-mig-manager GPU Operator v26.7.0 ships in
deployments/gpu-operator/values.yaml `migManager.version: v0.15.0`):
- pkg/mig/reconfigure/reconfigure.go `shutdownKubernetesGPUClients`: merge-patches its Node's
  nvidia.com/gpu.deploy.{device-plugin,gpu-feature-discovery,dcgm-exporter,dcgm,nvsm} labels through
  `maybeSetPaused` ("false" stays "false", anything else becomes "paused-for-mig-change").
- `waitForPodsToBeDeleted`: polls (List, field selector spec.nodeName=<node>) pods in
  DEFAULT_GPU_CLIENTS_NAMESPACE with app=nvidia-device-plugin-daemonset, app=gpu-feature-discovery,
  app=nvidia-dcgm-exporter, app=nvidia-dcgm until none is left (5 minutes, then it gives up WITHOUT
  resuming the clients), then lists pods on the node in ALL namespaces (waitForPodsWithNodeSelector,
  DaemonSet pods with a nodeSelector key nvidia.com/gpu.deploy.client), then deletes the validator
  pods one by one (`deletePod`: List + Delete; no DeleteCollection anywhere in v0.15.0).
- after `nvidia-mig-parted apply`: `restartKubernetesGPUClients` sets the labels through
  `maybeSetTrue` ("false" stays "false", anything else becomes "true").
- cmd/nvidia-mig-manager/main.go: a Node informer (list/watch, field selector metadata.name) and,
  only when CONFIG_FILE is empty, a generated-config ConfigMap (we always set CONFIG_FILE).
(The `clients.go` rewrite with `kubectl delete pod -l app=...` exists only in the unmerged
mig-parted pull request #216, not in a release.)
GPU Operator v26.7.0 assets carry the same app labels: state-device-plugin/0500_daemonset.yaml
(nvidia-device-plugin-daemonset), gpu-feature-discovery/0500_daemonset.yaml (gpu-feature-discovery),
state-dcgm-exporter/0800_daemonset.yaml (nvidia-dcgm-exporter).
"""

from __future__ import annotations

from typing import Any

import pytest
from gpu_stack_dev.chartlib import FULLNAME, NAMESPACE, find, one, render

from .nodematch import runs_on

PAUSED = "paused-for-mig-change"
PAUSED_LABELS = [f"nvidia.com/gpu.deploy.{c}" for c in
                 ("device-plugin", "gpu-feature-discovery", "dcgm-exporter", "dcgm", "nvsm")]
WAITED_APPS = ["nvidia-device-plugin-daemonset", "gpu-feature-discovery", "nvidia-dcgm-exporter", "nvidia-dcgm"]
ALL_NAMESPACES = "*"
# (verb, resource, namespace) of every API call v0.15.0 makes with CONFIG_FILE set.
UPSTREAM_CALLS = {
    ("get", "nodes", None), ("patch", "nodes", None), ("list", "nodes", None), ("watch", "nodes", None),
    ("list", "pods", NAMESPACE), ("delete", "pods", NAMESPACE), ("list", "pods", ALL_NAMESPACES),
}

MIG_VALUES = {"migManager.enabled": True, "sharing.configs.mig": {"migStrategy": "single"}}
GPU_NODE = {"feature.node.kubernetes.io/pci-10de.present": "true", "nvidia.com/mps.capable": "true"}
GPU_CLIENTS = ["device-plugin", "gpu-feature-discovery", "dcgm-exporter", "mps-control-daemon"]
STAY = ["mig-manager", "container-toolkit"]


def maybe_set_paused(value: str | None) -> str:
    return "false" if value == "false" else PAUSED


def maybe_set_true(value: str | None) -> str:
    return "false" if value == "false" else "true"


def pause(labels: dict[str, str]) -> dict[str, str]:
    return {**labels, **{k: maybe_set_paused(labels.get(k)) for k in PAUSED_LABELS}}


def resume(labels: dict[str, str]) -> dict[str, str]:
    return {**labels, **{k: maybe_set_true(labels.get(k)) for k in PAUSED_LABELS}}


def daemonsets() -> dict[str, dict[str, Any]]:
    objs = render(3, "mps-x10.yaml", MIG_VALUES).objects()
    return {ds["metadata"]["name"].removeprefix(f"{FULLNAME}-"): ds for ds in find(objs, "DaemonSet")}


def running(labels: dict[str, str]) -> set[str]:
    return {name for name, ds in daemonsets().items() if runs_on(ds["spec"]["template"]["spec"], labels)}


def test_pause_stops_every_gpu_client_and_resume_restarts_it() -> None:
    assert set(GPU_CLIENTS + STAY) <= running(GPU_NODE)
    paused = pause(GPU_NODE)
    assert running(paused) & set(GPU_CLIENTS) == set(), "a GPU client keeps the GPUs during a MIG change"
    assert set(STAY) <= running(paused), "the MIG manager must not stop itself or the toolkit"
    assert set(GPU_CLIENTS + STAY) <= running(resume(paused))


def test_a_component_the_user_switched_off_stays_off_after_a_mig_change() -> None:
    node = {**GPU_NODE, "nvidia.com/gpu.deploy.dcgm-exporter": "false"}
    assert "dcgm-exporter" not in running(node)
    assert "dcgm-exporter" not in running(resume(pause(node)))
    assert "device-plugin" in running(resume(pause(node)))


@pytest.mark.parametrize("component", ["container-toolkit", "mig-manager", "device-plugin"])
def test_deploy_label_false_keeps_a_component_off_the_node(component: str) -> None:
    assert component not in running({**GPU_NODE, f"nvidia.com/gpu.deploy.{component}": "false"})


def test_the_mig_manager_waits_for_exactly_our_paused_gpu_clients() -> None:
    sets = daemonsets()
    mig = sets["mig-manager"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in mig["env"]}
    assert env["DEFAULT_GPU_CLIENTS_NAMESPACE"] == NAMESPACE
    selected = {app: sorted(name for name, ds in sets.items()
                            if ds["metadata"]["namespace"] == NAMESPACE
                            and ds["spec"]["template"]["metadata"]["labels"].get("app") == app)
                for app in WAITED_APPS}
    assert selected == {"nvidia-device-plugin-daemonset": ["device-plugin"],
                        "gpu-feature-discovery": ["gpu-feature-discovery"],
                        "nvidia-dcgm-exporter": ["dcgm-exporter"],
                        "nvidia-dcgm": []}


def _grants(objs: list[dict[str, Any]], sa: str) -> set[tuple[str, str, str | None]]:
    """(verb, resource, namespace or None for cluster-wide) the ServiceAccount may use."""
    out: set[tuple[str, str, str | None]] = set()
    for kind, bind_kind in (("ClusterRole", "ClusterRoleBinding"), ("Role", "RoleBinding")):
        for binding in find(objs, bind_kind):
            if not any(s["kind"] == "ServiceAccount" and s["name"] == sa and s["namespace"] == NAMESPACE
                       for s in binding["subjects"]):
                continue
            role = one(objs, kind, binding["roleRef"]["name"])
            scope = None if kind == "ClusterRole" else binding["metadata"]["namespace"]
            for rule in role["rules"]:
                assert rule["apiGroups"] == [""], rule
                out |= {(v, r, scope) for v in rule["verbs"] for r in rule["resources"]}
    return out


def _allowed(grants: set[tuple[str, str, str | None]], verb: str, resource: str, ns: str | None) -> bool:
    if (verb, resource, None) in grants:
        return True
    return ns not in (None, ALL_NAMESPACES) and (verb, resource, ns) in grants


def test_mig_manager_rbac_is_exactly_what_its_code_calls() -> None:
    objs = render(3, "mig-mixed-all-balanced.yaml").objects()
    grants = _grants(objs, f"{FULLNAME}-mig-manager")
    missing = sorted(str(c) for c in UPSTREAM_CALLS if not _allowed(grants, *c))
    assert not missing, f"the MIG manager would be Forbidden: {missing}"
    unused = sorted(str(g) for g in grants
                    if not any(g[:2] == c[:2] and (g[2] is None) == (c[2] in (None, ALL_NAMESPACES))
                               for c in UPSTREAM_CALLS))
    assert not unused, f"grants the MIG manager never uses: {unused}"
    assert not any(v == "deletecollection" for v, _, _ in grants)


@pytest.mark.parametrize(("key", "label"), [("devicePlugin", "device-plugin"), ("gfd", "gpu-feature-discovery"),
                                            ("dcgmExporter", "dcgm-exporter")])
def test_an_affinity_that_drops_the_pause_label_is_refused(key: str, label: str) -> None:
    term = {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["yes"]}]}
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}
    out = render(3, "default", {**MIG_VALUES, f"{key}.affinity": affinity})
    assert not out.ok
    assert render(3, "default", {f"{key}.affinity": affinity}).ok, "no MIG manager, nothing to pause"
    assert f"{key}.affinity replaces the chart's GPU node affinity" in out.stderr
    assert f"nvidia.com/gpu.deploy.{label}" in out.stderr
    pausable = {"matchExpressions": [*term["matchExpressions"],
                                     {"key": f"nvidia.com/gpu.deploy.{label}", "operator": "NotIn",
                                      "values": ["false", PAUSED]}]}
    affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] = [pausable]
    assert render(3, "default", {**MIG_VALUES, f"{key}.affinity": affinity}).ok
