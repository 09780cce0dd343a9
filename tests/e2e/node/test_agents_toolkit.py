"""The chart's NVIDIA container toolkit DaemonSet (toolkit.enabled, the chart default) on the real node, running
the upstream nvidia-ctk-installer v1.20.0: it installs the toolkit and writes the containerd runtime config that the
chart's RuntimeClass names into the node's containerd config (docs/real-node.md, "The container toolkit", cites the
upstream code).

Values a user of this node sets (its containerd runs with a config of its own, not /etc/containerd):
toolkit.runtimeConfig / runtimeDropInConfig / runtimeSocket (the node's config, a drop-in beside it, its socket),
toolkit.installDir (under the node's directory, not the machine's /usr/local), toolkit.createDevCharSymlinks=false,
and in toolkit.extraEnv NVIDIA_CONTAINER_RUNTIME_RUNTIMES and RUNTIME_RESTART_MODE=none. With
toolkit.runtimeConfig set the chart seeds the drop-in from that file (the installer's default source also asks
`containerd config dump`, which reads /etc/containerd/config.toml).

What stands in, and why (docs/real-node.md says the same; tests/e2e/node/agents.py lists the others):
- five files the installer requires that are not built here (hack/image/nvidia-agent-images.sh):
  libnvidia-container.so.1, libnvidia-container-go.so.1 and nvidia-container-cli (NVIDIA/libnvidia-container),
  nvidia-container-runtime.cdi and .legacy (toolkit commands ../shared/gpu-node did not build). The installer only
  copies them, and each is the only thing it stops for (test_the_installer_stops_only_for_the_files_not_built_here).
- the nvidia kernel module, which this machine lacks: the runtime wrapper the installer writes runs
  nvidia-container-runtime only when /proc/modules lists `nvidia`, else it execs the first low-level runtime,
  NVIDIA_CONTAINER_RUNTIME_RUNTIMES, here the node's hack/node/nvidia-runtime-standin (the NVIDIA runtime's
  injection of the mock driver). Not reached: containerd hands the pod to the installed runtime, and under gVisor
  that exec fails (docs/real-node.md says why); the tests stop at the handing over.
- the installer's SIGHUP to containerd: from a gVisor sandbox the socket's peer credentials do not name containerd
  and the signal does not reach it (docs/real-node.md), so the release sets RUNTIME_RESTART_MODE=none and the test
  sends containerd the SIGHUP, then starts it again as systemd's Restart=always does.
- create-dev-char-symlinks needs /proc/devices with the driver's nvidia entries; a gVisor sandbox has no
  /proc/devices and nvidia-ctk panics (nil device table), hence toolkit.createDevCharSymlinks=false.
- / made a shared mount in this run's mount namespace (shared_host_root), as a GPU node's systemd makes it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tarfile
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from gpu_stack_dev.chartlib import find, render
from gpu_stack_dev.e2e import agent_images, mock_gpu
from gpu_stack_dev.e2e.e2elib import E2ECluster, unique
from gpu_stack_dev.e2e.node_install import IMAGE_ARCHIVE
from gpu_stack_dev.paths import ROOT

from tests.require import skip_or_fail

from .agents import GpuRelease, gpu_release
from .standin import apply_pod, scratch_namespace, wait_for

OVERLAY = "exclusive.yaml"
CRI = "io.containerd.grpc.v1.cri"
STANDIN = ROOT / "hack" / "node" / "nvidia-runtime-standin"


def toolkit_values(real_node: Any, restart_mode: str | None = "none") -> dict[str, object]:
    env = {"NVIDIA_CONTAINER_RUNTIME_RUNTIMES": str(STANDIN)}
    if restart_mode:
        env["RUNTIME_RESTART_MODE"] = restart_mode
    return {"toolkit.enabled": True,
            "toolkit.runtimeConfig": str(real_node.dir / "containerd.toml"),
            "toolkit.runtimeDropInConfig": str(real_node.dir / "conf.d" / "99-nvidia.toml"),
            "toolkit.runtimeSocket": str(real_node.socket),
            "toolkit.installDir": str(real_node.dir / "nvidia"),
            # nvidia-ctk's create-dev-char-symlinks needs the nvidia entries of /proc/devices (see the module doc)
            "toolkit.createDevCharSymlinks": False,
            "toolkit.extraEnv": [{"name": k, "value": v} for k, v in env.items()]}


def root_propagation() -> str:
    """The propagation of this mount namespace's / ("shared:N", "master:N" or "private")."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == "/":
            return next((f for f in fields[6:fields.index("-")] if f.startswith(("shared:", "master:"))), "private")
    return "private"


@contextmanager
def shared_host_root() -> Iterator[None]:
    """The toolkit mounts the host's / with HostToContainer propagation, which containerd refuses unless / is a
    shared or slave mount (`path "/" is mounted on "/" but it is not a shared or slave mount`), as a GPU node's
    systemd makes it. This run's mount namespace is private: / is made shared in it, and private again after."""
    before = root_propagation()
    if before == "private":
        subprocess.run(["mount", "--make-shared", "/"], check=True)
    try:
        yield
    finally:
        if before == "private":
            subprocess.run(["mount", "--make-private", "/"], check=True)


@pytest.fixture(scope="module")
def toolkit(cluster: E2ECluster, real_node: Any) -> Iterator[GpuRelease]:
    agent_images.load(real_node)
    # unpacked now, without the kubelet's 2-minute deadline on CreateContainer (a loaded machine misses it)
    real_node.ctr("images", "import", "--snapshotter", "native", str(IMAGE_ARCHIVE))
    config = real_node.dir / "containerd.toml"
    original = config.read_text()
    try:
        with shared_host_root(), gpu_release(cluster, real_node, OVERLAY, "t4", chart_toolkit=True,
                                             **toolkit_values(real_node)) as release:
            yield release
    finally:
        # the node's own containerd config and `nvidia` handler back for the tests after this module
        config.write_text(original)
        shutil.rmtree(real_node.dir / "conf.d", ignore_errors=True)
        real_node.restart_containerd()


def runtime_class_handler(real_node: Any) -> tuple[str, str]:
    """(name, handler) of the RuntimeClass the chart renders with these values."""
    values = {**mock_gpu.values(real_node.mock_driver_root), **toolkit_values(real_node), "toolkit.enabled": True}
    (runtime_class,) = find(render(overlay=OVERLAY, set_json=values).objects(), "RuntimeClass")
    return runtime_class["metadata"]["name"], runtime_class["handler"]


def runtimes(config: Path) -> dict[str, Any]:
    found: dict[str, Any] = tomllib.loads(config.read_text())["plugins"][CRI]["containerd"]["runtimes"]
    return found


def installed_runtime(real_node: Any) -> Path:
    return Path(real_node.dir) / "nvidia" / "toolkit" / "nvidia-container-runtime"


def test_the_toolkit_pod_is_ready_without_restarts_or_error_lines(toolkit: GpuRelease) -> None:
    (pod,) = toolkit.pods("container-toolkit")
    assert {c["type"]: c["status"] for c in pod["status"]["conditions"]}["Ready"] == "True"
    assert all(s["restartCount"] == 0 for s in pod["status"]["containerStatuses"])
    assert toolkit.error_lines("container-toolkit") == {}


def test_the_node_containerd_config_gains_the_handler_of_the_chart_runtime_class(toolkit: GpuRelease,
                                                                                  real_node: Any) -> None:
    name, handler = runtime_class_handler(real_node)
    assert toolkit.cluster.get_json("runtimeclass", name)["handler"] == handler
    drop_in = runtimes(real_node.dir / "conf.d" / "99-nvidia.toml")
    assert drop_in[handler]["runtime_type"] == "io.containerd.runc.v2"
    assert drop_in[handler]["options"]["BinaryName"] == str(installed_runtime(real_node))
    top_level = tomllib.loads((real_node.dir / "containerd.toml").read_text())
    assert top_level["imports"] == [f"{real_node.dir}/conf.d/*.toml"]
    # the drop-in carries the node's whole CRI section (containerd 1.6 replaces a plugin's table per file)
    drop_in_cri = tomllib.loads((real_node.dir / "conf.d" / "99-nvidia.toml").read_text())["plugins"][CRI]
    assert drop_in_cri["containerd"]["default_runtime_name"] == "runsc"
    assert drop_in_cri["cni"] == top_level["plugins"][CRI]["cni"]


def test_the_installed_runtime_runs_the_nvidia_runtime_only_with_the_kernel_module(toolkit: GpuRelease,
                                                                                   real_node: Any) -> None:
    wrapper = installed_runtime(real_node).read_text()
    assert 'cat /proc/modules | grep -e "^nvidia "' in wrapper
    assert f'exec {STANDIN} "$@"' in wrapper
    assert f"{installed_runtime(real_node)}.real" in wrapper


def sandbox_failure(real_node: Any, namespace: str, pod: str) -> str | None:
    events = json.loads(real_node.kubectl("get", "events", "-n", namespace, "-o", "json").stdout)["items"]
    return next((str(e["message"]) for e in events
                 if e["involvedObject"]["name"] == pod and e["reason"] == "FailedCreatePodSandBox"), None)


def test_containerd_exits_on_the_installers_sighup_and_hands_the_runtime_class_to_the_installed_runtime(
        toolkit: GpuRelease, real_node: Any) -> None:
    """After the restart containerd runs a pod of the chart's RuntimeClass with the runtime the installer installed
    and named in its drop-in: the sandbox's creation executes that file. Whether the exec then succeeds is the
    sandbox's matter (under gVisor it does not: docs/real-node.md, "The container toolkit"), not asserted here."""
    # what the installer's signal restart does on a GPU node (see the module doc for why it cannot here)
    assert real_node.restart_containerd(signal.SIGHUP) == -signal.SIGHUP
    name, _ = runtime_class_handler(real_node)
    with scratch_namespace(real_node, unique("toolkit")) as namespace:
        apply_pod(real_node, namespace, "on-nvidia", gpus=None, extra={"runtimeClassName": name})
        started = f"fork/exec {installed_runtime(real_node)}"

        def handed_over() -> str | None:
            failure = sandbox_failure(real_node, namespace, "on-nvidia")
            if failure is not None and started in failure:
                return failure
            phase = real_node.kubectl("get", "pod", "-n", namespace, "on-nvidia", "-o",
                                      "jsonpath={.status.phase}", check=False).stdout
            return "Running" if phase == "Running" else None
        wait_for(handed_over, "the pod's sandbox handed to the installed runtime", timeout=180)


# --- the installer itself, outside the node: each stand-in is the only thing it stops for -------------------------
STANDINS = {"usr/lib/x86_64-linux-gnu/libnvidia-container.so.1": "error locating library: libnvidia-container.so.1",
            "usr/lib/x86_64-linux-gnu/libnvidia-container-go.so.1":
                "error locating library: libnvidia-container-go.so.1",
            "usr/bin/nvidia-container-cli": "error locating executable: nvidia-container-cli",
            "usr/bin/nvidia-container-runtime.cdi": "error locating executable: nvidia-container-runtime.cdi",
            "usr/bin/nvidia-container-runtime.legacy": "error locating executable: nvidia-container-runtime.legacy"}


def image_files(archive: Path, into: Path) -> Path:
    """The toolkit image's /work and /artifacts, unpacked from its docker-archive under `into`."""
    with tarfile.open(archive) as image:
        manifest = json.load(image.extractfile("manifest.json"))  # type: ignore[arg-type]
        for layer in manifest[0]["Layers"]:
            with tarfile.open(fileobj=image.extractfile(layer)) as files:
                wanted = [m for m in files.getmembers() if m.name.split("/")[0] in ("work", "artifacts")]
                files.extractall(into, members=wanted, filter="tar")
    return into


def install(files: Path, source: Path, into: Path) -> subprocess.CompletedProcess[str]:
    """nvidia-ctk-installer's toolkit install from `source` into `into`, without configuring a runtime."""
    env = {"PATH": "/usr/bin:/bin", "NO_RUNTIME_CONFIG": "true", "NO_DAEMON": "true",
           "TOOLKIT_SOURCE_ROOT": str(source), "TOOLKIT_INSTALL_DIR": str(into),
           "TOOLKIT_PID_FILE": str(into / "toolkit.pid"), "CDI_ENABLED": "false"}
    return subprocess.run([str(files / "work" / "nvidia-ctk-installer")], env=env, capture_output=True, text=True,
                          timeout=60, check=False)


@pytest.fixture(scope="module")
def toolkit_image_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    archive = agent_images.archives()["toolkit"]
    if not archive.is_file():
        skip_or_fail(f"{archive} is missing: `make e2e-image` builds it")
    return image_files(archive, tmp_path_factory.mktemp("toolkit-image"))


def test_the_installer_installs_from_the_image_with_the_stand_ins(toolkit_image_files: Path, tmp_path: Path) -> None:
    proc = install(toolkit_image_files, toolkit_image_files / "artifacts" / "deb", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert os.access(tmp_path / "toolkit" / "nvidia-container-runtime", os.X_OK)


@pytest.mark.parametrize("standin", sorted(STANDINS))
def test_the_installer_stops_only_for_the_files_not_built_here(toolkit_image_files: Path, tmp_path: Path,
                                                               standin: str) -> None:
    source = tmp_path / "source"
    shutil.copytree(toolkit_image_files / "artifacts" / "deb", source, symlinks=True)
    (source / standin).unlink()
    proc = install(toolkit_image_files, source, tmp_path / "install")
    assert proc.returncode == 1
    (error,) = [line for line in proc.stderr.splitlines() if "level=error" in line]
    assert f"{STANDINS[standin]}: not found" in error
