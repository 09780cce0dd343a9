"""Chart-values-examples/mig-single-all-1g.yaml (8 mock A100s) and mig-mixed-all-balanced.yaml (8 mock H100s), MIG
mode off as the profiles ship, on the node: the chart's MIG manager DaemonSet runs the upstream nvidia-mig-manager
and nvidia-mig-parted v0.15.0 against NVIDIA's mock NVML and reacts to `nvidia.com/mig.config`; the real GFD labels
the node's MIG capability and strategy. docs/real-node.md ("The MIG manager") says what stops where, and why.

Only one chart value is about MIG beyond the overlays: `migManager.hostGpuClients: []`, which a user whose node runs
no host GPU services under systemd (as here) sets. The manager then runs mig-parted in its own container
(WITH_SHUTDOWN_HOST_GPU_CLIENTS=false), where the node's nvidia handler gives it the mock library, instead of
`chroot /host` (cmd/nvidia-mig-manager/main.go `migReconfigure`, v0.15.0), where the host has no libnvidia-ml.

Stand-ins, each added only after the test has shown the manager or mig-parted stop for its lack:
- a system D-Bus (tests/e2e/node/system_bus.py): the manager connects before every reconfiguration. Under
  gVisor it still stops there: the sandbox refuses the credentials godbus sends to authenticate, so the manager
  never reaches `Run`, which sets `nvidia.com/mig.config.state`;
- /proc/modules with the `nvidia` line (mock_gpu.stand_in_proc_modules, bound by the node's nvidia handler):
  mig-parted reads it first (cmd/nvidia-mig-parted/util/nvml.go `IsNvidiaModuleLoaded`); then it lists GPUs from
  /sys/bus/pci/devices, where this machine has none.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from gpu_stack_dev.e2e import agent_images, mock_gpu
from gpu_stack_dev.e2e.e2elib import E2ECluster

from .agents import GpuRelease, gpu_release, node_labels
from .standin import wait_for
from .system_bus import bus_directory, system_bus

MIG_CONFIG = "nvidia.com/mig.config"
MIG_STATE = "nvidia.com/mig.config.state"
CONFIG_FILE = "/mig-parted-config/config.yaml"
D_BUS = ("Error: error creating reconfigure instance: failed to initialize systemd manager: "
         "failed to connect to systemd D-Bus: ")
NO_BUS = D_BUS + "dial unix /host/run/dbus/system_bus_socket: connect: no such file or directory"
BUS_REFUSED = D_BUS + "write unix @: sendmsg: invalid argument"
NO_PROC_MODULES = ("Error checking if nvidia module loaded: unable to read /proc/modules: "
                   "open /proc/modules: no such file or directory")
# hostGpuClients: see the module doc. One webhook replica: this module does not look at the webhook, and on 2 shared
# cores its second pod is what `helm install --wait` waits longest for.
USER_VALUES: dict[str, object] = {"migManager.hostGpuClients": [], "webhook.replicas": 1,
                                  "webhook.podDisruptionBudget.enabled": False}
AGENTS = ("device-plugin", "gpu-feature-discovery", "mig-manager")
# logrus's error lines, without their time= field
LOGRUS_ERROR = re.compile(r'level=(?:error|fatal) msg="(.*)"$')


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
    bus: Path

    def manager_log(self) -> str:
        """The log of the MIG manager pod running now ("" while there is none)."""
        pods = [p for p in self.gpus.pods("mig-manager")
                if not p["metadata"].get("deletionTimestamp") and p["status"].get("phase") == "Running"]
        return "".join(str(self.node.kubectl("logs", "-n", p["metadata"]["namespace"], p["metadata"]["name"],
                                             "-c", "mig-manager", check=False).stdout) for p in pods)

    def errors(self) -> list[str]:
        return [m.group(1) for line in self.manager_log().splitlines() if (m := LOGRUS_ERROR.search(line))]

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

    def restart_manager(self) -> None:
        (pod,) = self.gpus.pods("mig-manager")
        self.node.kubectl("delete", "pod", "-n", pod["metadata"]["namespace"], pod["metadata"]["name"])
        wait_for(lambda: any(ready(p) and p["metadata"]["name"] != pod["metadata"]["name"]
                             for p in self.gpus.pods("mig-manager")), "a new MIG manager pod Ready", timeout=180)


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
        with bus_directory(real_node) as bus, gpu_release(cluster, real_node, overlay.file, overlay.profile,
                                                          **USER_VALUES) as release:
            yield MigNode(overlay, release, real_node, bus)
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


def test_the_manager_acts_on_the_label_and_stops_at_the_system_bus(mig: MigNode) -> None:
    """No bus: the manager says so and sets no state. With the stand-in bus: gVisor refuses the credentials
    message godbus sends to authenticate (SCM_CREDENTIALS over a host socket), the same stop one step later."""
    mig.select(mig.overlay.layout)
    wait_for(lambda: NO_BUS in mig.errors(), "the manager to try the host's D-Bus", timeout=180)
    with system_bus(mig.bus):
        mig.select(mig.overlay.layout)
        wait_for(lambda: BUS_REFUSED in mig.errors(), "the manager to try the stand-in bus", timeout=180)
    assert mig.errors() == [NO_BUS, BUS_REFUSED]
    assert MIG_STATE not in node_labels(mig.node)
    assert all(not k.startswith("nvidia.com/gpu.deploy.") for k in node_labels(mig.node))


def test_mig_parted_in_the_managers_container_needs_proc_modules_then_finds_no_gpu(mig: MigNode) -> None:
    """The mig-parted calls the manager would make next (pkg/mig/reconfigure/reconfigure.go `Run`, v0.15.0)."""
    layout = mig.overlay.layout
    status, out = mig.mig_parted("-d", "assert", "-f", CONFIG_FILE, "-c", layout)
    assert status == 1 and NO_PROC_MODULES in out, out
    mock_gpu.stand_in_proc_modules(mig.gpus.gpus.root)
    mig.deselect()  # a new manager acts at once on a label it finds
    mig.restart_manager()
    # with the nvidia line, mig-parted lists the GPUs from /sys/bus/pci/devices (cmd/nvidia-mig-parted/util/
    # device.go nvmlGetGPUDeviceIDs): this machine has no NVIDIA PCI device, so it finds none
    status, out = mig.mig_parted("export")
    assert status == 0 and "current: []" in out, out
    status, out = mig.mig_parted("assert", "-f", CONFIG_FILE, "-c", layout)
    assert status == 0 and "Selected MIG configuration currently applied" in out, out
    assert mig.errors() == []
