"""Runtime and device wiring of the node agents, checked against the upstream projects.

Upstream facts used here (each cited where it is asserted):
- NVIDIA/gpu-operator v26.7.0 cmd/nvidia-validator/driver.go getDriverInfo: for a driver installed on
  the host, the driver-ready file carries NVIDIA_DRIVER_ROOT=<hostRoot>, DRIVER_ROOT_CTR_PATH=/host,
  NVIDIA_DEV_ROOT=<hostRoot>, DEV_ROOT_CTR_PATH=/host; assets/state-container-toolkit/0400_configmap.yaml
  sources that file into the toolkit container's environment.
- NVIDIA/nvidia-container-toolkit v1.20.0 cmd/nvidia-ctk-installer/toolkit/toolkit.go: the installer
  reads --dev-root from NVIDIA_DEV_ROOT (or DEV_ROOT) and --dev-root-ctr-path from DEV_ROOT_CTR_PATH.
- NVIDIA/gpu-operator v26.7.0 cmd/nvidia-validator/main.go createDevCharSymlinks: driver validation
  creates /dev/char links with createAll, createDeviceNodes, loadKernelModules (host driver whose
  module is not loaded yet), driver root /host, dev char path /host-dev-char = hostPath /dev/char
  (assets/state-container-toolkit/0500_daemonset.yaml volume host-dev-char); DISABLE_DEV_CHAR_SYMLINK_CREATION
  turns it off (e.g. WSL2).
- NVIDIA/nvidia-container-toolkit v1.20.0 cmd/nvidia-ctk/system/create-dev-char-symlinks/
  create-dev-char-symlinks.go: the same creator as `nvidia-ctk system create-dev-char-symlinks` with
  flags --create-all, --create-device-nodes, --load-kernel-modules, --driver-root, --dev-char-path;
  cmd/nvidia-ctk-installer/toolkit/installer/executables.go installs nvidia-ctk to <installDir>/toolkit.
- NVIDIA/k8s-device-plugin v0.20.0 cmd/config-manager/main.go findPidToSignal: the config-manager
  signals the process whose cmdline[0] equals PROCESS_TO_SIGNAL;
  deployments/helm/nvidia-device-plugin/templates/daemonset-mps-control-daemon.yml sets
  PROCESS_TO_SIGNAL=/usr/bin/mps-control-daemon; deployments/container/Dockerfile installs the binary
  at /usr/bin/mps-control-daemon.
- kubernetes-sigs/node-feature-discovery v0.19.0 deployment/components/common/worker-mounts.yaml: the
  worker's host mounts (below); no source.d.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from gpu_stack_dev.chartlib import HELM_MAJORS, overlays, render

TOOLKIT = "t-gpu-stack-container-toolkit"


def objs(overlay: str = "default", **set_json: Any) -> list[dict[str, Any]]:
    return render(4, overlay, set_json).objects()


def daemonset(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    [ds] = [o for o in objects if o["kind"] == "DaemonSet" and o["metadata"]["name"] == name]
    return ds


def container(ds: dict[str, Any], name: str) -> dict[str, Any]:
    [c] = [c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return c


def env(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in c.get("env", [])}


def host_path_of(ds: dict[str, Any], c: dict[str, Any], mount_path: str) -> str:
    [m] = [m for m in c["volumeMounts"] if m["mountPath"].rstrip("/") == mount_path.rstrip("/")]
    [v] = [v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"] == m["name"]]
    return str(v["hostPath"]["path"])


@pytest.mark.parametrize(("driver_root", "ctr_path"),
                         [("/", "/host"), ("/run/nvidia/driver", "/host/run/nvidia/driver")])
def test_toolkit_dev_root_is_the_driver_root(driver_root: str, ctr_path: str) -> None:
    ds = daemonset(objs(**{"gpuNodes.driverRoot": driver_root}), TOOLKIT)
    e = env(container(ds, "nvidia-container-toolkit"))
    assert (e["NVIDIA_DRIVER_ROOT"], e["DRIVER_ROOT_CTR_PATH"]) == (driver_root, ctr_path)
    assert (e["NVIDIA_DEV_ROOT"], e["DEV_ROOT_CTR_PATH"]) == (driver_root, ctr_path)
    # The container path really is the host path under the host root mount.
    assert host_path_of(ds, container(ds, "nvidia-container-toolkit"), "/host") == "/"


def dev_char_args(ds: dict[str, Any]) -> list[str]:
    script = container(ds, "dev-char-symlinks")["args"][0]
    [line] = [ln for ln in script.splitlines() if "create-dev-char-symlinks" in ln]
    call = line.split("&&", 1)[1].split(";", 1)[0].split()
    return call


def test_dev_char_symlinks_as_gpu_operator_driver_validation() -> None:
    ds = daemonset(objs(), TOOLKIT)
    c = container(ds, "dev-char-symlinks")
    call = dev_char_args(ds)
    assert call[0] == "/usr/local/nvidia/toolkit/nvidia-ctk"
    assert call[1:3] == ["system", "create-dev-char-symlinks"]
    flags = dict(a.split("=", 1) if "=" in a else (a, "") for a in call[3:])
    assert flags == {"--create-all": "", "--create-device-nodes": "", "--load-kernel-modules": "",
                     "--driver-root": "/host", "--dev-char-path": "/host-dev-char"}
    assert host_path_of(ds, c, "/host-dev-char") == "/dev/char"
    assert host_path_of(ds, c, "/host") == "/"
    # nvidia-ctk comes from the toolkit's install dir on the host, mounted where the installer put it.
    assert host_path_of(ds, c, "/usr/local/nvidia") == "/usr/local/nvidia"
    assert c["securityContext"]["privileged"] is True
    assert c["image"] == container(ds, "nvidia-container-toolkit")["image"]


def test_dev_char_symlinks_follow_install_dir_and_driver_root() -> None:
    ds = daemonset(objs(**{"toolkit.installDir": "/opt/nvidia", "gpuNodes.driverRoot": "/run/nvidia/driver"}), TOOLKIT)
    call = dev_char_args(ds)
    assert call[0] == "/opt/nvidia/toolkit/nvidia-ctk"
    assert "--driver-root=/host/run/nvidia/driver" in call
    # Upstream loads kernel modules only for a driver installed on the host.
    assert "--load-kernel-modules" not in call


def test_dev_char_symlinks_can_be_turned_off() -> None:
    ds = daemonset(objs(**{"toolkit.createDevCharSymlinks": False}), TOOLKIT)
    spec = ds["spec"]["template"]["spec"]
    assert "dev-char-symlinks" not in [c["name"] for c in spec["containers"]]
    assert "host-dev-char" not in {v["name"] for v in spec["volumes"]}


@pytest.mark.parametrize("overlay", overlays())
def test_config_manager_signals_a_process_of_its_pod(overlay: str) -> None:
    """PROCESS_TO_SIGNAL must equal argv[0] of a container the sidecar can see (shared PID namespace)."""
    checked = 0
    for o in objs(overlay):
        if o["kind"] != "DaemonSet":
            continue
        spec = o["spec"]["template"]["spec"]
        for c in spec["containers"]:
            e = env(c)
            if c.get("command") != ["config-manager"] or e.get("SEND_SIGNAL") != "true":
                continue
            argv0 = {x["command"][0] for x in spec["containers"] if x is not c and x.get("command")}
            assert e["PROCESS_TO_SIGNAL"] in argv0, (o["metadata"]["name"], e["PROCESS_TO_SIGNAL"], argv0)
            assert spec.get("shareProcessNamespace") or spec.get("hostPID"), o["metadata"]["name"]
            checked += 1
    if overlay.startswith("policy-only-"):  # another project's agents run the GPU nodes
        assert not [o for o in objs(overlay) if o["kind"] == "DaemonSet"], f"{overlay} installs node agents"
        return
    assert checked >= 2


def test_mps_daemon_is_signalled_by_its_real_path() -> None:
    ds = daemonset(objs("mps-x10.yaml"), "t-gpu-stack-mps-control-daemon")
    assert env(container(ds, "config-manager"))["PROCESS_TO_SIGNAL"] == "/usr/bin/mps-control-daemon"
    assert container(ds, "mps-control-daemon")["command"] == ["/usr/bin/mps-control-daemon"]


# kubernetes-sigs/node-feature-discovery v0.19.0 deployment/components/common/worker-mounts.yaml
NFD_WORKER_MOUNTS = {
    ("host-boot", "/host-boot", "/boot"),
    ("host-os-release", "/host-etc/os-release", "/etc/os-release"),
    ("host-sys", "/host-sys", "/sys"),
    ("host-proc-swaps", "/host-proc/swaps", "/proc/swaps"),
    ("host-usr-lib", "/host-usr/lib", "/usr/lib"),
    ("host-lib", "/host-lib", "/lib"),
    ("features-d", "/etc/kubernetes/node-feature-discovery/features.d",
     "/etc/kubernetes/node-feature-discovery/features.d"),
}


def test_nfd_worker_host_mounts_are_upstreams() -> None:
    ds = daemonset(objs(), "t-gpu-stack-nfd-worker")
    spec = ds["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {(m["name"], m["mountPath"].rstrip("/"), volumes[m["name"]]["hostPath"]["path"].rstrip("/"))
              for m in container(ds, "nfd-worker")["volumeMounts"] if "hostPath" in volumes[m["name"]]}
    assert mounts == NFD_WORKER_MOUNTS
    assert all(m.get("readOnly") for m in container(ds, "nfd-worker")["volumeMounts"])


@pytest.mark.parametrize("helm", HELM_MAJORS)
def test_priority_quota_admits_critical_pods_before_they_are_created(helm: int) -> None:
    r = render(helm, set_json={"gpuNodes.priorityQuota.create": True})
    objects = r.objects()
    [quota] = [o for o in objects if o["kind"] == "ResourceQuota"]
    assert quota["metadata"]["namespace"] == "gpu-stack"
    assert quota["spec"]["hard"] == {"pods": "1000"}
    assert quota["spec"]["scopeSelector"]["matchExpressions"] == [{
        "scopeName": "PriorityClass", "operator": "In", "values": ["system-node-critical", "system-cluster-critical"]}]
    # Every critical pod of the chart falls under the quota's scope.
    classes = {o["spec"]["template"]["spec"].get("priorityClassName") for o in objects
               if o["kind"] in ("DaemonSet", "Deployment")} - {None}
    assert classes <= set(quota["spec"]["scopeSelector"]["matchExpressions"][0]["values"])
    # Helm applies objects in its install order, the order `helm template` prints them in.
    kinds = [o["kind"] for o in objects]
    assert kinds.index("ResourceQuota") < min(kinds.index(k) for k in ("DaemonSet", "Deployment"))


def test_priority_quota_is_off_by_default_and_never_in_kube_system() -> None:
    assert not [o for o in objs() if o["kind"] == "ResourceQuota"]
    in_kube_system = render(4, set_json={"gpuNodes.priorityQuota.create": True}, namespace="kube-system").objects()
    assert not [o for o in in_kube_system if o["kind"] == "ResourceQuota"]


# Every environment variable nvidia-ctk-installer reads, grouped by the flag it sets (one flag, its
# aliases in the order the installer looks them up): NVIDIA/nvidia-container-toolkit v1.20.0
# cmd/nvidia-ctk-installer/{main.go,toolkit/toolkit.go,container/runtime/runtime.go,
# container/runtime/containerd/containerd.go,container/runtime/crio/crio.go} (cli.EnvVars sources).
INSTALLER_FLAGS: list[tuple[str, ...]] = [
    ("RUNTIME",), ("RUNTIME_CONFIG", "CONTAINERD_CONFIG", "DOCKER_CONFIG"), ("RUNTIME_DROP_IN_CONFIG",),
    ("RUNTIME_DROP_IN_CONFIG_HOST_PATH",), ("RUNTIME_EXECUTABLE_PATH",),
    ("RUNTIME_SOCKET", "CONTAINERD_SOCKET", "DOCKER_SOCKET"), ("RUNTIME_RESTART_MODE",), ("RUNTIME_ENABLE_CDI",),
    ("HOST_ROOT_MOUNT",), ("NVIDIA_RUNTIME_NAME", "CONTAINERD_RUNTIME_CLASS", "DOCKER_RUNTIME_NAME"),
    ("NVIDIA_RUNTIME_SET_AS_DEFAULT", "CONTAINERD_SET_AS_DEFAULT", "DOCKER_SET_AS_DEFAULT"),
    ("RUNTIME_CONFIG_SOURCES", "RUNTIME_CONFIG_SOURCE"),
    ("RUNTIME_CONFIG_OVERRIDE", "CONTAINERD_RUNTIME_CONFIG_OVERRIDE"),
    ("CONTAINERD_RUNTIME_TYPE",), ("CONTAINERD_USE_LEGACY_CONFIG",), ("CRIO_CONFIG_MODE",), ("CRIO_HOOKS_DIR",),
    ("CRIO_HOOK_FILENAME",), ("ENABLE_NRI_PLUGIN",), ("NRI_NAMESPACE",), ("NRI_PLUGIN_INDEX",), ("NRI_SOCKET",),
    ("NRI_MANAGEMENT_CDI_DEVICE_NAMESPACES",), ("NO_DAEMON",), ("NO_RUNTIME_CONFIG",), ("TOOLKIT_DEBUG",),
    ("TOOLKIT_INSTALL_DIR", "ROOT"), ("TOOLKIT_PACKAGE_TYPE",), ("TOOLKIT_PID_FILE", "PID_FILE"),
    ("TOOLKIT_SOURCE_ROOT",), ("NVIDIA_DRIVER_ROOT", "DRIVER_ROOT"), ("DRIVER_ROOT_CTR_PATH",),
    ("NVIDIA_DEV_ROOT", "DEV_ROOT"), ("DEV_ROOT_CTR_PATH",), ("CREATE_DEVICE_NODES",),
    ("ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED",), ("ACCEPT_NVIDIA_VISIBLE_DEVICES_AS_VOLUME_MOUNTS",),
    ("CDI_ENABLED", "ENABLE_CDI"), ("CDI_OUTPUT_DIR",), ("CDI_KIND",), ("NVIDIA_CONTAINER_TOOLKIT_OPT_IN_FEATURES",),
    ("NVIDIA_CONTAINER_CLI_DEBUG",), ("NVIDIA_CONTAINER_RUNTIME_DEBUG",), ("NVIDIA_CONTAINER_RUNTIME_LOG_LEVEL",),
    ("NVIDIA_CONTAINER_RUNTIME_MODE",), ("NVIDIA_CONTAINER_RUNTIME_MODES_CDI_ANNOTATION_PREFIXES",),
    ("NVIDIA_CONTAINER_RUNTIME_MODES_CDI_DEFAULT_KIND",), ("NVIDIA_CONTAINER_RUNTIME_RUNTIMES",),
    ("NVIDIA_CONTAINER_RUNTIME_HOOK_SKIP_MODE_DETECTION",),
]
FLAG_OF = {name: flag for flag in INSTALLER_FLAGS for name in flag}
# Read by the NVIDIA runtime for the installer's own container, not by the installer.
RUNTIME_ENV = {"NVIDIA_VISIBLE_DEVICES"}


def toolkits(overlay: str) -> list[dict[str, Any]]:
    return [o for o in objs(overlay) if o["kind"] == "DaemonSet" and o["metadata"]["name"] == TOOLKIT]


# Overlays that deploy the toolkit (preinstalled-driver-toolkit.yaml uses the node's own).
@pytest.mark.parametrize("overlay", [o for o in overlays() if toolkits(o)])
def test_toolkit_env_is_what_the_installer_reads_without_aliases(overlay: str) -> None:
    names = list(env(container(toolkits(overlay)[0], "nvidia-container-toolkit")))
    assert [n for n in names if n not in FLAG_OF and n not in RUNTIME_ENV] == []
    flags = [FLAG_OF[n] for n in names if n in FLAG_OF]
    assert len(flags) == len(set(flags)), f"two variables set one installer flag: {names}"
    # No runtime-specific legacy alias (CONTAINERD_CONFIG, CONTAINERD_SOCKET, ...): the generic name the
    # installer reads first does the job for every runtime preset.
    legacy = [n for n in names if n in FLAG_OF and FLAG_OF[n][0] != n and n.startswith(("CONTAINERD_", "DOCKER_"))]
    assert legacy == []


def test_dev_char_symlinks_script_runs_the_creator_then_idles_until_terminated(tmp_path: Path) -> None:
    """The rendered script under sh, with a stand-in nvidia-ctk: called once with the flags, then the
    container idles and exits 0 on SIGTERM (pod deletion)."""
    script = container(daemonset(objs(), TOOLKIT), "dev-char-symlinks")["args"][0]
    calls = tmp_path / "calls"
    fake = tmp_path / "nvidia-ctk"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    fake.chmod(0o755)
    proc = subprocess.Popen(["sh", "-c", script.replace("/usr/local/nvidia/toolkit/nvidia-ctk", str(fake))])
    try:
        for _ in range(600):
            if calls.exists() and proc.poll() is None:
                break
            time.sleep(0.05)
        assert calls.read_text().split()[:2] == ["system", "create-dev-char-symlinks"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert len(calls.read_text().splitlines()) == 1


def test_a_containerd_config_of_its_own_seeds_the_drop_in_from_that_file() -> None:
    """The installer's default config sources ask `containerd config dump` first, which reads
    /etc/containerd/config.toml (nvidia-container-toolkit v1.20.0 pkg/config/engine/containerd/containerd.go
    CommandLineSource); its drop-in copies the source's CRI section, which replaces the node's own on containerd
    before 2.1. So a node whose containerd runs on another file has the drop-in seeded from that file."""
    def source(**values: Any) -> str | None:
        ds = daemonset(objs(**values), TOOLKIT)
        return env(container(ds, "nvidia-container-toolkit")).get("RUNTIME_CONFIG_SOURCE")
    assert source() is None  # the preset's own /etc/containerd/config.toml: the installer's defaults hold
    assert source(**{"toolkit.runtimeConfig": "/etc/containerd/custom.toml"}) == "file=/host/etc/containerd/custom.toml"
    # k3s/rke2 write the template, seeded from the agent's generated config whatever the template path
    assert source(**{"toolkit.runtime": "k3s", "toolkit.runtimeConfig": "/srv/k3s/config.toml.tmpl"}) == (
        "file=/host/var/lib/rancher/k3s/agent/etc/containerd/config.toml")
