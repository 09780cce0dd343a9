"""The control plane's parts that do not start it: where its binaries come from, what a running plane
offers (Cluster), and the process and HTTP helpers the plane and the node share."""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from gpu_stack_dev.controlplane.pki import Pki
from gpu_stack_dev.paths import ROOT

PLANE_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
# Stopped one after the other in this order: an API server whose etcd is gone first hangs in its shutdown.
STOP_ORDER = ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd")
ASSET_BINARIES = (*PLANE_BINARIES, "kubectl", "helm")
SERVICE_CIDR = "10.0.0.0/24"
WORKDIR_PREFIX = "gpu-stack-e2e-"
START_TIMEOUT = float(os.environ.get("GPU_STACK_E2E_START_TIMEOUT", "120"))


class ControlPlaneError(RuntimeError):
    pass


@dataclass(frozen=True)
class Cluster:
    """What a running (or existing) cluster offers: how to reach it and the client binaries to use."""

    kind: str  # "envtest" (started here) or "existing" (KUBECONFIG)
    kubeconfig: Path
    kubectl: str
    helm: str | None  # Helm 4 from the assets; None when not known (existing cluster without assets)
    server: str = ""
    pids: tuple[int, ...] = ()  # the processes started for it (envtest), all gone after stop()
    workdir: Path | None = None  # its temp dir (envtest), removed by stop()
    pki: Pki | None = None  # its certificates (envtest)
    assets: Path | None = None  # where its binaries came from (envtest)


def _complete(directory: Path, names: tuple[str, ...] = ASSET_BINARIES) -> list[str]:
    return [n for n in names if not os.access(directory / n, os.X_OK)]


def resolve_assets(prepare: bool = False) -> Path | None:
    """The KUBEBUILDER_ASSETS directory to use, or None when there is none (see the module docstring)."""
    env = os.environ.get("KUBEBUILDER_ASSETS")
    if env:
        missing = _complete(Path(env), PLANE_BINARIES)
        if missing:
            raise ControlPlaneError(f"KUBEBUILDER_ASSETS={env} lacks {', '.join(missing)}; "
                                    f"prepare it with hack/envtest-assets.sh")
        return Path(env)
    local = ROOT / ".tools" / "envtest"
    if not _complete(local):
        return local
    if prepare and (ROOT.parent / "shared" / "envtest" / "kube-apiserver.xz").is_file():
        out = subprocess.run([str(ROOT / "hack" / "envtest-assets.sh")], check=True, capture_output=True, text=True)
        return Path(out.stdout.strip().splitlines()[-1])
    return None


# The older minors hack/envtest-assets.sh --minor prepares (../shared/envtest/v1.32, v1.34): their API server and
# controller manager, the same etcd, and the kubectl and Helm their users have. 1.36 is the default set.
OLDER_MINORS = ("1.32", "1.34")


def minor_assets(minor: str) -> Path:
    """The assets directory of an older minor's plane (no scheduler: ControlPlane(..., scheduler=False)); made
    from ../shared/envtest/v<minor> on first use. ControlPlaneError when that source is missing."""
    if minor not in OLDER_MINORS:
        raise ControlPlaneError(f"no older minor {minor} (one of {', '.join(OLDER_MINORS)})")
    out = subprocess.run([str(ROOT / "hack" / "envtest-assets.sh"), "--minor", minor], capture_output=True, text=True,
                         check=False)
    if out.returncode != 0:
        raise ControlPlaneError(f"hack/envtest-assets.sh --minor {minor} failed:\n{out.stderr.strip()[-2000:]}")
    return Path(out.stdout.strip().splitlines()[-1])


def remove_orphaned_workdirs() -> None:
    """Temp dirs of planes whose Python process was SIGKILLed (its children died with it, the dir stayed)."""
    for directory in Path(tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}*"):
        try:
            os.kill(int((directory / "owner.pid").read_text()), 0)
        except ProcessLookupError:
            shutil.rmtree(directory, ignore_errors=True)
        except (OSError, ValueError):
            continue


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def die_with_parent() -> None:  # runs in the child between fork and exec
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def stop_process(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM, then SIGKILL after `timeout` seconds; returns once the process is gone."""
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def client_context(pki: Pki) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca_cert))
    context.load_cert_chain(str(pki.admin_cert), str(pki.admin_key))
    return context


def unverified_context() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def http_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as response:  # noqa: S310
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


