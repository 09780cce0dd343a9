"""ControlPlane: etcd, kube-apiserver, kube-controller-manager and kube-scheduler started on loopback
(the package docstring says how)."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from gpu_stack_dev.controlplane.base import (
    PLANE_BINARIES,
    SERVICE_CIDR,
    START_TIMEOUT,
    STOP_ORDER,
    WORKDIR_PREFIX,
    Cluster,
    ControlPlaneError,
    client_context,
    die_with_parent,
    free_port,
    http_ok,
    remove_orphaned_workdirs,
    stop_process,
    unverified_context,
)
from gpu_stack_dev.controlplane.pki import Pki, write_kubeconfig, write_pki


class ControlPlane:
    def __init__(self, assets: Path, keep: bool = False, node_ip: str | None = None, scheduler: bool = True,
                 apiserver_args: tuple[str, ...] = ()) -> None:
        """`node_ip`: serve a real node too (gpu_stack_dev.node): the API server also listens on that address,
        advertises it as the `kubernetes` Service's endpoint (pods reach it through kube-proxy), and calls
        kubelets at their InternalIP (`kubectl logs`, `exec`). `scheduler=False`: no kube-scheduler (an older
        minor's plane, base.minor_assets: the v1.36.2 scheduler must not run against an older API server), so
        pods stay Pending. `apiserver_args`: more kube-apiserver flags (a feature gate and --runtime-config
        switching an API on)."""
        self.apiserver_args = apiserver_args
        self.assets = assets
        self.scheduler = scheduler
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
        remove_orphaned_workdirs()
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
                                preexec_fn=die_with_parent if main else None)  # noqa: PLW1509
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
        self._wait("etcd /health", lambda: http_ok(f"{etcd_url}/health"), ("etcd",))

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
            "--allow-privileged=true", "--v=1", *self.apiserver_args,
        ])
        kubeconfig = write_kubeconfig(self.workdir / "admin.kubeconfig", server, pki.ca_cert,
                                      pki.admin_cert, pki.admin_key)
        client = client_context(pki)
        self._wait("kube-apiserver /readyz", lambda: http_ok(f"{server}/readyz", client), ("etcd", "kube-apiserver"))

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
                   lambda: http_ok(f"{server}/api/v1/namespaces/default/serviceaccounts/default", client),
                   ("etcd", "kube-apiserver", "kube-controller-manager"))

        if not self.scheduler:
            return self._cluster(kubeconfig, server, pki)
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
                   lambda: http_ok(f"https://127.0.0.1:{scheduler_port}/healthz", unverified_context()),
                   PLANE_BINARIES)
        return self._cluster(kubeconfig, server, pki)

    def _cluster(self, kubeconfig: Path, server: str, pki: Pki) -> Cluster:
        assert self.workdir is not None
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


