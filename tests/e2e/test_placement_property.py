"""The webhook's reasoning agrees with the scheduler, as a property over generated fleets
and pods on the real kube-scheduler.

One release of `per-node-configs.yaml` (its configs are the other overlays' kinds side by side: exclusive
`default`, time-sliced `ts-x4`, MPS `mps-x10` on tainted nodes, MIG `mig-mixed`), its webhook live. Each
example publishes a generated fleet (every config on at least one node, more nodes of any config or none
at all, several GPU models), creates a batch of generated GPU pods through the webhook, waits until the
scheduler has decided each one (bound, or PodScheduled=False), checks, and deletes the pods and the fleet.
For every pod the webhook admitted:

1. it is bound only to a node whose device plugin config (its `nvidia.com/device-plugin.config` label,
   else the default config) is one of the pod's candidate configs as the webhook computes them
   (policy/gpus.py candidate_configs, with the release's own policy ConfigMap);
2. a pod left without the MPS toleration is not stuck on the MPS taint when it could only ever run on MPS
   nodes: PodScheduled=False while every node that matches its selectors and offers its resource is a
   node with the `gpu-stack.io/mps` taint. (A pod that waits on the taint while an exclusive
   or time-sliced node it matches is merely full waits for capacity, as designed: the webhook keeps
   non-MPS pods off MPS nodes.)

Every fleet holds every config: the webhook judges a pod against the configs of the policy, not against
the nodes of the moment, so a cluster missing a config is one the offline webhook cannot see. Pods select
nodes the ways README.md documents (nothing, a nodeSelector or required node affinity on the config label,
the MPS annotation, a nodeSelector on nvidia.com/mps.capable), ask for one whole GPU or one MIG slice.
Budget: few examples (each publishes a fleet), many pods each; no shrinking (each run costs a fleet).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import yaml
from gpu_stack_dev.e2e.e2elib import E2ECluster, LiveWebhook, Releases
from gpu_stack_dev.e2e.fleet import FULL_GPU, MPS_TAINT, ChartSharing, Fleet, NodeSpec, PublishedNode, delete_pods
from gpu_stack_webhook.policy.config import parse_config
from gpu_stack_webhook.policy.context import Context
from gpu_stack_webhook.policy.gpus import candidate_configs
from gpu_stack_webhook.policy.pod import PodView
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from .test_placement import CUDA_IMAGE

OVERLAY = "per-node-configs.yaml"
CONFIG_LABEL = "nvidia.com/device-plugin.config"
CONFIGS = ("default", "ts-x4", "mps-x10", "mig-mixed")
MIG = ("nvidia.com/mig-1g.5gb", "nvidia.com/mig-2g.10gb", "nvidia.com/mig-3g.20gb")
EXAMPLES = 10
PODS = st.integers(min_value=14, max_value=20)


@st.composite
def node_specs(draw: Any, prefix: str, index: int, config: str | None) -> NodeSpec:
    name = f"{prefix}-{index}"
    gpus = draw(st.integers(min_value=1, max_value=2))
    if config == "mig-mixed":
        return NodeSpec(name, gpus=gpus, model="NVIDIA-A100-SXM4-40GB", config=config, mig_config="all-balanced")
    model = draw(st.sampled_from(["Tesla-T4", "NVIDIA-L4"]))
    return NodeSpec(name, gpus=gpus, model=model, config=config)


@st.composite
def fleets(draw: Any) -> list[NodeSpec]:
    prefix = f"prop-{uuid.uuid4().hex[:6]}"
    extra = draw(st.lists(st.sampled_from([None, *CONFIGS]), max_size=3))
    configs: list[str | None] = [*CONFIGS, *extra]
    specs = [draw(node_specs(prefix, i, config)) for i, config in enumerate(configs)]
    return [*specs, NodeSpec(f"{prefix}-cpu")]


def _affinity(terms: Sequence[Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": list(term)} for term in terms]}}}


@st.composite
def pod_shapes(draw: Any) -> dict[str, Any]:
    """resource, and how the pod selects nodes: what goes into its metadata/spec besides the container."""
    resource = draw(st.sampled_from([FULL_GPU, FULL_GPU, FULL_GPU, *MIG]))
    pin = st.sampled_from(CONFIGS)
    selection = draw(st.sampled_from(["none", "config", "affinity", "two-terms", "annotation", "mps-capable"]))
    shape: dict[str, Any] = {"resource": resource, "annotations": {}, "spec": {}}
    if selection == "config":
        shape["spec"]["nodeSelector"] = {CONFIG_LABEL: draw(pin)}
    elif selection == "affinity":
        values = sorted(draw(st.sets(pin, min_size=1, max_size=3)))
        shape["spec"]["affinity"] = _affinity([[{"key": CONFIG_LABEL, "operator": "In", "values": values}]])
    elif selection == "two-terms":  # either term suffices: the second does not pin a config
        shape["spec"]["affinity"] = _affinity([
            [{"key": CONFIG_LABEL, "operator": "In", "values": [draw(pin)]}],
            [{"key": "nvidia.com/gpu.product", "operator": "In", "values": [draw(st.sampled_from(
                ["Tesla-T4", "NVIDIA-L4", "Tesla-T4-SHARED", "NVIDIA-L4-SHARED", "NVIDIA-A100-SXM4-40GB"]))]}]])
    elif selection == "annotation":
        shape["annotations"]["gpu-stack.io/mps"] = "true"
    elif selection == "mps-capable":
        shape["spec"]["nodeSelector"] = {"nvidia.com/mps.capable": "true"}
    return shape


def pod_manifest(fleet: Fleet, name: str, shape: Mapping[str, Any]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if shape["annotations"]:
        meta["annotations"] = dict(shape["annotations"])
    spec = {"restartPolicy": "Never", "tolerations": [fleet.toleration], **json.loads(json.dumps(shape["spec"])),
            "containers": [{"name": "cuda", "image": CUDA_IMAGE, "command": ["nvidia-smi"],
                            "resources": {"limits": {shape["resource"]: 1}}}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def matches(node: PublishedNode, spec: Mapping[str, Any]) -> bool:
    """Does the node satisfy the pod's nodeSelector and required node affinity (In expressions only, as
    generated here)?"""
    labels = node.labels
    if not (spec.get("nodeSelector") or {}).items() <= labels.items():
        return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution")
    if not required:
        return True
    return any(all(e["operator"] == "In" and labels.get(e["key"]) in e["values"] for e in term["matchExpressions"])
               for term in required["nodeSelectorTerms"])


def tolerates_mps(spec: Mapping[str, Any]) -> bool:
    """Does the pod tolerate the MPS taint (key gpu-stack.io/mps, effect NoSchedule, no value)?"""
    return any((t.get("key") in (None, "", MPS_TAINT["key"]) if t.get("operator") == "Exists"
                else t.get("key") == MPS_TAINT["key"] and not t.get("value"))
               and t.get("effect") in (None, "", MPS_TAINT["effect"]) for t in spec.get("tolerations") or [])


def offers(node: PublishedNode, resource: str) -> bool:
    return int(node.resources.get(resource, "0")) > 0


def decided(cluster: E2ECluster, namespace: str, names: set[str], timeout: float = 120) -> dict[str, dict[str, Any]]:
    """The namespace's pods once every one of `names` is bound or found unschedulable (or after `timeout`)."""
    deadline = time.monotonic() + timeout
    while True:
        pods = {p["metadata"]["name"]: p for p in cluster.get_json("pods", "-n", namespace)["items"]}
        done = {n for n, p in pods.items() if p["spec"].get("nodeName") or any(
            c["type"] == "PodScheduled" and c["status"] == "False" for c in p["status"].get("conditions", []))}
        if names <= done or time.monotonic() > deadline:
            return pods
        time.sleep(1)


def create_all(cluster: E2ECluster, namespace: str, pods: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Creates the pods in one kubectl call (each through the webhook); returns those admitted, as admitted.
    The webhook denies some generated pods (e.g. a MIG slice pinned to a config without MIG): not an error."""
    proc = cluster.kubectl("create", "-n", namespace, "-o", "json", "-f", "-", check=False,
                           input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(pods)}))
    items, text, decoder = [], proc.stdout.strip(), json.JSONDecoder()
    while text:  # kubectl prints one JSON object per created item
        item, end = decoder.raw_decode(text)
        items.extend(item["items"] if item.get("kind") == "List" else [item])
        text = text[end:].strip()
    admitted = {p["metadata"]["name"]: p for p in items if p.get("kind") == "Pod"}
    denied = {p["metadata"]["name"] for p in pods} - set(admitted)
    # each one refused by our webhook, not lost
    assert proc.stderr.count('admission webhook "validate.gpu-stack.io" denied the request') + proc.stderr.count(
        'admission webhook "mutate.gpu-stack.io" denied the request') == len(denied), proc.stderr
    return admitted


def test_the_scheduler_binds_admitted_pods_only_where_the_webhook_expects(
        cluster: E2ECluster, releases: Releases, live_webhook: Callable[..., LiveWebhook]) -> None:
    release, _ = releases.install(OVERLAY)
    namespace = cluster.create_namespace()
    live_webhook(release, probe_namespace=namespace)
    sharing = ChartSharing.render(cluster.helm, OVERLAY)
    policy_cm = next(cm for cm in cluster.get_json("configmaps", "-n", release.namespace)["items"]
                     if cm["metadata"]["name"].endswith("-webhook-policy"))
    ctx = Context.for_config(parse_config(yaml.safe_load(policy_cm["data"]["policy.yaml"]), "<release policy>"))
    seen = {"bound": 0, "unschedulable": 0, "denied": 0, "mutated": 0}

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              phases=(Phase.explicit, Phase.generate),
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(specs=fleets(), shapes=PODS.flatmap(lambda n: st.lists(pod_shapes(), min_size=n, max_size=n)))
    def example(specs: list[NodeSpec], shapes: list[dict[str, Any]]) -> None:
        with Fleet(cluster, sharing, specs) as fleet:
            try:
                check(fleet, shapes)
            finally:
                delete_pods(cluster, namespace)

    def check(fleet: Fleet, shapes: list[dict[str, Any]]) -> None:
        prefix = uuid.uuid4().hex[:6]
        submitted = {f"p{prefix}-{i}": pod_manifest(fleet, f"p{prefix}-{i}", s) for i, s in enumerate(shapes)}
        admitted = create_all(cluster, namespace, list(submitted.values()))
        seen["denied"] += len(submitted) - len(admitted)
        pods = decided(cluster, namespace, set(admitted))
        nodes = {n.name: n for n in fleet}
        wrong: list[str] = []
        for name, pod in admitted.items():
            final = pods[name]
            spec = final["spec"]
            candidates = {c.name for c in candidate_configs(PodView.of(submitted[name], "Pod"), ctx)}
            node = spec.get("nodeName")
            seen["mutated"] += len(pod["spec"].get("tolerations", [])) > len(submitted[name]["spec"]["tolerations"])
            if node:
                seen["bound"] += 1
                config = nodes[node].labels.get(sharing.config_label, sharing.default_config)
                if config not in candidates:
                    wrong.append(f"{name} bound to {node} (config {config}), webhook candidates {sorted(candidates)}: "
                                 f"{json.dumps(submitted[name]['spec'])}")
                continue
            condition = next(c for c in final["status"]["conditions"] if c["type"] == "PodScheduled")
            assert condition["status"] == "False", (name, condition)
            seen["unschedulable"] += 1
            resource = next(iter(spec["containers"][0]["resources"]["limits"]))
            fitting = [n for n in fleet if matches(n, spec) and offers(n, resource)]
            if not tolerates_mps(spec) and fitting and all(MPS_TAINT in n.taints for n in fitting):
                wrong.append(f"{name} left without the MPS toleration, only MPS nodes fit it "
                             f"({[n.name for n in fitting]}): {condition['message']}; "
                             f"{json.dumps(submitted[name]['spec'])}")
        assert not wrong, "\n".join(wrong)

    example()
    # The examples exercised both outcomes and the webhook's changes (not a property that holds vacuously).
    assert all(seen[k] > 0 for k in ("bound", "unschedulable", "mutated")), seen
