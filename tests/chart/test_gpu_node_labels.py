"""Who labels GPU nodes: GFD through the NodeFeature API, and the chart's NFD rule for
nvidia.com/gpu.present.

Upstream facts:
- NVIDIA/k8s-device-plugin v0.20.0 cmd/gpu-feature-discovery/main.go: flag use-node-feature-api
  (env GFD_USE_NODE_FEATURE_API) defaults to true; internal/lm/output.go: with it, GFD gets, creates
  and updates the NodeFeature "nvidia-features-for-<node>" in namespace $NAMESPACE and gets its own pod
  ($POD_NAME) for owner references (DaemonSet + pod, so the object outlives a GFD restart);
  deployments/helm/nvidia-device-plugin/templates/daemonset-gfd.yml sets NAMESPACE and POD_NAME from
  the downward API.
- NVIDIA/gpu-operator v26.7.0 controllers/nodelabeling_controller.go reconcileCommonGPULabel: the
  operator (not GFD) sets nvidia.com/gpu.present=true on nodes with an NFD NVIDIA PCI label
  (controllers/state_manager.go: pci-10de, pci-0302_10de, pci-0300_10de).
- kubernetes-sigs/node-feature-discovery v0.19.0 source/pci/utils.go: every PCI device's raw
  pci.device feature carries class (4 hex digits), vendor and device, whatever deviceClassWhitelist
  and deviceLabelFields say (those only shape the feature.node.kubernetes.io/pci-* labels).
"""

from __future__ import annotations

from typing import Any

import pytest
from gpu_stack_dev.chartlib import FULLNAME, NAMESPACE, find, one, overlays, render

GFD = f"{FULLNAME}-gpu-feature-discovery"


def gfd_container(objs: list[dict[str, Any]]) -> dict[str, Any]:
    ds = one(objs, "DaemonSet", GFD)
    return next(c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "gpu-feature-discovery")


def test_gfd_publishes_through_the_node_feature_api() -> None:
    objs = render(3).objects()
    env = {e["name"]: e for e in gfd_container(objs)["env"]}
    assert env["GFD_USE_NODE_FEATURE_API"]["value"] == "true"
    assert env["NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert "GFD_OUTPUT_FILE" not in env
    volumes = one(objs, "DaemonSet", GFD)["spec"]["template"]["spec"]["volumes"]
    assert not any("features.d" in (v.get("hostPath") or {}).get("path", "") for v in volumes)


def test_gfd_may_make_exactly_the_calls_of_its_node_feature_output() -> None:
    objs = render(3).objects()
    sa = one(objs, "DaemonSet", GFD)["spec"]["template"]["spec"]["serviceAccountName"]
    granted = set()
    for kind, bind_kind in (("Role", "RoleBinding"), ("ClusterRole", "ClusterRoleBinding")):
        for binding in find(objs, bind_kind):
            if any(s["name"] == sa and s["namespace"] == NAMESPACE for s in binding["subjects"]):
                role = one(objs, kind, binding["roleRef"]["name"])
                scope = binding["metadata"].get("namespace", "cluster")
                granted |= {(g, r, v, scope) for rule in role["rules"] for g in rule["apiGroups"]
                            for r in rule["resources"] for v in rule["verbs"]}
    assert granted == {
        ("nfd.k8s-sigs.io", "nodefeatures", "get", NAMESPACE),
        ("nfd.k8s-sigs.io", "nodefeatures", "create", NAMESPACE),
        ("nfd.k8s-sigs.io", "nodefeatures", "update", NAMESPACE),
        ("", "pods", "get", NAMESPACE),
        # config-manager: its Node's nvidia.com/device-plugin.config label
        ("", "nodes", "get", "cluster"), ("", "nodes", "list", "cluster"), ("", "nodes", "watch", "cluster"),
    }


def nfd_rule_labels(rule_obj: dict[str, Any], devices: list[dict[str, str]]) -> dict[str, str]:
    """Labels NFD master derives from these raw pci.device instances (op In only, as our rules use)."""
    out: dict[str, str] = {}
    for rule in rule_obj["spec"]["rules"]:
        for match in rule["matchFeatures"]:
            assert match["feature"] == "pci.device"
            exprs = match["matchExpressions"]
            assert all(e["op"] == "In" for e in exprs.values())
            if any(all(dev.get(k) in e["value"] for k, e in exprs.items()) for dev in devices):
                out.update(rule["labels"])
    return out


GPU_T4 = {"class": "0302", "vendor": "10de", "device": "1eb8"}
GPU_RTX = {"class": "0300", "vendor": "10de", "device": "2204"}
NVIDIA_AUDIO = {"class": "0403", "vendor": "10de", "device": "1aef"}
NVSWITCH = {"class": "0680", "vendor": "10de", "device": "22a3"}
MELLANOX_NIC = {"class": "0200", "vendor": "15b3", "device": "101b"}


@pytest.mark.parametrize("overlay", overlays())
def test_gpu_present_is_set_by_a_rule_on_nvidia_display_and_3d_controllers(overlay: str) -> None:
    objs = render(3, overlay).objects()
    rules = [r for r in find(objs, "NodeFeatureRule")
             if "nvidia.com/gpu.present" in str(r["spec"]["rules"])]
    if overlay.startswith("policy-only-"):  # the GPU Operator sets it itself; no agent of ours selects it
        assert rules == []
        return
    assert len(rules) == 1, "nothing sets nvidia.com/gpu.present, which the GPU agents select on"
    rule = rules[0]
    assert nfd_rule_labels(rule, [GPU_T4]) == {"nvidia.com/gpu.present": "true"}
    assert nfd_rule_labels(rule, [MELLANOX_NIC, GPU_RTX]) == {"nvidia.com/gpu.present": "true"}
    assert nfd_rule_labels(rule, [NVIDIA_AUDIO, NVSWITCH, MELLANOX_NIC]) == {}


def test_gpu_agents_select_the_label_the_rule_sets() -> None:
    objs = render(3).objects()
    rule = next(r for r in find(objs, "NodeFeatureRule") if r["metadata"]["name"] == f"{FULLNAME}-gpu-present")
    (label,) = rule["spec"]["rules"][0]["labels"]
    for ds in find(objs, "DaemonSet"):
        if ds["metadata"]["name"].endswith(("-nfd-worker",)):
            continue
        terms = ds["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert any(e["key"] == label for t in terms for e in t["matchExpressions"]), ds["metadata"]["name"]
