"""Chart-values-examples/dra.yaml on a node with 8 mock A100s: the chart's DRA kubelet plugin DaemonSet runs the
upstream gpu-kubelet-plugin (dra-driver-nvidia-gpu v0.4.1 under the chart's v0.5.0 tag; tests/e2e/node/agents.py
says what stands in), the webhook in front. The plugin publishes the GPUs as a ResourceSlice; the scheduler
allocates a claim of a pod the webhook admitted and the plugin prepares it on the node (its CDI spec), and
deletes that spec when the pod goes.

Values a user of this node sets beside the others' (agents.GPU_NODE_VALUES, mock_gpu.values): the node label
that picks the DRA driver, and `dra.kubeletPlugin.kubeletRootDir`, since this node's kubelet runs with
`--root-dir` <node dir>/kubelet (as k0s or MicroK8s kubelets run with their own). What stands in beyond the
other agent tests', each for what this machine lacks and a GPU node has (docs/real-node.md):
- a shared mount over the mock driver root's directory (`share_driver_root`): the plugin mounts the driver root
  with HostToContainer propagation, which containerd allows only from a shared or slave mount; systemd makes
  every mount of a GPU node shared, this run's private mount namespace has none.
- the host's boot_id inside gVisor (hack/node/runsc-wrap): the plugin reads /proc/sys/kernel/random/boot_id.
Not shown: the device inside the container. containerd 1.6 has no CDI (EnableCDI came in v1.7.0), so the
kubelet's CDI device for the claim reaches no container here; the test checks what the kubelet was given.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gpu_stack_dev.e2e import agent_images, mock_gpu
from gpu_stack_dev.e2e.e2elib import E2ECluster, unique

from .agents import GpuRelease, gpu_release
from .standin import scratch_namespace, wait_for
from .test_install import reviews_total

OVERLAY = "dra.yaml"
DRIVER = "gpu.nvidia.com"
PROVIDER_LABEL = "gpu-stack.io/gpu-provider"
# the plugin's CDI_ROOT (the chart's hostPath) and its claim spec names: vendor k8s.gpu.nvidia.com, class claim
# (cmd/gpu-kubelet-plugin/cdi.go cdiVendor/cdiClaimClass, v0.4.1)
CDI_ROOT = Path("/var/run/cdi")
CDI_KIND = f"k8s.{DRIVER}/claim"


def share_driver_root(real_node: Any) -> None:
    """The mock driver root's directory bind-mounted on itself and made shared, in this run's namespace only
    (the node's stop unmounts it): see the module docstring."""
    directory = real_node.mock_driver_root.parent
    if f" {directory} " in Path("/proc/self/mounts").read_text():
        return
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "--bind", str(directory), str(directory)], check=True)
    subprocess.run(["mount", "--make-shared", str(directory)], check=True)


@pytest.fixture(scope="module")
def a100(cluster: E2ECluster, real_node: Any) -> Iterator[GpuRelease]:
    agent_images.load(real_node)
    share_driver_root(real_node)
    real_node.kubectl("label", "node", real_node.node_name, "--overwrite", f"{PROVIDER_LABEL}=dra")
    try:
        with gpu_release(cluster, real_node, OVERLAY, "a100",
                         **{"dra.kubeletPlugin.kubeletRootDir": str(real_node.kubelet_root)}) as release:
            yield release
    finally:
        real_node.kubectl("label", "node", real_node.node_name, f"{PROVIDER_LABEL}-", check=False)
        real_node.kubectl("delete", "resourceslices", "--field-selector", f"spec.driver={DRIVER}", check=False)
        # claim specs a failed test left in the host's CDI root: this run's are the ones naming its node directory
        for spec in CDI_ROOT.glob(f"k8s.{DRIVER}-claim_*.yaml"):
            if str(real_node.dir) in spec.read_text():
                spec.unlink()


def slices(real_node: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(real_node.kubectl(
        "get", "resourceslices", "--field-selector", f"spec.driver={DRIVER},spec.nodeName={real_node.node_name}",
        "-o", "json").stdout)["items"]
    return items


def as_mib(quantity: str) -> int:
    units = {"Mi": 1, "Gi": 1024, "Ti": 1024 * 1024}
    return int(quantity[:-2]) * units[quantity[-2:]] if quantity[-2:] in units else int(quantity) // 2**20


def test_the_plugin_pod_is_ready_without_restarts_or_error_lines(a100: GpuRelease) -> None:
    (pod,) = a100.pods("dra-kubelet-plugin")
    assert {c["type"]: c["status"] for c in pod["status"]["conditions"]}["Ready"] == "True"
    assert all(s["restartCount"] == 0 for s in pod["status"]["containerStatuses"])
    assert a100.error_lines("dra-kubelet-plugin") == {}
    # the kubelet's plugin watcher found the registration socket under its own --root-dir (driver.go, v0.4.1)
    assert wait_for(lambda: "plugin_registered:true" in a100.cluster.kubectl(
        "logs", "-n", a100.release.namespace, pod["metadata"]["name"], "-c", "gpus").stdout,
        "the kubelet's registration of the plugin", timeout=60)


def test_the_plugin_publishes_every_mock_gpu_with_its_attributes(a100: GpuRelease, real_node: Any) -> None:
    published = wait_for(lambda: slices(real_node), "the plugin's ResourceSlices", timeout=120)
    assert {(s["spec"]["pool"]["name"], s["spec"]["pool"]["resourceSliceCount"]) for s in published} == {
        (real_node.node_name, len(published))}
    devices = {d["name"]: d for s in published for d in s["spec"]["devices"]}
    assert sorted(devices) == sorted(f"gpu-{i}" for i in range(a100.gpus.count))
    attributes = [d["attributes"] for d in devices.values()]
    assert sorted(a["uuid"]["string"] for a in attributes) == sorted(a100.gpus.uuids)
    driver_version = ".".join(str(int(part)) for part in mock_gpu.LIB_VERSION.split("."))
    for device in devices.values():
        attrs = device["attributes"]
        assert (attrs["type"]["string"], attrs["productName"]["string"], attrs["brand"]["string"]) == (
            "gpu", a100.gpus.product, "Nvidia")
        assert (attrs["architecture"]["string"], attrs["cudaComputeCapability"]["version"]) == ("Ampere", "8.0.0")
        assert attrs["driverVersion"]["version"] == driver_version
        assert as_mib(device["capacity"]["memory"]["value"]) == a100.gpus.memory_mib


def allowed_reviews(release: GpuRelease, kind: str) -> float:
    """/validate's allowed reviews of `kind` over the webhook pods, once the count holds still."""
    return reviews_total(release.cluster, release.release, release.pods("webhook"), "allowed", kind=kind)


def claim_template(name: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}}}


def claim_pod(real_node: Any, name: str, template: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
                     "containers": [{"name": "c", "image": real_node.busybox_image, "imagePullPolicy": "Never",
                                     "command": ["/bin/sh", "-c", "sleep 3600"],
                                     "resources": {"claims": [{"name": "gpu"}]}}]}}


def test_a_claim_of_a_pod_the_webhook_admitted_is_allocated_and_prepared(a100: GpuRelease, real_node: Any) -> None:
    wait_for(lambda: slices(real_node), "the plugin's ResourceSlices", timeout=120)
    with scratch_namespace(real_node, unique("dra")) as namespace:
        real_node.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(claim_template("one-gpu")))
        # the metric's kind label names the pod kinds; the DRA kinds count as `other` (server/metrics.py kind_label)
        before = {kind: allowed_reviews(a100, kind) for kind in ("Pod", "other")}
        real_node.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(claim_pod(real_node, "p", "one-gpu")))

        def running() -> dict[str, Any] | None:
            pod: dict[str, Any] = json.loads(real_node.kubectl("get", "pod", "-n", namespace, "p", "-o",
                                                               "json").stdout)
            return pod if pod["status"].get("phase") == "Running" else None
        pod = wait_for(running, "the claim's pod running", timeout=180)
        # the webhook's /validate admitted the pod, not only CEL, and the claim made from the template (GPU009)
        assert allowed_reviews(a100, "Pod") == before["Pod"] + 1
        assert allowed_reviews(a100, "other") > before["other"]
        (claim,) = json.loads(real_node.kubectl("get", "resourceclaims", "-n", namespace, "-o",
                                                "json").stdout)["items"]
        assert claim["status"]["reservedFor"] == [{"name": "p", "resource": "pods", "uid": pod["metadata"]["uid"]}]
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert (result["driver"], result["pool"], result["request"]) == (DRIVER, real_node.node_name, "gpu")
        index = int(result["device"].removeprefix("gpu-"))
        # prepared: the plugin's CDI spec for the claim names the allocated GPU's device node (under the driver root)
        cdi_name = f"{claim['metadata']['uid']}-{result['device']}"
        spec_file = CDI_ROOT / f"k8s.{DRIVER}-claim_{claim['metadata']['uid']}.yaml"
        text = spec_file.read_text()
        assert f"kind: {CDI_KIND}" in text and f"name: {cdi_name}" in text
        assert f"hostPath: {a100.gpus.root}/dev/nvidia{index}\n" in text
        # ... and the kubelet gave that CDI device to the container
        (status,) = pod["status"]["containerStatuses"]
        assert [r["resourceID"] for s in status["allocatedResourcesStatus"] if s["name"] == "claim:gpu"
                for r in s["resources"]] == [f"{CDI_KIND}={cdi_name}"]
        real_node.kubectl("delete", "pod", "-n", namespace, "p", "--wait=true")
        assert wait_for(lambda: not spec_file.exists(), "the claim unprepared (its CDI spec removed)", timeout=120)
    assert a100.error_lines("dra-kubelet-plugin") == {}
