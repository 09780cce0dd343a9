"""A mock GPU node's driver root, laid out as the chart's agents expect a preinstalled driver, from
../shared/gpu-node (NVIDIA's mock libnvidia-ml from k8s-test-infra and its GPU profiles; unpacked with its
unpack.sh). The layout is the one k8s-test-infra's nvml-mock DaemonSet builds on a node:

    <root>/usr/lib64/libnvidia-ml.so.550.163.01 (+ .so.1, .so)   the mock NVML
    <root>/config/config.yaml                                    the GPU profile (the mock reads it)
    <root>/usr/bin/nvidia-smi                                     a stand-in script (the real one is proprietary)
    <root>/usr/bin/nvidia-cuda-mps-control                        a stand-in script (proprietary too)
    <root>/dev/nvidia0..N-1, nvidiactl, nvidia-uvm(-tools)        device nodes (major 195 / 510), never opened
    <root>/proc/driver/nvidia/version
    <root>/config/overrides.yaml                                 failures injected into devices (inject_failure)

The node's `nvidia` runtime handler (hack/node/nvidia-runtime-standin) injects the library, nvidia-smi and the
profile into containers given GPUs, as the mock's CDI spec makes the NVIDIA runtime do. Chart values point the
agents at the rest, as a user of such a node would set them (`values(root)`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gpu_stack_dev.paths import ROOT

LIB_VERSION = "550.163.01"
UNPACKED = ROOT / ".tools" / "gpu-node"
# profile name -> file in gpu-node/profiles
PROFILES = {"t4": "mock-nvml-config-t4.yaml", "a100": "mock-nvml-config-a100.yaml",
            "h100": "mock-nvml-config-h100.yaml", "l40s": "mock-nvml-config-l40s.yaml"}
NVIDIA_SMI = r"""#!/bin/sh
# nvidia-smi stand-in (the real one is proprietary): answers the calls the agents and the chart's probes make
# from the mock's profile. `-L` lists the GPUs; other calls print the driver version and succeed.
config="${MOCK_NVML_CONFIG:-$(dirname "$0")/../../config/config.yaml}"
name=$(sed -n 's/^ *name: *"\(.*\)"/\1/p' "$config" | head -n 1)
case " $* " in
  *" -L "*) i=0; for uuid in $(sed -n 's/^ *uuid: *"\(GPU-.*\)"/\1/p' "$config"); do
      echo "GPU $i: $name (UUID: $uuid)"; i=$((i + 1)); done ;;
  *) echo "NVIDIA-SMI %(version)s   Driver Version: %(version)s   CUDA Version: 12.4" ;;
esac
"""

# nvidia-cuda-mps-control stand-in: `-d` starts a "daemon" for $CUDA_MPS_PIPE_DIRECTORY (a marker file there,
# its control.log in $CUDA_MPS_LOG_DIRECTORY); a command on stdin is answered while the marker is there, as the
# real client answers while its daemon listens on the pipe directory; `quit` stops it (removes the marker).
NVIDIA_CUDA_MPS_CONTROL = r"""#!/bin/sh
daemon="${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}/control-daemon.standin"
if [ "$1" = "-d" ]; then
  mkdir -p "$(dirname "$daemon")" && : > "$daemon" || exit 1
  [ -n "$CUDA_MPS_LOG_DIRECTORY" ] && echo "[standin] control daemon started" >> "$CUDA_MPS_LOG_DIRECTORY/control.log"
  exit 0
fi
read -r command args
if [ ! -e "$daemon" ]; then echo "Cannot find MPS control daemon process" >&2; exit 1; fi
case "$command" in
  quit) rm -f "$daemon" ;;
  get_default_active_thread_percentage) echo "100.0" ;;
esac
exit 0
"""


def source() -> Path:
    """../shared/gpu-node beside the checkout (or beside the worktrees' parent), or $GPU_STACK_GPU_NODE_SRC."""
    for candidate in (os.environ.get("GPU_STACK_GPU_NODE_SRC"), ROOT.parent / "shared" / "gpu-node",
                      ROOT.parent.parent / "shared" / "gpu-node"):
        if candidate and (Path(candidate) / "unpack.sh").is_file():
            return Path(candidate)
    raise FileNotFoundError("no ../shared/gpu-node with unpack.sh (NVIDIA's mock NVML and the agents' binaries)")


def unpacked() -> Path:
    """The unpacked gpu-node folder (unpack.sh runs once)."""
    if not (UNPACKED / f"libnvidia-ml.so.{LIB_VERSION}").is_file():
        UNPACKED.mkdir(parents=True, exist_ok=True)
        subprocess.run([str(source() / "unpack.sh"), str(UNPACKED)], check=True, capture_output=True)
    return UNPACKED


@dataclass(frozen=True)
class MockGpus:
    root: Path
    profile: str
    product: str          # the profile's device name, e.g. "NVIDIA T4"
    uuids: tuple[str, ...]
    memory_mib: int

    @property
    def count(self) -> int:
        return len(self.uuids)


def read_profile(path: Path) -> tuple[str, tuple[str, ...], int]:
    text = path.read_text()
    name = re.search(r'^\s*name:\s*"([^"]+)"', text, re.M)
    memory = re.search(r"^\s*total_bytes:\s*(\d+)", text, re.M)
    uuids = tuple(re.findall(r'^\s*uuid:\s*"(GPU-[^"]+)"', text, re.M))  # not the NVSwitches' uuids
    return (name.group(1) if name else "", uuids, int(memory.group(1)) // 2**20 if memory else 0)


def trimmed_profile(profile: str, gpus: int | None = None) -> str:
    """The profile's text, keeping only its first `gpus` devices (the mock enumerates its `devices` list)."""
    text = (unpacked() / "profiles" / PROFILES[profile]).read_text()
    if gpus is None:
        return text
    head, rest = text.split("\ndevices:\n", 1)
    listed, marker, tail = rest.partition("\n# ====")
    entries = re.split(r"\n(?=  - index: )", listed.strip("\n"))
    if not 0 < gpus <= len(entries):
        raise ValueError(f"the {profile} profile has {len(entries)} GPUs, not {gpus}")
    return f"{head}\ndevices:\n" + "\n".join(entries[:gpus]) + "\n" + marker + tail


def lay_out(root: Path, profile: str, gpus: int | None = None) -> MockGpus:
    """Write (or rewrite for another profile) the mock driver root at `root`, with the profile's first `gpus`
    GPUs (default: all of them)."""
    files = unpacked()
    lib = root / "usr" / "lib64"
    lib.mkdir(parents=True, exist_ok=True)
    shutil.copy2(files / f"libnvidia-ml.so.{LIB_VERSION}", lib / f"libnvidia-ml.so.{LIB_VERSION}")
    links = (("libnvidia-ml.so.1", f"libnvidia-ml.so.{LIB_VERSION}"), ("libnvidia-ml.so", "libnvidia-ml.so.1"))
    for link, target in links:
        (lib / link).unlink(missing_ok=True)
        (lib / link).symlink_to(target)
    (root / "config").mkdir(parents=True, exist_ok=True)
    (root / "config" / "config.yaml").write_text(trimmed_profile(profile, gpus))
    clear_failures(root)
    (root / "proc" / "modules").unlink(missing_ok=True)
    smi = root / "usr" / "bin" / "nvidia-smi"
    smi.parent.mkdir(parents=True, exist_ok=True)
    smi.write_text(NVIDIA_SMI.replace("%(version)s", LIB_VERSION))
    smi.chmod(0o755)
    mps_control = root / "usr" / "bin" / "nvidia-cuda-mps-control"
    mps_control.write_text(NVIDIA_CUDA_MPS_CONTROL)
    mps_control.chmod(0o755)
    version = root / "proc" / "driver" / "nvidia" / "version"
    version.parent.mkdir(parents=True, exist_ok=True)
    version.write_text(f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {LIB_VERSION}\n")
    product, uuids, memory = read_profile(root / "config" / "config.yaml")
    dev = root / "dev"
    if dev.exists():
        shutil.rmtree(dev)
    dev.mkdir()
    nodes = {f"nvidia{i}": (195, i) for i in range(len(uuids))}
    nodes |= {"nvidiactl": (195, 255), "nvidia-uvm": (510, 0), "nvidia-uvm-tools": (510, 1)}
    for name, (major, minor) in nodes.items():
        os.mknod(dev / name, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    return MockGpus(root, profile, product, uuids, memory)


def values(root: Path) -> dict[str, object]:
    """Chart values a user of a node with this preinstalled (mock) driver sets: the driver root, and the device
    plugin's dev root (with passDeviceSpecs it hands the kubelet <dev root>/dev/nvidiaN, which containerd
    stat's on the host: the mock's nodes live under its driver root, as with nvml-mock)."""
    return {"gpuNodes.driverRoot": str(root),
            "devicePlugin.extraEnv": [{"name": "NVIDIA_DEV_ROOT", "value": str(root)}]}


# Failure injection (k8s-test-infra 3b2b865d, pkg/gpu/mocknvml/engine): the mock reads overrides.yaml beside the
# profile it loaded (config.go ConfigOverridePathFor; MOCK_NVML_OVERRIDES is not set here), a document
# `{devices: {"<index>": <device config patch>}}` (config_override_merge.go ConfigOverrideDoc). A `failure:` block
# (config_types.go FailureInjectionConfig) trips the device on its first guarded NVML call (device.go tickFailure:
# GetMemoryInfo, GetTemperature, ...) when neither `after_calls` nor `probability` is set; the trip is per process
# and lasts until the process's last nvmlShutdown (engine.go Init builds the devices afresh). Its
# `xid` is then delivered once through nvmlEventSetWait as NVML_EVENT_TYPE_XID_CRITICAL_ERROR
# (bridge/events.go), which is what the device plugin's health check waits on; only a process that makes guarded
# calls in the session it waits in gets it, which the device plugin does not: see hack/node/mock-nvml-clock.c,
# preloaded into it (clock_library). `ecc_uncorrectable` keeps the
# device addressable (only its ECC counters and the Xid show the failure), as the mock's failure-injection demo
# pairs it with Xid 79 (docs/demo/failure-injection); `lost`/`fallen_off_bus` make every call on it return
# ERROR_GPU_IS_LOST (the device plugin reads each GPU's memory when it builds its devices).
FAILURE_MODE = "ecc_uncorrectable"
CLOCK_SOURCE = ROOT / "hack" / "node" / "mock-nvml-clock.c"
CLOCK = "libmock-nvml-clock.so"
# where the node's `nvidia` handler binds <root>/config in containers given GPUs (hack/node/nvidia-runtime-standin)
CONTAINER_CONFIG_DIR = "/etc/nvml-mock"


def overrides_path(root: Path) -> Path:
    return root / "config" / "overrides.yaml"


def inject_failure(root: Path, index: int, xid: int = 79, mode: str = FAILURE_MODE) -> Path:
    """Give the mock GPU at `index` of the driver root at `root` a failure with Xid `xid` (other devices'
    failures kept); every process that loads the mock from then on sees the device fail."""
    path = overrides_path(root)
    doc = json.loads(path.read_text()) if path.is_file() else {"devices": {}}
    doc["devices"][str(index)] = {"failure": {"mode": mode, "xid": {"code": xid}}}
    path.write_text(json.dumps(doc, indent=2) + "\n")  # JSON is YAML: the mock parses it with sigs.k8s.io/yaml
    return path


def clear_failures(root: Path) -> None:
    """The GPUs repaired (or replaced): no device of the driver root at `root` fails from then on."""
    overrides_path(root).unlink(missing_ok=True)


def clock_library(root: Path) -> Path:
    """hack/node/mock-nvml-clock.c built (with the machine's C compiler, once per source) into <root>/config, where
    a container given GPUs finds it at CONTAINER_CONFIG_DIR: preloaded (LD_PRELOAD) into a process that waits
    for NVML events, it makes the mock deliver an injected failure's Xid to it (the file says why)."""
    source = CLOCK_SOURCE.read_bytes()
    built = ROOT / ".tools" / "mock-nvml-clock" / f"{hashlib.sha256(source).hexdigest()[:16]}.so"
    if not built.is_file():
        compiler = shutil.which("cc") or shutil.which("gcc")
        if compiler is None:
            raise FileNotFoundError("no C compiler (cc) to build hack/node/mock-nvml-clock.c (Debian: gcc)")
        built.parent.mkdir(parents=True, exist_ok=True)
        partial = built.with_suffix(".tmp")
        subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o", str(partial), str(CLOCK_SOURCE)],
                       check=True, capture_output=True)
        partial.replace(built)
    target = root / "config" / CLOCK
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(built, target)
    return target
