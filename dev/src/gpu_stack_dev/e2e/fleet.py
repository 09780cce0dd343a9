"""A simulated GPU fleet: Nodes published as the chart's agents would publish them for one overlay.

There is no kubelet, device plugin or GPU Feature Discovery on the e2e plane, so a test describes its
nodes (`NodeSpec`: name, GPU model and count, the device plugin config the node is labelled with) and
`Fleet.publish` creates them through the API server as the agents would leave them: the Node, then
capacity/allocatable and a Ready condition through the status subresource (the kubelet's part), the
`node.kubernetes.io/not-ready` taint the API server adds at creation removed (the node lifecycle
controller's part; it is off on this plane, see hack/controlplane.py).

What a GPU node advertises is derived, never written by hand: `ChartSharing.render(helm, overlay)` runs
`helm template` for the overlay and reads the device plugin's own inputs from the render (the config files
of the `<release>-device-plugin-configs` ConfigMap, and DEFAULT_CONFIG / NODE_LABEL of its config-manager
container); `plan(spec, sharing)` (pure) turns one NodeSpec into labels, taints and resources. Each fact
cites the upstream source it mirrors: NVIDIA/k8s-device-plugin v0.20.0 (device plugin and GFD, the
versions the chart pins, tests/chart/test_upstream_versions.py).

MIG: a node whose device plugin config has migStrategy single or mixed gets the MIG devices the MIG
manager makes of each GPU: the layout is the node's `nvidia.com/mig.config` label (`NodeSpec.mig_config`,
as the user sets it, else the value the chart's `<release>-mig-default-config` NodeFeatureRule gives GPUs
with the PCI device IDs it lists), read from the chart's `<release>-mig-parted-config` ConfigMap, where
each GPU takes the entry whose device-filter names its PCI device ID (an entry without a filter: every
GPU; NVIDIA/mig-parted v0.15.0 api/spec/v1/helpers.go MatchesDeviceFilter). The device plugin then advertises under
`single` every MIG device as one nvidia.com/gpu (all of one profile, else it refuses), under `mixed`
each profile as nvidia.com/mig-<profile>; GFD labels them (k8s-device-plugin v0.20.0
internal/lm/mig-strategy.go, resource.go). A GPU no layout entry names, or a node without a layout,
keeps MIG off (the GPUs' factory state): full GPUs, as under `none`.

Not modelled (FleetError when asked for): per-device `devices` lists in a sharing config, sharing
sections beside a MIG strategy, MIG profiles with media-extension suffixes (`+me`, `+gfx`), the per-MIG-
device attribute labels GFD adds (`<resource>.memory`, `.multiprocessors`, `.slices.*`, `.engines.*`:
NVML facts of each profile; under `single` the full GPU's `nvidia.com/gpu.memory` is left off instead of
being published wrong). A NodeSpec naming a GPU model, config, MIG layout or label that no agent
publishes is a FleetError too: the fleet never invents a fact.
"""

from __future__ import annotations

import copy
import json
import time
import uuid
from collections.abc import Iterable, Iterator

from .e2elib import E2ECluster
from .fleet_facts import (
    AGENT_LABELS,
    FLEET_TAINT_KEY,
    FULL_GPU,
    GPU_MODELS,
    KUBELET_LABELS,
    MIG_CONFIG_LABEL,
    MIG_LABEL,
    MIG_PROFILE,
    MIG_RESOURCE_PREFIX,
    MIG_STATE_LABEL,
    MPS_TAINT,
    NODE_BASE,
    NOT_READY_TAINT,
    RESOURCE_PREFIX,
    SHARED_SUFFIX,
    ChartSharing,
    FleetError,
    GpuModel,
    NodeSpec,
    PublishedNode,
)
from .fleet_plan import mig_layout, mig_strategy, plan

__all__ = [
    "AGENT_LABELS",
    "FLEET_TAINT_KEY",
    "FULL_GPU",
    "GPU_MODELS",
    "KUBELET_LABELS",
    "MIG_CONFIG_LABEL",
    "MIG_LABEL",
    "MIG_PROFILE",
    "MIG_RESOURCE_PREFIX",
    "MIG_STATE_LABEL",
    "MPS_TAINT",
    "NODE_BASE",
    "NOT_READY_TAINT",
    "RESOURCE_PREFIX",
    "SHARED_SUFFIX",
    "ChartSharing",
    "Fleet",
    "FleetError",
    "GpuModel",
    "NodeSpec",
    "PublishedNode",
    "delete_node",
    "delete_pods",
    "mig_layout",
    "mig_strategy",
    "plan",
    "wait_scheduled",
]


def delete_pods(cluster: E2ECluster, namespace: str) -> None:
    """Every pod of the namespace, bound ones too: no kubelet confirms a graceful deletion, so --force."""
    cluster.kubectl("delete", "pods", "--all", "-n", namespace, "--force", "--grace-period=0", "--wait=true")


class Fleet:
    """Publishes the planned nodes on a cluster and deletes them, with every pod bound to them, at the
    end (a context manager).

    Isolation: e2e tests share one plane and leave Pending pods behind (their namespaces are deleted
    without waiting; some belong to controllers that recreate them). Each fleet's nodes carry one more
    taint, FLEET_TAINT_KEY=<fleet id>:NoSchedule, that no agent publishes: only pods given
    `fleet.toleration` (the test's own) can land there. It is the one fact not mirrored from upstream,
    and nothing the webhook reads."""

    def __init__(self, cluster: E2ECluster, sharing: ChartSharing, specs: Iterable[NodeSpec]) -> None:
        self.cluster = cluster
        self.nodes = [plan(spec, sharing) for spec in specs]  # every FleetError before anything is created
        self.published: list[str] = []
        self.id = uuid.uuid4().hex[:8]
        self.taint = {"key": FLEET_TAINT_KEY, "value": self.id, "effect": "NoSchedule"}
        self.toleration = {"key": FLEET_TAINT_KEY, "operator": "Equal", "value": self.id, "effect": "NoSchedule"}

    def __enter__(self) -> Fleet:
        for node in self.nodes:
            self.publish(node)
        return self

    def __exit__(self, *exc: object) -> None:
        self.delete()

    def __iter__(self) -> Iterator[PublishedNode]:
        return iter(self.nodes)

    def publish(self, node: PublishedNode) -> None:
        kubectl = self.cluster.kubectl
        manifest = node.manifest()
        manifest["spec"]["taints"] = [*manifest["spec"].get("taints", []), self.taint]
        kubectl("create", "-f", "-", input=json.dumps(manifest))
        self.published.append(node.name)
        kubectl("patch", "node", node.name, "--subresource=status", "--type=merge",
                "-p", json.dumps({"status": node.status()}))
        # The node lifecycle controller's part: a Ready node loses the not-ready taint the API server's
        # TaintNodesByCondition admission added at creation.
        taints = [*(copy.deepcopy(dict(t)) for t in node.taints), self.taint]
        kubectl("patch", "node", node.name, "--type=merge", "-p", json.dumps({"spec": {"taints": taints}}))
        published = self.cluster.get_json("node", node.name)
        assert [t["key"] for t in published["spec"]["taints"]] == [t["key"] for t in taints], published

    def delete(self) -> None:
        for name in self.published:
            delete_node(self.cluster, name)
        self.published.clear()


def delete_node(cluster: E2ECluster, name: str) -> None:
    """The node and every pod bound to it, whichever test made them: with no kubelet, bound pods never
    finish a graceful deletion, and pods left on a deleted node would count as bound (e.g. for
    `kubectl gpu-stack inspect`) until the pod garbage collector's orphan sweep."""
    cluster.kubectl("delete", "pods", "--all-namespaces", f"--field-selector=spec.nodeName={name}", "--force",
                    "--grace-period=0", "--wait=true", check=False)
    cluster.kubectl("delete", "node", name, "--ignore-not-found", "--wait=false", check=False)


def wait_scheduled(cluster: E2ECluster, namespace: str, pod: str, want: str = "True",
                   timeout: float = 60) -> tuple[str, str, str]:
    """(status, message, nodeName) of the pod's PodScheduled condition once its status is `want` ("True":
    bound, "False": unschedulable), or as it stands after `timeout` seconds (the caller's assert fails).
    A pod found unschedulable is retried by the scheduler when the cluster changes (a node published,
    a pod deleted), so a "False" seen on the way to "True" is not the answer."""
    deadline = time.monotonic() + timeout
    seen = ("", "no PodScheduled condition", "")
    while True:
        obj = cluster.get_json("pod", pod, "-n", namespace)
        for condition in obj.get("status", {}).get("conditions", []):
            if condition["type"] == "PodScheduled":
                seen = (condition["status"], condition.get("message", ""), obj["spec"].get("nodeName", ""))
        if seen[0] == want or time.monotonic() > deadline:
            return seen
        time.sleep(0.5)
