"""A throwaway Kubernetes control plane (etcd + kube-apiserver + kube-controller-manager + kube-scheduler)
on loopback.

    python hack/controlplane.py run -- CMD [ARG...]   start a plane, run CMD with KUBECONFIG (and
                                                      GPU_STACK_E2E_CLUSTER=existing) set, tear down
    python hack/controlplane.py run --keep -- ...     keep the temp dir (logs, certificates) for debugging

From Python (tests/e2e/conftest.py, hack/demo.py; `from gpu_stack_dev import controlplane`):

    with controlplane.connect() as cluster:           # cluster.kubeconfig, .kubectl, .helm, .kind
        ...

Where the plane comes from (`connect`):
- `GPU_STACK_E2E_CLUSTER=existing`: the cluster of `KUBECONFIG` (kind, a real GPU cluster); nothing is
  started or stopped.
- otherwise binaries from `KUBEBUILDER_ASSETS` (etcd, kube-apiserver, kube-controller-manager,
  kube-scheduler, kubectl, helm), else `.tools/envtest` when complete, else (prepare=True) what
  `hack/envtest-assets.sh` makes from `../shared/envtest`. Neither: ControlPlaneError saying what to provide.

Ports are free ports chosen at start (several planes can run side by side); certificates are made on the
fly (pki.py): the controller manager and the scheduler each authenticate with their own
client certificate (CN=system:kube-controller-manager, CN=system:kube-scheduler, which the default RBAC
binds). The plane counts as up when etcd is healthy, the API server ready, the controller manager's
controllers run and the scheduler answers /healthz. Everything lives in one temp dir (certificates, one log
per process) that is removed at the end (kept with --keep; a start that fails shows each log's tail). Every
process is started in its own session and stopped by pid: on `stop()`, on leaving the `with`, at
interpreter exit (atexit), on SIGTERM/SIGHUP, and by the kernel if this process dies (PR_SET_PDEATHSIG);
the temp dir of a plane whose process was SIGKILLed is removed when the next plane starts.

There is no kubelet: Nodes are API objects a test publishes (status subresource for capacity and
conditions); the scheduler binds pods to them and nothing runs the pods. The controller manager runs
without its node lifecycle controller, so such Nodes are never tainted unreachable nor their pods evicted.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from gpu_stack_dev.controlplane.base import (
    ASSET_BINARIES,
    OLDER_MINORS,
    PLANE_BINARIES,
    SERVICE_CIDR,
    Cluster,
    ControlPlaneError,
    free_port,
    minor_assets,
    resolve_assets,
    stop_process,
)
from gpu_stack_dev.controlplane.plane import ControlPlane
from gpu_stack_dev.paths import ROOT

__all__ = ["ASSET_BINARIES", "OLDER_MINORS", "PLANE_BINARIES", "SERVICE_CIDR", "Cluster", "ControlPlane",
           "ControlPlaneError", "connect", "free_port", "main", "minor_assets", "resolve_assets", "stop_process"]


@contextlib.contextmanager
def connect(prepare: bool = False, keep: bool = False) -> Iterator[Cluster]:
    """The cluster to test against: an existing one (GPU_STACK_E2E_CLUSTER=existing) or a fresh plane."""
    if os.environ.get("GPU_STACK_E2E_CLUSTER") == "existing":
        kubeconfig = os.environ.get("KUBECONFIG", "")
        if not kubeconfig or not Path(kubeconfig.split(os.pathsep)[0]).is_file():
            raise ControlPlaneError("GPU_STACK_E2E_CLUSTER=existing needs KUBECONFIG to name a kubeconfig file "
                                    f"(KUBECONFIG={kubeconfig!r})")
        given = os.environ.get("KUBEBUILDER_ASSETS")
        local = Path(given) if given else ROOT / ".tools" / "envtest"
        kubectl = local / "kubectl" if (local / "kubectl").exists() else shutil.which("kubectl") or "kubectl"
        helm = local / "helm" if (local / "helm").exists() else None
        yield Cluster(kind="existing", kubeconfig=Path(kubeconfig.split(os.pathsep)[0]), kubectl=str(kubectl),
                      helm=str(helm) if helm else None)
        return
    assets = resolve_assets(prepare=prepare)
    if assets is None:
        raise ControlPlaneError(
            "no control plane: set KUBEBUILDER_ASSETS to a directory with etcd, kube-apiserver, "
            "kube-controller-manager, kube-scheduler, kubectl and helm (hack/envtest-assets.sh makes one from "
            "../shared/envtest), or GPU_STACK_E2E_CLUSTER=existing with KUBECONFIG for a running cluster")
    with ControlPlane(assets, keep=keep) as cluster:
        yield cluster


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="controlplane.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="start a control plane, run CMD with KUBECONFIG set, stop the plane")
    run.add_argument("--keep", action="store_true", help="keep the temp dir (logs, certificates)")
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARG...]")
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("run needs a command after --")
    try:
        with connect(prepare=True, keep=args.keep) as cluster:
            print(f"controlplane: {cluster.kind} at {cluster.server or '-'}, KUBECONFIG={cluster.kubeconfig}",
                  file=sys.stderr)
            bindir = str(Path(cluster.kubectl).parent)
            env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "GPU_STACK_E2E_CLUSTER": "existing",
                   "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
            return subprocess.call(cmd, env=env)
    except ControlPlaneError as exc:
        print(f"controlplane: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
