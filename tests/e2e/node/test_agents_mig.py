"""Chart-values-examples/mig-single-all-1g.yaml (8 mock A100s, MIG mode off as shipped) and mig-mixed-all-balanced.yaml
(8 mock H100s with MIG mode on) on the node: the chart's MIG manager DaemonSet runs the upstream nvidia-mig-manager
and nvidia-mig-parted v0.15.0 against NVIDIA's mock NVML, reacts to `nvidia.com/mig.config` and sets
`nvidia.com/mig.config.state` as far as the mock allows; the real GFD labels the node's MIG capability and strategy.

Only one chart value differs from the overlays: `migManager.hostGpuClients: []`, which a user whose node runs no
host GPU services (no DCGM under systemd, as here) sets. It makes the manager run mig-parted in its own container
(WITH_SHUTDOWN_HOST_GPU_CLIENTS=false) instead of copying it to the host and running it there through
`chroot /host` (cmd/nvidia-mig-manager/main.go `migReconfigure`, v0.15.0), where it would need the driver's
library on the host's own library path, which the mock driver root does not give.

Two stand-ins, each added only after the test has shown that its absence is what stops the manager:
- a system D-Bus (tests/e2e/node/system_bus.py): the manager connects before every reconfiguration;
- /proc/modules with the `nvidia` line (mock_gpu.stand_in_proc_modules, bound by the node's nvidia handler):
  mig-parted reads it before anything else (cmd/nvidia-mig-parted/util/nvml.go `IsNvidiaModuleLoaded`).
The mock then stops the rest: SetMigMode answers NOT_SUPPORTED and GPU-instance creation is a silent no-op.
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
    mig_enabled: bool
    layout: str
    strategy: str
    product: str


SINGLE = Overlay("mig-single-all-1g.yaml", "a100", False, "all-1g", "single", "NVIDIA-A100-SXM4-40GB")
MIXED = Overlay("mig-mixed-all-balanced.yaml", "h100", True, "all-balanced", "mixed", "NVIDIA-H100-80GB-HBM3")


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

    def outcome(self, mark: str, timeout: float = 420) -> tuple[str | None, list[str]]:
        """The state label once the manager's log shows `mark`, and every state seen on the way."""
        seen: list[str] = []

        def done() -> bool:
            state = node_labels(self.node).get(MIG_STATE)
            if state and (not seen or seen[-1] != state):
                seen.append(state)
            return mark in self.manager_log() and state not in (None, "pending")
        wait_for(done, f"the MIG manager's log to show {mark!r}", timeout=timeout)
        return node_labels(self.node).get(MIG_STATE), seen

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
                                                          mig_enabled=overlay.mig_enabled, **USER_VALUES) as release:
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


def test_the_manager_goes_as_far_as_each_stand_in_lets_it(mig: MigNode) -> None:
    layout = mig.overlay.layout
    mig.select(layout)
    wait_for(lambda: "failed to connect to systemd D-Bus" in mig.manager_log(), "the manager to need D-Bus",
             timeout=180)
    assert MIG_STATE not in node_labels(mig.node)
    print("without D-Bus:", mig.errors())
    with system_bus(mig.bus):
        mig.select(layout)
        state, seen = mig.outcome("unable to read /proc/modules")
        print("without /proc/modules:", state, seen, mig.errors())
        assert state == "failed"
        mock_gpu.stand_in_proc_modules(mig.gpus.gpus.root)
        mig.deselect()  # a new manager acts on the label it finds at once
        mig.restart_manager()
        mig.select(layout)
        mark = "ERROR_NOT_SUPPORTED" if not mig.overlay.mig_enabled else "Successfully updated to MIG config"
        state, seen = mig.outcome(mark)
        print("with both:", state, seen, mig.errors())
        print(mig.manager_log())
        assert state == ("failed" if not mig.overlay.mig_enabled else "success")
    # what the manager's mig-parted finds on the GPUs afterwards: the mock created no MIG device
    pod = next(p for p in mig.gpus.pods("mig-manager") if p["status"].get("phase") == "Running")
    proc = mig.node.kubectl("exec", "-n", pod["metadata"]["namespace"], pod["metadata"]["name"], "-c", "mig-manager",
                            "--", "nvidia-mig-parted", "assert", "-f", "/mig-parted-config/config.yaml", "-c", layout,
                            check=False)
    assert proc.returncode == 1
    assert "Assertion failure: selected configuration not currently applied" in proc.stdout + proc.stderr
