"""Chart-values-examples/mig-single-all-1g.yaml (8 mock A100s) and mig-mixed-all-balanced.yaml (8 mock H100s), MIG
mode off as the profiles ship, on the node: the chart's MIG manager DaemonSet runs the upstream nvidia-mig-manager
and nvidia-mig-parted v0.15.0 against NVIDIA's mock NVML and reacts to `nvidia.com/mig.config`; the real GFD labels
the node's MIG capability and strategy. docs/real-node.md ("The MIG manager") says what stops where, and why.

Only one chart value is about MIG beyond the overlays: `migManager.hostGpuClients: []`, which a user whose node runs
no host GPU services under systemd (as here) sets. The manager then runs mig-parted in its own container
(WITH_SHUTDOWN_HOST_GPU_CLIENTS=false), where the node's nvidia handler gives it the mock library, instead of
`chroot /host` (cmd/nvidia-mig-manager/main.go `migReconfigure`, v0.15.0), where the host has no libnvidia-ml.

What runs here, each shown by an outcome only the real binaries give: GFD's MIG labels on the Node, the manager
waiting for the label and then taking up the layout it names (`Updating to MIG config: <layout>`), and mig-parted
in the manager's container validating the chart's config for that layout. Past that the sandbox stops the manager
(its system D-Bus connection; docs/real-node.md, "The MIG manager", says where and why), and the tests stop with it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from gpu_stack_dev.e2e import agent_images
from gpu_stack_dev.e2e.e2elib import E2ECluster

from .agents import GpuRelease, gpu_release, node_labels
from .standin import wait_for

MIG_CONFIG = "nvidia.com/mig.config"
MIG_STATE = "nvidia.com/mig.config.state"
CONFIG_FILE = "/mig-parted-config/config.yaml"
# hostGpuClients: see the module doc. One webhook replica: this module does not look at the webhook, and on 2 shared
# cores its second pod is what `helm install --wait` waits longest for.
USER_VALUES: dict[str, object] = {"migManager.hostGpuClients": [], "webhook.replicas": 1,
                                  "webhook.podDisruptionBudget.enabled": False}
AGENTS = ("device-plugin", "gpu-feature-discovery", "mig-manager")


@dataclass(frozen=True)
class Overlay:
    file: str
    profile: str
    layout: str
    strategy: str
    product: str


SINGLE = Overlay("mig-single-all-1g.yaml", "a100", "all-1g", "single", "NVIDIA-A100-SXM4-40GB")
# MIG mode stays off on the H100s too: with it on and no MIG device (the mock creates none), the v0.20.0 plugin
# serves no resource (`No devices found. Waiting indefinitely.`), so the chart's readiness probe never passes
MIXED = Overlay("mig-mixed-all-balanced.yaml", "h100", "all-balanced", "mixed", "NVIDIA-H100-80GB-HBM3")


@dataclass
class MigNode:
    overlay: Overlay
    gpus: GpuRelease
    node: Any

    def manager_log(self) -> str:
        """The log of the MIG manager pod running now ("" while there is none)."""
        pods = [p for p in self.gpus.pods("mig-manager")
                if not p["metadata"].get("deletionTimestamp") and p["status"].get("phase") == "Running"]
        return "".join(str(self.node.kubectl("logs", "-n", p["metadata"]["namespace"], p["metadata"]["name"],
                                             "-c", "mig-manager", check=False).stdout) for p in pods)

    def select(self, layout: str) -> None:
        """Label the node with `layout`, as the chart's NodeFeatureRule (or its admin) does; a label already there
        is removed first, since the manager acts on a change of the value."""
        self.deselect()
        self.node.kubectl("label", "node", self.node.node_name, f"{MIG_CONFIG}={layout}")

    def deselect(self) -> None:
        self.node.kubectl("label", "node", self.node.node_name, f"{MIG_CONFIG}-", f"{MIG_STATE}-")

    def mig_parted(self, *args: str) -> tuple[int, str]:
        """The real nvidia-mig-parted in the manager's container, on the chart's config, as the manager runs it."""
        pod = next(p for p in self.gpus.pods("mig-manager") if p["status"].get("phase") == "Running"
                   and not p["metadata"].get("deletionTimestamp"))
        proc = self.node.kubectl("exec", "-n", pod["metadata"]["namespace"], pod["metadata"]["name"], "-c",
                                 "mig-manager", "--", "nvidia-mig-parted", *args, check=False)
        return int(proc.returncode), str(proc.stdout) + str(proc.stderr)


def ready(pod: dict[str, Any]) -> bool:
    return {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}.get("Ready") == "True"



def clear_mig_labels(real_node: Any) -> None:
    """What the manager and the test leave on the node: the layout, its state and the deploy labels it set."""
    labels = [k for k in node_labels(real_node)
              if k in (MIG_CONFIG, MIG_STATE) or k.startswith("nvidia.com/gpu.deploy.")]
    if labels:
        real_node.kubectl("label", "node", real_node.node_name, *(f"{k}-" for k in labels), check=False)


@pytest.fixture(scope="module", params=[SINGLE, MIXED], ids=lambda o: o.file.removesuffix(".yaml"))
def mig(request: pytest.FixtureRequest, cluster: E2ECluster, real_node: Any) -> Iterator[MigNode]:
    overlay: Overlay = request.param
    agent_images.load(real_node)
    clear_mig_labels(real_node)
    try:
        with gpu_release(cluster, real_node, overlay.file, overlay.profile, **USER_VALUES) as release:
            yield MigNode(overlay, release, real_node)
    finally:
        clear_mig_labels(real_node)


def test_gfd_labels_the_node_with_its_mig_capability_and_strategy(mig: MigNode) -> None:
    expected = {"nvidia.com/mig.capable": "true", "nvidia.com/mig.strategy": mig.overlay.strategy,
                "nvidia.com/gpu.product": mig.overlay.product}
    assert wait_for(lambda: all(node_labels(mig.node).get(k) == v for k, v in expected.items()),
                    f"GFD's labels {expected}", timeout=180)


def test_the_agents_run_without_restarts_or_errors(mig: MigNode) -> None:
    for component in AGENTS:
        pods = mig.gpus.pods(component)
        assert pods and all(ready(p) for p in pods), component
        assert all(s["restartCount"] == 0 for p in pods for s in p["status"]["containerStatuses"]), component
        assert mig.gpus.error_lines(component) == {}, component
    assert "Waiting for change to 'nvidia.com/mig.config' label" in mig.manager_log()


def test_mig_parted_in_the_managers_container_validates_the_charts_layout(mig: MigNode) -> None:
    """The chart's config file, as the manager's mig-parted reads it: the layout the overlay offers is there and
    valid, a name it does not offer is refused (cmd/nvidia-mig-parted/assert/assert.go, v0.15.0)."""
    status, out = mig.mig_parted("assert", "--valid-config", "-f", CONFIG_FILE, "-c", mig.overlay.layout)
    assert status == 0 and "Selected MIG configuration is valid" in out, out
    status, out = mig.mig_parted("assert", "--valid-config", "-f", CONFIG_FILE, "-c", "no-such-layout")
    assert status == 1 and "selected mig-config not present: no-such-layout" in out, out


def test_the_manager_takes_up_the_layout_the_node_label_names(mig: MigNode) -> None:
    """The manager's informer sees the label and it starts the reconfiguration to that layout
    (cmd/nvidia-mig-manager/main.go:436-446, v0.15.0); the sandbox stops it after that (see the module doc)."""
    mig.select(mig.overlay.layout)
    wait_for(lambda: f"Updating to MIG config: {mig.overlay.layout}" in mig.manager_log(),
             f"the manager to take up {mig.overlay.layout}", timeout=180)
