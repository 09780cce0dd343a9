"""The 4-node GPU cluster the inspect tests (unit and e2e) and the README use, as API objects.

Node labels are what GPU Feature Discovery and the MIG manager set, capacity/allocatable what the device
plugin advertises, for one chart install with Chart-values-examples/per-node-configs.yaml:

- gpu-a100-exclusive: 2x A100 40GB, config "default" (no label), exclusive.
- gpu-t4-timesliced: 2x T4, config ts-x4: 8 time-sliced nvidia.com/gpu, product "Tesla-T4-SHARED".
- gpu-l4-mps: 1x L4, config mps-x10: 10 MPS replicas, GFD's nvidia.com/mps.capable=true.
- gpu-a100-mig: 1x A100 40GB, config mig-mixed, MIG manager layout all-balanced (2x 1g.5gb, 1x 2g.10gb,
  1x 3g.20gb); the MIG-enabled GPU itself is not advertised as nvidia.com/gpu.

The chart's Grafana dashboards are installed too (monitoring.dashboards.enabled=true: three ConfigMaps in
namespace gpu-stack, folder "GPU"), `chart_dashboards()`.

Upstream facts (NVIDIA/k8s-device-plugin v0.20.0): internal/lm/resource.go baseLabeler sets
<resource>.product/.count/.replicas/.sharing-strategy, "none" unless replicas > 1, and appends "-SHARED"
to the product of a replicated GPU (internal/lm/mig-strategy_test.go "sharing is applied to single
device"); MIG-enabled GPUs get replicas "0" ("sharing is not applied to single MIG device"); mixed-strategy
MIG profiles are labelled per resource, e.g. nvidia.com/mig-1g.1gb.product "...-MIG-1g.300gb"
(internal/lm/resource_test.go "mig mixed appends shared"). NVIDIA/mig-parted v0.15.0
deployments/container/reconfigure-mig.sh sets nvidia.com/mig.config.state (pending/success/failed).
"""

from __future__ import annotations

import copy
import subprocess
from functools import cache
from typing import Any

import yaml

from gpu_stack_dev.paths import ROOT

VALUES = ROOT / "Chart-values-examples" / "per-node-configs.yaml"
RELEASE = NAMESPACE = "gpu-stack"
CONFIGMAP = "gpu-stack-device-plugin-configs"


def _gpu_labels(product: str, memory: int, count: int, replicas: int, strategy: str) -> dict[str, str]:
    return {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.memory": str(memory),
        "nvidia.com/gpu.count": str(count),
        "nvidia.com/gpu.replicas": str(replicas),
        "nvidia.com/gpu.sharing-strategy": strategy,
        "nvidia.com/cuda.driver-version.full": "580.95.05",
    }


def _mig_profile(profile: str, count: int, memory: int) -> dict[str, str]:
    key = f"nvidia.com/mig-{profile}"
    return {f"{key}.count": str(count), f"{key}.memory": str(memory), f"{key}.replicas": "1",
            f"{key}.sharing-strategy": "none", f"{key}.product": f"NVIDIA-A100-SXM4-40GB-MIG-{profile}"}


def node(name: str, labels: dict[str, str], resources: dict[str, int]) -> dict[str, Any]:
    base = {"cpu": "32", "memory": "263902724Ki", "pods": "110"}
    advertised = {**base, **{k: str(v) for k, v in resources.items()}}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                              **labels}},
        "status": {"capacity": advertised, "allocatable": dict(advertised)},
    }


NODES = [
    node("gpu-a100-exclusive",
         {**_gpu_labels("NVIDIA-A100-SXM4-40GB", 40960, 2, 1, "none"), "nvidia.com/mig.capable": "true"},
         {"nvidia.com/gpu": 2}),
    node("gpu-t4-timesliced",
         {**_gpu_labels("Tesla-T4-SHARED", 15360, 2, 4, "time-slicing"),
          "nvidia.com/device-plugin.config": "ts-x4"},
         {"nvidia.com/gpu": 8}),
    node("gpu-l4-mps",
         {**_gpu_labels("NVIDIA-L4-SHARED", 23034, 1, 10, "mps"), "nvidia.com/device-plugin.config": "mps-x10",
          "nvidia.com/mps.capable": "true"},
         {"nvidia.com/gpu": 10}),
    node("gpu-a100-mig",
         {**_gpu_labels("NVIDIA-A100-SXM4-40GB", 40960, 1, 0, "none"), "nvidia.com/device-plugin.config": "mig-mixed",
          "nvidia.com/mig.capable": "true", "nvidia.com/mig.strategy": "mixed",
          "nvidia.com/mig.config": "all-balanced", "nvidia.com/mig.config.state": "success",
          **_mig_profile("1g.5gb", 2, 4864), **_mig_profile("2g.10gb", 1, 9856), **_mig_profile("3g.20gb", 1, 19968)},
         {"nvidia.com/mig-1g.5gb": 2, "nvidia.com/mig-2g.10gb": 1, "nvidia.com/mig-3g.20gb": 1}),
    node("cpu-worker", {}, {}),
]


def container(name: str, gpus: dict[str, int] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": name, "image": "nvcr.io/nvidia/cuda:12.9.1-base-ubuntu24.04"}
    if gpus:
        spec["resources"] = {"limits": {k: str(v) for k, v in gpus.items()}}
    return spec


NO_KUBELET = [{"key": f"node.kubernetes.io/{taint}", "operator": "Exists", "effect": "NoExecute"}
              for taint in ("unreachable", "not-ready")]


def pod(namespace: str, name: str, node_name: str, containers: list[dict[str, Any]],
        init: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    # With no kubelet, a test API server's node lifecycle controller taints the nodes unreachable and
    # would evict the pods 5 minutes later; tolerating that (as DaemonSet pods do) keeps them.
    spec: dict[str, Any] = {"nodeName": node_name, "containers": containers, "tolerations": NO_KUBELET}
    if init:
        spec["initContainers"] = init
    # The API server sets phase Pending at creation (and, without a kubelet, it stays so).
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": namespace, "name": name}, "spec": spec,
            "status": {"phase": "Pending"}}


GPU = "nvidia.com/gpu"
PODS = [
    pod("ml", "train-bert", "gpu-a100-exclusive", [container("trainer", {GPU: 1}), container("logger")]),
    pod("ml", "notebook-1", "gpu-t4-timesliced", [container("jupyter", {GPU: 1})]),
    pod("ml", "notebook-2", "gpu-t4-timesliced", [container("jupyter", {GPU: 1})]),
    pod("vision", "detector", "gpu-t4-timesliced", [container("infer", {GPU: 1}), container("tracker", {GPU: 1})]),
    pod("serving", "llm-0", "gpu-l4-mps", [container("server", {GPU: 1})]),
    pod("serving", "llm-1", "gpu-l4-mps", [container("server", {GPU: 1})]),
    pod("serving", "llm-2", "gpu-l4-mps", [container("server", {GPU: 1})]),
    pod("ml", "mig-small", "gpu-a100-mig", [container("main", {"nvidia.com/mig-1g.5gb": 1})]),
    pod("vision", "mig-medium", "gpu-a100-mig", [container("main", {"nvidia.com/mig-3g.20gb": 1})],
        init=[container("warmup", {"nvidia.com/mig-3g.20gb": 1})]),
    pod("ml", "cpu-only", "cpu-worker", [container("main")]),
]
# Pods that must not count: finished ones (filtered by the server, and by the model), and an unbound one.
FINISHED_PODS = [
    {**pod("ml", "done-job", "gpu-a100-exclusive", [container("trainer", {GPU: 1})]),
     "status": {"phase": "Succeeded"}},
    {**pod("ml", "crashed", "gpu-l4-mps", [container("server", {GPU: 1})]), "status": {"phase": "Failed"}},
]
PENDING_POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": "ml", "name": "waiting"},
               "spec": {"containers": [container("main", {GPU: 1})]}}


@cache
def _helm() -> str:
    return subprocess.run([str(ROOT / "hack" / "ensure-helm.sh"), "3"], check=True, capture_output=True,
                          text=True).stdout.strip().splitlines()[-1]


def render_chart(args: list[str], namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """`helm template gpu-stack` with the per-node-configs overlay plus `args` (real helm 3)."""
    out = subprocess.run([_helm(), "template", RELEASE, str(ROOT / "charts" / "gpu-stack"), "-n", namespace,
                          "-f", str(VALUES), *args], check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@cache
def _configmap() -> dict[str, Any]:
    (found,) = render_chart(["--show-only", "templates/device-plugin/configmap.yaml"])
    assert found["metadata"]["name"] == CONFIGMAP
    return found


def chart_configmap() -> dict[str, Any]:
    """The device plugin ConfigMap exactly as the chart renders it for this cluster (a copy to change)."""
    return copy.deepcopy(_configmap())


@cache
def _dashboards() -> tuple[dict[str, Any], ...]:
    found = render_chart(["--set", "monitoring.dashboards.enabled=true",
                          "--show-only", "templates/monitoring/dashboards.yaml"])
    assert {d["kind"] for d in found} == {"ConfigMap"}
    return tuple(found)


def chart_dashboards() -> list[dict[str, Any]]:
    """The chart's Grafana dashboard ConfigMaps (monitoring.dashboards.enabled=true) as it renders them for
    this cluster, in namespace gpu-stack (copies to change)."""
    return copy.deepcopy(list(_dashboards()))
