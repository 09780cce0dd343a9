#!/usr/bin/env python3
"""A throwaway Kubernetes control plane (etcd + kube-apiserver + kube-controller-manager + kube-scheduler)
on loopback.

    python hack/controlplane.py run -- CMD [ARG...]   start a plane, run CMD with KUBECONFIG (and
                                                      GPU_STACK_E2E_CLUSTER=existing) set, tear down
    python hack/controlplane.py run --keep -- ...     keep the temp dir (logs, certificates) for debugging

From Python (tests/e2e/conftest.py, hack/demo.py):

    with controlplane.connect() as cluster:           # cluster.kubeconfig, .kubectl, .helm, .kind
        ...

Where the plane comes from (`connect`):
- `GPU_STACK_E2E_CLUSTER=existing`: the cluster of `KUBECONFIG` (kind, a real GPU cluster); nothing is
  started or stopped.
- otherwise binaries from `KUBEBUILDER_ASSETS` (etcd, kube-apiserver, kube-controller-manager,
  kube-scheduler, kubectl, helm), else `.tools/envtest` when complete, else (prepare=True) what
  `hack/envtest-assets.sh` makes from `../shared/envtest`. Neither: ControlPlaneError saying what to provide.

Ports are free ports chosen at start (several planes can run side by side); certificates are made on the
fly (controlplane_pki.py): the controller manager and the scheduler each authenticate with their own
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
import atexit
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from controlplane_pki import Pki, write_kubeconfig, write_pki

ROOT = Path(__file__).resolve().parent.parent
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


def _remove_orphaned_workdirs() -> None:
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


def _die_with_parent() -> None:  # runs in the child between fork and exec
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class ControlPlane:
    def __init__(self, assets: Path, keep: bool = False, node_ip: str | None = None) -> None:
        """`node_ip`: serve a real node too (hack/node.py): the API server also listens on that address,
        advertises it as the `kubernetes` Service's endpoint (pods reach it through kube-proxy), and calls
        kubelets at their InternalIP (`kubectl logs`, `exec`)."""
        self.assets = assets
        self.keep = keep
        self.node_ip = node_ip
        self.workdir: Path | None = None
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.cluster: Cluster | None = None
        self._previous_handlers: dict[int, object] = {}

    # --- lifecycle -------------------------------------------------------------------------------------
    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, attempts: int = 3) -> Cluster:
        atexit.register(self.stop)
        self._install_signal_handlers()
        _remove_orphaned_workdirs()
        self.workdir = Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX))
        (self.workdir / "owner.pid").write_text(str(os.getpid()))
        pki = write_pki(self.workdir / "pki", node_ips=(self.node_ip,) if self.node_ip else ())
        for attempt in range(1, attempts + 1):
            try:
                self.cluster = self._start_processes(pki)
                return self.cluster
            except ControlPlaneError as exc:
                self._stop_processes()
                port_race = "address already in use" in str(exc)
                if attempt == attempts or not port_race:
                    self.stop()
                    raise
        raise AssertionError("unreachable")

    def stop(self) -> None:
        self._stop_processes()
        if self.workdir and not self.keep:
            shutil.rmtree(self.workdir, ignore_errors=True)
        elif self.workdir:
            print(f"controlplane: kept {self.workdir}", file=sys.stderr)
        self.workdir = None
        self._restore_signal_handlers()
        atexit.unregister(self.stop)

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGHUP):
            self._previous_handlers[sig] = signal.signal(sig, self._on_signal)

    def _restore_signal_handlers(self) -> None:
        for sig, handler in self._previous_handlers.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous_handlers.clear()

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.stop()
        raise SystemExit(128 + signum)

    # --- processes -------------------------------------------------------------------------------------
    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        assert self.workdir is not None
        log = (self.workdir / f"{name}.log").open("ab")
        main = threading.current_thread() is threading.main_thread()
        proc = subprocess.Popen([str(self.assets / name), *args], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=_die_with_parent if main else None)  # noqa: PLW1509
        log.close()
        self.procs[name] = proc
        return proc

    def _log_tail(self, name: str, lines: int = 15) -> str:
        assert self.workdir is not None
        path = self.workdir / f"{name}.log"
        text = path.read_text(errors="replace").splitlines() if path.exists() else []
        return "\n".join(text[-lines:])

    def _wait(self, what: str, ready: object, names: tuple[str, ...]) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            for name in names:
                if self.procs[name].poll() is not None:
                    raise ControlPlaneError(f"{name} exited ({self.procs[name].returncode}) while waiting for "
                                            f"{what}:\n{self._log_tail(name)}")
            if ready():  # type: ignore[operator]
                return
            time.sleep(0.25)
        raise ControlPlaneError(f"timed out after {START_TIMEOUT:.0f}s waiting for {what}:\n"
                                + "\n".join(self._log_tail(n) for n in names))

    def _start_processes(self, pki: Pki) -> Cluster:
        assert self.workdir is not None
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        etcd_url, peer_url = f"http://127.0.0.1:{etcd_port}", f"http://127.0.0.1:{peer_port}"
        data = self.workdir / f"etcd-{etcd_port}"
        self._spawn("etcd", [
            f"--data-dir={data}", "--name=e2e", f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}", f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}", f"--initial-cluster=e2e={peer_url}",
            "--log-level=warn", "--logger=zap", "--quota-backend-bytes=8589934592",
        ])
        self._wait("etcd /health", lambda: _http_ok(f"{etcd_url}/health"), ("etcd",))

        server = f"https://127.0.0.1:{api_port}"
        if self.node_ip:
            # The default lease reconciler publishes the advertised address as the `kubernetes` endpoint.
            network = ["--bind-address=0.0.0.0", f"--advertise-address={self.node_ip}",
                       "--kubelet-preferred-address-types=InternalIP",
                       f"--kubelet-client-certificate={pki.admin_cert}", f"--kubelet-client-key={pki.admin_key}"]
        else:
            network = ["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none"]
        self._spawn("kube-apiserver", [
            f"--etcd-servers={etcd_url}", *network,
            f"--secure-port={api_port}", f"--cert-dir={self.workdir / 'apiserver'}",
            f"--tls-cert-file={pki.serving_cert}", f"--tls-private-key-file={pki.serving_key}",
            f"--client-ca-file={pki.ca_cert}", "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki.sa_pub}", f"--service-account-signing-key-file={pki.sa_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--enable-aggregator-routing=true",
            "--allow-privileged=true", "--v=1",
        ])
        kubeconfig = write_kubeconfig(self.workdir / "admin.kubeconfig", server, pki.ca_cert,
                                      pki.admin_cert, pki.admin_key)
        client = _client_context(pki)
        self._wait("kube-apiserver /readyz", lambda: _http_ok(f"{server}/readyz", client), ("etcd", "kube-apiserver"))

        kcm_kubeconfig = write_kubeconfig(self.workdir / "kcm.kubeconfig", server, pki.ca_cert,
                                          pki.controller_manager_cert, pki.controller_manager_key,
                                          user="system:kube-controller-manager")
        self._spawn("kube-controller-manager", [
            f"--kubeconfig={kcm_kubeconfig}", "--secure-port=0", "--use-service-account-credentials",
            # No kubelet sends heartbeats for the Nodes a test publishes: the node lifecycle controller
            # would taint them node.kubernetes.io/unreachable after its grace period and evict their
            # pods. It is off; every other default controller (and the two opt-in token ones) runs.
            # With a real node (node_ip) the lifecycle controller runs: it lifts the not-ready taint once the
            # kubelet reports Ready.
            "--controllers=*,bootstrapsigner,tokencleaner" + ("" if self.node_ip else ",-node-lifecycle-controller"),
            f"--root-ca-file={pki.ca_cert}", f"--service-account-private-key-file={pki.sa_key}",
            f"--cluster-signing-cert-file={pki.ca_cert}", f"--cluster-signing-key-file={pki.ca_key}",
            "--leader-elect=false", f"--service-cluster-ip-range={SERVICE_CIDR}", "--v=1",
        ])
        # The ServiceAccount admission plugin refuses pods until the namespace's "default" SA exists: the
        # controller manager's serviceaccount controller making it is the sign that controllers run.
        self._wait("the controller manager (ServiceAccount default/default)",
                   lambda: _http_ok(f"{server}/api/v1/namespaces/default/serviceaccounts/default", client),
                   ("etcd", "kube-apiserver", "kube-controller-manager"))

        scheduler_port = free_port()
        scheduler_kubeconfig = write_kubeconfig(self.workdir / "scheduler.kubeconfig", server, pki.ca_cert,
                                                pki.scheduler_cert, pki.scheduler_key, user="system:kube-scheduler")
        self._spawn("kube-scheduler", [
            f"--kubeconfig={scheduler_kubeconfig}", f"--authentication-kubeconfig={scheduler_kubeconfig}",
            f"--authorization-kubeconfig={scheduler_kubeconfig}", "--leader-elect=false",
            "--bind-address=127.0.0.1", f"--secure-port={scheduler_port}",
            f"--cert-dir={self.workdir / 'scheduler'}", "--v=1",
        ])
        # /healthz is open to anonymous callers (--authorization-always-allow-paths' default); its serving
        # certificate is self-signed in --cert-dir, on loopback: not verified.
        self._wait("kube-scheduler /healthz",
                   lambda: _http_ok(f"https://127.0.0.1:{scheduler_port}/healthz", _unverified_context()),
                   PLANE_BINARIES)
        kubectl = self.assets / "kubectl"
        helm = self.assets / "helm"
        return Cluster(kind="envtest", kubeconfig=kubeconfig, server=server, workdir=self.workdir, pki=pki,
                       assets=self.assets,
                       pids=tuple(p.pid for p in self.procs.values()),
                       kubectl=str(kubectl) if kubectl.exists() else (shutil.which("kubectl") or "kubectl"),
                       helm=str(helm) if helm.exists() else None)

    def _stop_processes(self) -> None:
        for proc in [self.procs.pop(n) for n in STOP_ORDER if n in self.procs]:
            stop_process(proc, 10)


def stop_process(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM, then SIGKILL after `timeout` seconds; returns once the process is gone."""
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _client_context(pki: Pki) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca_cert))
    context.load_cert_chain(str(pki.admin_cert), str(pki.admin_key))
    return context


def _unverified_context() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def _http_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as response:  # noqa: S310
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def connect(prepare: bool = False, keep: bool = False) -> Iterator[Cluster]:
    """The cluster to test against: an existing one (GPU_STACK_E2E_CLUSTER=existing) or a fresh plane."""
    if os.environ.get("GPU_STACK_E2E_CLUSTER") == "existing":
        kubeconfig = os.environ.get("KUBECONFIG", "")
        if not kubeconfig or not Path(kubeconfig.split(os.pathsep)[0]).is_file():
            raise ControlPlaneError("GPU_STACK_E2E_CLUSTER=existing needs KUBECONFIG to name a kubeconfig file "
                                    f"(KUBECONFIG={kubeconfig!r})")
        assets = os.environ.get("KUBEBUILDER_ASSETS")
        local = Path(assets) if assets else ROOT / ".tools" / "envtest"
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
