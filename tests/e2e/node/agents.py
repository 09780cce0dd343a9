"""The chart's own NVIDIA agent DaemonSets on the real node, running their upstream binaries (images from
gpu_stack_dev.e2e.agent_images) against NVIDIA's mock NVML (gpu_stack_dev.e2e.mock_gpu). The DaemonSets are the
ones users get: only values a user of such a node sets are passed (GPU_NODE_VALUES, mock_gpu.values).

What stands in, and why (docs/real-node.md says the same):
- NFD's master: `NodeFeatureCopier` copies the labels of GFD's NodeFeature objects onto the Node, as nfd-master
  does (NFD v0.19.0 has no vendor/ and cannot be built offline).
- the NVIDIA container runtime's injection of the mock driver into containers given GPUs
  (hack/node/nvidia-runtime-standin); nvidia-smi (proprietary: a script, mock_gpu.NVIDIA_SMI).
- the config-manager sidecar's SIGHUP to its neighbour: every container is a gVisor sandbox of its own here, so
  it cannot see the plugin's pid; `sighup` sends the signal through containerd instead.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_stack_dev import node as node_mod
from gpu_stack_dev.e2e import mock_gpu
from gpu_stack_dev.e2e.e2elib import E2ECluster, Release, Releases
from gpu_stack_dev.e2e.node_install import TEST_NAMESPACE

from .conftest import install_and_wait
from .standin import apply_pod, wait_for
from .test_install import reviews_total

AGENT_NAMESPACE = "gpu-stack"
# What a cluster whose GPU nodes come with the driver and the toolkit preinstalled sets (as
# Chart-values-examples/preinstalled-driver-toolkit.yaml), keeping the chart's `nvidia` RuntimeClass name
# for the agents, which the node's toolkit registers (the test creates the RuntimeClass as its admin would).
# dcgmExporter.enabled=false: DCGM (libdcgm) is not built here, so its exporter cannot run.
GPU_NODE_VALUES: dict[str, object] = {
    "toolkit.enabled": False, "toolkit.acceptEnvvarUnprivileged": False, "toolkit.acceptVolumeMounts": True,
    "dcgmExporter.enabled": False,
}
GPU_PRESENT = "nvidia.com/gpu.present"
# klog's error lines ("E1128 11:22:33.444 ...") and the Go log/logrus error forms
ERROR_LINE = re.compile(r"^(E\d{4} |.*level=error|.*\[ERROR\]|.*\bfatal\b)", re.I)


class NodeFeatureCopier(threading.Thread):
    """Stand-in for nfd-master: every NodeFeature object's spec.labels for this node, onto the Node."""

    def __init__(self, real_node: Any) -> None:
        super().__init__(daemon=True)
        self.node, self.stopped, self.copied = real_node, threading.Event(), {}

    def run(self) -> None:
        while not self.stopped.wait(1):
            proc = self.node.kubectl("get", "nodefeatures.nfd.k8s-sigs.io", "-A", "-o", "json", check=False)
            if proc.returncode:
                continue
            labels: dict[str, str] = {}
            for item in json.loads(proc.stdout)["items"]:
                if item["metadata"].get("labels", {}).get("nfd.node.kubernetes.io/node-name") == self.node.node_name:
                    labels |= item.get("spec", {}).get("labels") or {}
            gone = [k for k in self.copied if k not in labels]
            if labels != self.copied:
                self.node.kubectl("label", "node", self.node.node_name, "--overwrite",
                                  *(f"{k}={v}" for k, v in labels.items()), *(f"{k}-" for k in gone), check=False)
                self.copied = labels

    def stop(self) -> None:
        self.stopped.set()
        self.join(timeout=10)


@dataclass
class GpuRelease:
    release: Release
    gpus: mock_gpu.MockGpus
    cluster: E2ECluster
    node: Any

    def pods(self, component: str = "") -> list[dict[str, Any]]:
        selector = self.release.selector + (f",app.kubernetes.io/component={component}" if component else "")
        items: list[dict[str, Any]] = self.cluster.get_json("pods", "-n", self.release.namespace, "-l",
                                                            selector)["items"]
        return items

    def error_lines(self, component: str) -> dict[str, list[str]]:
        """Error lines in the logs of every container of the component's pods (current and previous runs)."""
        found: dict[str, list[str]] = {}
        for pod in self.pods(component):
            for container in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]:
                log = self.cluster.kubectl("logs", "-n", self.release.namespace, pod["metadata"]["name"], "-c",
                                           container["name"], check=False).stdout
                bad = [line for line in log.splitlines() if ERROR_LINE.match(line)]
                if bad:
                    found[f"{pod['metadata']['name']}/{container['name']}"] = bad
        return found

    def webhook_allowed(self) -> float:
        """Pods the webhook's /validate allowed, summed over its pods once the count holds still (each worker
        flushes its counters once a second). Allowed decisions are not logged, so the metric is what shows it."""
        return reviews_total(self.cluster, self.release, self.pods("webhook"), "allowed")

    def container_id(self, component: str, container: str) -> str:
        (pod,) = [p for p in self.pods(component) if p["status"].get("phase") == "Running"]
        status = next(s for s in pod["status"]["containerStatuses"] if s["name"] == container)
        return str(status["containerID"]).removeprefix("containerd://")

    def sighup(self, component: str, container: str) -> None:
        """The config-manager sidecar's SIGHUP to its neighbour, sent through containerd (see the module doc)."""
        self.node.ctr("tasks", "kill", "-s", "SIGHUP", self.container_id(component, container))


def node_labels(real_node: Any) -> dict[str, str]:
    labels: dict[str, str] = json.loads(real_node.kubectl("get", "node", real_node.node_name, "-o",
                                                          "json").stdout)["metadata"].get("labels", {})
    return labels


def allocatable(real_node: Any, resource: str = "nvidia.com/gpu") -> str | None:
    status = json.loads(real_node.kubectl("get", "node", real_node.node_name, "-o", "json").stdout)["status"]
    value = status["allocatable"].get(resource)
    return str(value) if value is not None else None


def share_mps_root(real_node: Any) -> None:
    """The MPS daemon's Bidirectional mount of /run/nvidia/mps needs a shared mount there (containerd: `is mounted
    on "/" but it is not a shared mount`), as a GPU node's systemd gives every mount; this run's mount namespace
    is private, so the node's own directory is bind-mounted there and made shared, in this namespace only."""
    mps_root, source = Path("/run/nvidia/mps"), real_node.dir / "mps-root"
    if str(mps_root) in Path("/proc/self/mounts").read_text():
        return
    mps_root.mkdir(parents=True, exist_ok=True)
    source.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "--bind", str(source), str(mps_root)], check=True)
    subprocess.run(["mount", "--make-shared", str(mps_root)], check=True)


@contextmanager
def gpu_release(cluster: E2ECluster, real_node: Any, overlay: str, profile: str,
                **values: object) -> Iterator[GpuRelease]:
    """The chart installed with `overlay` on a node whose mock driver has `profile`'s GPUs, `--wait`ed (every
    agent pod Ready), NFD's master standing in; uninstalled after, with the GPU label and the copied labels
    removed and the kubelet's devices withdrawn (allocatable 0) so the next release starts from nothing."""
    gpus = mock_gpu.lay_out(real_node.mock_driver_root, profile)
    share_mps_root(real_node)
    # the RuntimeClass the preinstalled toolkit's admin creates; removed after, since a release that runs the
    # chart's toolkit creates its own of that name
    created = real_node.kubectl("create", "-f", "-", check=False, input=json.dumps({
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": node_mod.NVIDIA_HANDLER},
        "handler": node_mod.NVIDIA_HANDLER})).returncode == 0
    real_node.kubectl("label", "node", real_node.node_name, "--overwrite", f"{GPU_PRESENT}=true")
    # the helm tests' namespace (INSTALL_SET), removed after: tests/e2e/node/conftest.py's `installed` creates it
    test_namespace = real_node.kubectl("create", "namespace", TEST_NAMESPACE, check=False).returncode == 0
    copier = NodeFeatureCopier(real_node)
    copier.start()
    releases = Releases(cluster)
    try:
        release = install_and_wait(releases, overlay, namespace=AGENT_NAMESPACE, timeout="5m",
                                   **GPU_NODE_VALUES, **mock_gpu.values(gpus.root), **values)
        yield GpuRelease(release, gpus, cluster, real_node)
    finally:
        copier.stop()
        releases.cleanup()
        real_node.kubectl("label", "node", real_node.node_name, f"{GPU_PRESENT}-", "nvidia.com/device-plugin.config-",
                          *(f"{k}-" for k in copier.copied), check=False)
        wait_for(lambda: allocatable(real_node) in (None, "0"), "the plugin's devices withdrawn", timeout=120)
        wait_for(lambda: real_node.kubectl("get", "namespace", AGENT_NAMESPACE, check=False).returncode,
                 f"namespace {AGENT_NAMESPACE} deleted", timeout=120)
        if created:
            real_node.kubectl("delete", "runtimeclass", node_mod.NVIDIA_HANDLER, check=False)
        if test_namespace:
            real_node.kubectl("delete", "namespace", TEST_NAMESPACE, check=False)
        shutil.rmtree(real_node.mock_driver_root)  # the nvidia handler injects nothing into later tests' pods


def plugin_verdict(real_node: Any, namespace: str, name: str, gpus: int) -> str:
    """'runs', or the kubelet's admission message after the real plugin's Allocate refused the pod."""
    apply_pod(real_node, namespace, name, gpus=gpus)

    def outcome() -> str | None:
        status = json.loads(real_node.kubectl("get", "pod", "-n", namespace, name, "-o", "json").stdout)["status"]
        if status.get("reason") == "UnexpectedAdmissionError":
            return str(status.get("message"))
        running = [s for s in status.get("containerStatuses", []) if "running" in s.get("state", {})]
        return "runs" if running else None
    return str(wait_for(outcome, f"{name} running or refused by the plugin"))


def webhook_verdict(real_node: Any, namespace: str, gpus: int, node_name: str | None = None) -> str:
    """The API server's answer to a dry-run create through the webhook ('admitted', with its warnings, or the
    denial); a pod
    pinned to `node_name` is judged by that node's config label (webhook.lookups)."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"dry-{gpus}", "namespace": namespace},
           "spec": {"containers": [{"name": "c", "image": real_node.busybox_image,
                                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
                    **({"nodeName": node_name} if node_name else {})}}
    proc = real_node.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False)
    warnings = proc.stderr.strip()
    return (f"admitted (warnings: {warnings})" if warnings else "admitted") if proc.returncode == 0 else proc.stderr
