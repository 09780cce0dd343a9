"""Bring-up order (driver -> toolkit -> GPU agents) and the optional driver container.

Upstream facts, NVIDIA/gpu-operator v26.7.0:
- assets/state-device-plugin/0500_daemonset.yaml, gpu-feature-discovery/0500_daemonset.yaml,
  state-dcgm-exporter/0800_daemonset.yaml, state-mps-control-daemon/0400_daemonset.yaml,
  state-mig-manager/0600_daemonset.yaml: an init container `toolkit-validation` runs
  `until [ -f /run/nvidia/validations/toolkit-ready ]; do ...; sleep 5; done` with the host's
  /run/nvidia(/validations) mounted HostToContainer.
- assets/state-container-toolkit/0400_configmap.yaml: the toolkit waits for
  /run/nvidia/validations/driver-ready before it starts.
- assets/state-driver/0500_daemonset.yaml: image nvcr.io/nvidia/driver (deployments/gpu-operator/
  values.yaml driver.version 595.91.07), `nvidia-driver init`, privileged, hostPID, /run/nvidia mounted
  Bidirectional, updateStrategy OnDelete, NVIDIA_VISIBLE_DEVICES=void (never through the NVIDIA
  runtime), a startup probe that writes a ready file under /run/nvidia/validations after nvidia-smi
  works, a preStop that removes it; firmware from /run/nvidia/driver/lib/firmware.
- controllers/object_controls.go DefaultDriverInstallDir = "/run/nvidia/driver"; the device plugin
  mounts it at /driver-root (HostToContainer); k8s-device-plugin v0.20.0 reads NVIDIA_DRIVER_ROOT
  (cmd/nvidia-device-plugin/main.go) and GFD looks for the driver at DRIVER_ROOT_CTR_PATH, default
  /driver-root (cmd/gpu-feature-discovery/main.go).
The scripts below are the chart's own, run here with sh against a temporary directory.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from gpu_stack_dev.chartlib import FULLNAME, find, one, overlays, render, run_helm, template_args

MARKERS = "/run/nvidia/validations"
AGENTS = ["device-plugin", "gpu-feature-discovery", "dcgm-exporter", "mps-control-daemon", "mig-manager"]
MIG_MPS = {"migManager.enabled": True, "sharing.configs.mig": {"migStrategy": "single"}}
DRIVER = {"driver.enabled": True}


def daemonsets(overlay: str = "mps-x10.yaml", values: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    objs = render(3, overlay, {**MIG_MPS, **(values or {})}).objects()
    return {d["metadata"]["name"].removeprefix(f"{FULLNAME}-"): d for d in find(objs, "DaemonSet")}


def pod(ds: dict[str, Any]) -> dict[str, Any]:
    return ds["spec"]["template"]["spec"]


def container(ds: dict[str, Any], name: str) -> dict[str, Any]:
    spec = pod(ds)
    return next(c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == name)


def host_path_of(ds: dict[str, Any], mount: dict[str, Any]) -> str:
    volume = next(v for v in pod(ds)["volumes"] if v["name"] == mount["name"])
    return volume["hostPath"]["path"]


def waits_for(ds: dict[str, Any], name: str) -> list[str]:
    """Markers the init container `name` waits for, checked by running its script (see run_wait)."""
    init = container(ds, name)
    mount = next(m for m in init["volumeMounts"] if m["mountPath"] == MARKERS)
    assert host_path_of(ds, mount) == MARKERS and mount.get("mountPropagation") == "HostToContainer"
    return [m for m in ("driver-ready", "toolkit-ready") if m in init["args"][0]]


def run_script(script: str, tmp: Path, **replace: str) -> subprocess.Popen[str]:
    for old, new in {MARKERS: str(tmp / "validations"), "sleep 5": "sleep 0.1", **replace}.items():
        script = script.replace(old, new)
    return subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_until(check: Any, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"gave up waiting: {what}"
        time.sleep(0.05)


def test_every_gpu_agent_starts_only_after_the_toolkit_marker() -> None:
    sets = daemonsets()
    for agent in AGENTS:
        assert pod(sets[agent])["initContainers"][0]["name"] == "toolkit-validation", agent
        assert waits_for(sets[agent], "toolkit-validation") == ["toolkit-ready"], agent
    assert "initContainers" not in pod(sets["container-toolkit"]), "nothing gates the toolkit without a driver"


def test_with_the_driver_container_the_toolkit_waits_for_it_and_agents_for_both() -> None:
    sets = daemonsets(values=DRIVER)
    assert waits_for(sets["container-toolkit"], "driver-validation") == ["driver-ready"]
    for agent in AGENTS:
        assert waits_for(sets[agent], "toolkit-validation") == ["driver-ready", "toolkit-ready"], agent


@pytest.mark.parametrize("overlay", overlays())
def test_nothing_waits_for_a_marker_no_pod_of_the_chart_writes(overlay: str) -> None:
    objs = render(3, overlay).objects()
    sets = {d["metadata"]["name"].removeprefix(f"{FULLNAME}-"): d for d in find(objs, "DaemonSet")}
    writers = {"driver-ready": "driver" in sets, "toolkit-ready": "container-toolkit" in sets}
    for name, ds in sets.items():
        for init in pod(ds).get("initContainers", []):
            if init["name"] in ("toolkit-validation", "driver-validation"):
                for marker in waits_for(ds, init["name"]):
                    assert writers[marker], f"{name} waits forever for {marker}"
        if name in AGENTS and writers["toolkit-ready"]:
            assert waits_for(ds, "toolkit-validation"), name


def test_the_wait_script_blocks_until_the_marker_exists(tmp_path: Path) -> None:
    init = container(daemonsets(values=DRIVER)["device-plugin"], "toolkit-validation")
    (tmp_path / "validations").mkdir()
    proc = run_script(init["args"][0], tmp_path)
    try:
        (tmp_path / "validations" / "toolkit-ready").touch()
        time.sleep(0.3)
        assert proc.poll() is None, "started before the driver was ready"
        (tmp_path / "validations" / "driver-ready").touch()
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()


def test_the_toolkit_pod_writes_its_marker_while_the_runtime_is_configured(tmp_path: Path) -> None:
    ds = daemonsets()["container-toolkit"]
    sidecar = container(ds, "toolkit-ready")
    install_dir = next(m["mountPath"] for m in sidecar["volumeMounts"] if m["name"] == "toolkit-install-dir")
    config_mount = next(m for m in sidecar["volumeMounts"] if m["name"].startswith("runtime-"))
    main = container(ds, "nvidia-container-toolkit")
    env = {e["name"]: e.get("value") for e in main["env"]}
    # The sidecar reads the file the installer writes (RUNTIME_DROP_IN_CONFIG), through the same mount.
    config = env["RUNTIME_DROP_IN_CONFIG"] or env["RUNTIME_CONFIG"]
    assert config.startswith(config_mount["mountPath"]) and config_mount.get("readOnly")
    runtime = tmp_path / "toolkit" / "nvidia-container-runtime"
    runtime.parent.mkdir()
    (tmp_path / "validations").mkdir()
    (tmp_path / "cfg").mkdir()
    marker = tmp_path / "validations" / "toolkit-ready"
    marker.touch()  # stale marker of a previous pod
    proc = run_script(sidecar["args"][0], tmp_path, **{install_dir: str(tmp_path),
                                                        config_mount["mountPath"]: str(tmp_path / "cfg") + "/"})
    cfg = tmp_path / "cfg" / Path(config).name
    try:
        wait_until(lambda: not marker.exists(), "the stale marker is removed at start")
        runtime.write_text("#!/bin/sh\n")
        runtime.chmod(0o755)
        cfg.write_text('[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]\n'
                       f'BinaryName = "{runtime}"\n')
        wait_until(marker.exists, "the marker once the runtime config names the runtime")
        cfg.write_text("# reverted by the installer on shutdown\n")
        wait_until(lambda: not marker.exists(), "the marker is removed once the config is reverted")
        cfg.write_text(f'BinaryName = "{runtime}"\n')
        wait_until(marker.exists, "the marker again")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert not marker.exists(), "a stopped toolkit pod must not leave its marker behind"
    finally:
        proc.kill()
    probe = sidecar["readinessProbe"]["exec"]["command"]
    assert probe == ["test", "-f", f"{MARKERS}/toolkit-ready"]


def test_driver_is_off_by_default_and_gpu_operators_when_on() -> None:
    assert "driver" not in daemonsets()
    ds = daemonsets(values=DRIVER)["driver"]
    spec = pod(ds)
    ctr = container(ds, "nvidia-driver-ctr")
    assert ctr["image"].startswith("nvcr.io/nvidia/driver:595.91.07-")
    assert ctr["command"] == ["nvidia-driver"] and ctr["args"] == ["init"]
    assert ctr["securityContext"]["privileged"] is True and spec["hostPID"] is True
    assert "runtimeClassName" not in spec
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in ctr["env"]
    assert ds["spec"]["updateStrategy"] == {"type": "OnDelete"}
    run_nvidia = next(m for m in ctr["volumeMounts"] if m["mountPath"] == "/run/nvidia")
    assert run_nvidia["mountPropagation"] == "Bidirectional" and host_path_of(ds, run_nvidia) == "/run/nvidia"
    firmware = next(m for m in ctr["volumeMounts"] if m["mountPath"] == "/lib/firmware")
    assert host_path_of(ds, firmware) == "/run/nvidia/driver/lib/firmware"
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert all({"key": "nvidia.com/gpu.deploy.driver", "operator": "NotIn",
                "values": ["false", "paused-for-mig-change"]} in t["matchExpressions"] for t in terms)


def test_driver_probe_writes_driver_ready_after_nvidia_smi_and_prestop_removes_it(tmp_path: Path) -> None:
    ctr = container(daemonsets(values=DRIVER)["driver"], "nvidia-driver-ctr")
    probe = ctr["startupProbe"]["exec"]["command"]
    assert probe[:2] == ["sh", "-c"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\nexit 9\n")
    smi.chmod(0o755)
    refcnt = tmp_path / "refcnt"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def run(script: str) -> int:
        script = script.replace(MARKERS, str(tmp_path / "validations"))
        script = script.replace("/sys/module/nvidia/refcnt", str(refcnt))
        return subprocess.run(["sh", "-c", script], env=env, check=False, capture_output=True).returncode

    marker = tmp_path / "validations" / "driver-ready"
    assert run(probe[2]) != 0 and not marker.exists(), "no kernel module yet"
    refcnt.write_text("1\n")
    assert run(probe[2]) != 0 and not marker.exists(), "nvidia-smi fails"
    smi.write_text("#!/bin/sh\nexit 0\n")
    assert run(probe[2]) == 0 and marker.read_text() == "NVIDIA_DRIVER_ROOT=/run/nvidia/driver\n"
    assert run(" ".join(ctr["lifecycle"]["preStop"]["exec"]["command"][2:])) == 0 and not marker.exists()


def test_the_driver_root_is_wired_through_toolkit_device_plugin_gfd_and_dcgm() -> None:
    sets = daemonsets(values=DRIVER)
    toolkit = container(sets["container-toolkit"], "nvidia-container-toolkit")
    toolkit_env = {e["name"]: e.get("value") for e in toolkit["env"]}
    assert toolkit_env["NVIDIA_DRIVER_ROOT"] == "/run/nvidia/driver"
    assert toolkit_env["DRIVER_ROOT_CTR_PATH"] == "/host/run/nvidia/driver"
    host_root = next(m for m in container(sets["container-toolkit"], "nvidia-container-toolkit")["volumeMounts"]
                     if m["mountPath"] == "/host")
    assert host_root["mountPropagation"] == "HostToContainer", "the driver root is mounted after the toolkit starts"
    plugin = container(sets["device-plugin"], "nvidia-device-plugin")
    assert {"name": "NVIDIA_DRIVER_ROOT", "value": "/run/nvidia/driver"} in plugin["env"]
    for name, ctr in (("device-plugin", plugin), ("gpu-feature-discovery",
                                                  container(sets["gpu-feature-discovery"], "gpu-feature-discovery"))):
        mount = next(m for m in ctr["volumeMounts"] if m["mountPath"] == "/driver-root")
        assert host_path_of(sets[name], mount) == "/run/nvidia/driver", name
        assert mount["mountPropagation"] == "HostToContainer" and mount["readOnly"], name
    # DCGM (like GFD and the plugin) gets the driver's libraries through the NVIDIA runtime the
    # toolkit points at /run/nvidia/driver, and starts only once the driver is ready.
    assert pod(sets["dcgm-exporter"])["runtimeClassName"] == "nvidia"
    assert waits_for(sets["dcgm-exporter"], "toolkit-validation") == ["driver-ready", "toolkit-ready"]


def test_helm_test_and_notes_show_the_order() -> None:
    objs = render(3, "mps-x10.yaml", {**MIG_MPS, **DRIVER}).objects()
    tester = one(objs, "Pod", f"{FULLNAME}-test-bringup")
    script = tester["spec"]["containers"][0]["args"][0]
    stages = [script.index(f"{FULLNAME}-{name}") for name in ("driver", "container-toolkit", "device-plugin")]
    assert stages == sorted(stages), "the helm test checks the stages out of order"
    assert all(f"{FULLNAME}-{a}" in script for a in AGENTS)
    weights = {p["metadata"]["name"]: int(p["metadata"]["annotations"]["helm.sh/hook-weight"])
               for p in find(objs, "Pod")}
    assert weights[f"{FULLNAME}-test-bringup"] < weights[f"{FULLNAME}-test-cuda"]
    role = one(objs, "Role", f"{FULLNAME}-test-bringup")
    assert role["rules"] == [{"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ["get"]}]
    result = run_helm(4, ["install", "--dry-run=client",
                          *template_args("mps-x10.yaml", {**MIG_MPS, **DRIVER}, api_versions=())[1:]])
    assert result.ok, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    assert f"1. driver: {FULLNAME}-driver -> writes driver-ready" in notes
    assert f"2. container toolkit: {FULLNAME}-container-toolkit -> writes toolkit-ready" in notes
    assert f"3. GPU agents: {FULLNAME}-device-plugin, {FULLNAME}-gpu-feature-discovery" in notes
    assert "-c toolkit-validation" in notes
