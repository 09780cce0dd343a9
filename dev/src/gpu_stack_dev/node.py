"""A real node beside a throwaway control plane: kubelet and kube-proxy v1.36.2, containerd running every pod
under gVisor, a CNI bridge. Pods run: the chart's webhook Deployment, `helm test` pods, anything a test creates.

    with controlplane.ControlPlane(assets, node_ip=node.NODE_IP) as plane, node.Node(plane) as real:
        real.load_image(archive)                         # no registry: images are imported
        ...                                              # kubectl/helm against plane.kubeconfig

Only inside a network and mount namespace of this run's own (hack/netns.py; `make e2e` runs its tests
there): the node's address, bridge, iptables rules and mounts then exist only there and go with it.

Why each piece is as it is (every one of these was hit on these machines):
- runc and crun cannot start containers here (root lacks CAP_SYS_RESOURCE, cgroup v1: setrlimit fails);
  gVisor's runsc can, behind containerd's runc shim (options.BinaryName = hack/node/runsc-wrap, which says
  what it changes). Debian's containerd 1.6 and runsc; kubelet v1.36 still accepts containerd 1.x.
- the kubelet: cgroupfs driver, no QoS cgroups, no node-allocatable enforcement, no eviction thresholds and
  no local-storage isolation (it cannot manage cgroups here), `failCgroupV1: false`; an address that is not
  in 127.0.0.0/8 (it refuses loopback node IPs), added to `lo` of the private namespace.
- images: none can be pulled; `pause`, busybox and kubectl images are built from Debian's static binaries with
  buildah (hack/image/node-images.sh) and imported, as the webhook image is (`load_image`).
- pods reach the API server through the `kubernetes` Service: kube-proxy (iptables) to the advertised
  node address. Pods have no cluster DNS: nothing here resolves names.
Processes are started in sessions of their own and stopped by pid (kubelet and kube-proxy first, then every
containerd task, then containerd, then the shims and sandboxes it left), also at interpreter exit and on
SIGTERM; the mounts under the node's directory are unmounted. A node that is not Ready in time raises
NodeError with the last lines of the kubelet's and containerd's logs.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from gpu_stack_dev import controlplane, netns
from gpu_stack_dev.controlplane.pki import write_client_cert, write_kubeconfig
from gpu_stack_dev.paths import ROOT

NODE_IP = "10.77.0.1"
NODE_NAME = "e2e-node"
POD_CIDR = "10.88.0.0/24"
PAUSE_IMAGE = "localhost/pause:3.10"
BUSYBOX_IMAGE = "localhost/busybox:e2e"
KUBECTL_IMAGE = "localhost/kubectl:e2e"
IMAGES_DIR = ROOT / ".tools" / "images"
DEBIAN_PACKAGES = ("containerd", "runsc", "containernetworking-plugins", "iptables", "busybox-static", "buildah")
CNI_BIN = Path("/usr/lib/cni")
KUBELET_DEVICE_PLUGINS = Path("/var/lib/kubelet/device-plugins")
READY_TIMEOUT = float(os.environ.get("GPU_STACK_E2E_NODE_TIMEOUT", "180"))
NODE_BINARIES = ("kubelet", "kube-proxy")
NVIDIA_HANDLER = "nvidia"


class NodeError(RuntimeError):
    pass


def missing_prerequisites(assets: Path) -> list[str]:
    """What this machine lacks for a node (empty: nothing)."""
    missing = [f"{assets}/{b}" for b in NODE_BINARIES if not os.access(assets / b, os.X_OK)]
    missing += [t for t in ("containerd", "ctr", "runsc", "iptables", "buildah", "nsenter") if not shutil.which(t)]
    missing += [str(CNI_BIN / p) for p in ("bridge", "host-local", "loopback", "portmap") if not (CNI_BIN / p).exists()]
    return missing


class Node:
    def __init__(self, cluster: controlplane.Cluster, *, name: str = NODE_NAME, ip: str = NODE_IP,
                 assets: Path | None = None) -> None:
        """`assets`: where kubelet and kube-proxy are (default: the plane's assets)."""
        if cluster.workdir is None or cluster.pki is None or cluster.assets is None:
            raise NodeError("a node needs a control plane started here (hack/controlplane.py), not an existing cluster")
        self.cluster = cluster
        self.name = name
        self.ip = ip
        self.assets = assets or cluster.assets
        self.dir = cluster.workdir / ("node" if name == NODE_NAME else f"node-{name}")
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.socket = self.dir / "containerd.sock"
        self.kubelet_root = self.dir / "kubelet"
        # The kubelet serves device plugin registration at this fixed path whatever its --root-dir
        # (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1 constants.go KubeletSocket, v1.36): the node's own
        # directory is bind-mounted there, inside the run's private mount namespace only, on a /var/lib/kubelet of
        # that namespace's own (netns.private_paths): the machine's /var/lib is left as it was.
        self.device_plugin_dir = self.dir / "device-plugins"
        self.busybox_image = BUSYBOX_IMAGE
        self.nvidia_runtime_log = self.dir / "nvidia-runtime.jsonl"
        # containerd's per-registry hosts.toml files (gpu_stack_dev.registry writes one), read at each pull
        self.registry_config_dir = self.dir / "certs.d"
        # where a test lays out a mock GPU driver (gpu_stack_dev.e2e.mock_gpu); the `nvidia` handler injects it
        self.mock_driver_root = self.dir / "nvml-mock" / "driver"

    @property
    def node_name(self) -> str:
        return self.name

    def run_in_netns(self, cmd: list[str], **popen: object) -> subprocess.Popen[bytes]:
        """Start a process beside the node (this process already runs in the node's network namespace)."""
        proc: subprocess.Popen[bytes] = subprocess.Popen(cmd, **popen)  # type: ignore[call-overload]
        return proc

    # --- lifecycle -------------------------------------------------------------------------------------
    def __enter__(self) -> Node:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Node:
        if not netns.inside():
            raise NodeError("a node runs only inside a network namespace of its own: run through hack/netns.py "
                            "(make e2e does)")
        missing = missing_prerequisites(self.assets)
        if missing:
            raise NodeError(f"missing for a node: {', '.join(missing)} (hack/ensure-node.sh installs them)")
        self.dir.mkdir(parents=True, exist_ok=True)
        import atexit  # noqa: PLC0415

        atexit.register(self.stop)
        try:
            self._network()
            self._start_containerd()
            self.load_image(*node_images(self.cluster.kubectl))
            self._start_kubelet()
            self._start_kube_proxy()
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for name in ("kube-proxy", "kubelet"):
            self._terminate(name)
        if "containerd" in self.procs and self.procs["containerd"].poll() is None:
            for task in self.ctr("tasks", "ls", "-q", check=False).stdout.split():
                self.ctr("tasks", "kill", "-s", "SIGKILL", task, check=False)
        self._terminate("containerd")
        # shims and sandboxes are daemons of their own: found by the paths of this node in their command line
        for pid in _pids_mentioning(str(self.dir)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for mount in sorted(_mounts_under(self.dir), reverse=True):
            subprocess.run(["umount", "-l", mount], check=False, capture_output=True)
        if self.name == NODE_NAME and self.device_plugin_dir.exists():
            subprocess.run(["umount", "-l", str(KUBELET_DEVICE_PLUGINS)], check=False, capture_output=True)

    def _terminate(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is not None:
            controlplane.stop_process(proc, 15)

    # --- pieces ----------------------------------------------------------------------------------------
    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        with (self.dir / f"{name}.log").open("ab") as log:
            self.procs[name] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                start_new_session=True, env={**os.environ, **(env or {})})

    def log_tail(self, name: str, lines: int = 25) -> str:
        path = self.dir / f"{name}.log"
        text = path.read_text(errors="replace").splitlines() if path.exists() else ["(no log)"]
        return f"--- last lines of {name}'s log:\n" + "\n".join(text[-lines:])

    def _network(self) -> None:
        addresses = subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", "lo"], check=True, capture_output=True,
                                   text=True).stdout
        if f" {self.ip}/" not in addresses:
            # the kubelet refuses node IPs in 127.0.0.0/8; these kernels have no dummy link driver
            subprocess.run(["ip", "addr", "add", f"{self.ip}/32", "dev", "lo"], check=True)
        Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")
        self.device_plugin_dir.mkdir(parents=True, exist_ok=True)
        if self.name == NODE_NAME:  # one node of a mount namespace owns the fixed paths
            # the machine's paths the node's pods and NVIDIA's agents write to, this namespace's own and empty
            # (netns.HOST_PATHS): nothing is left on the machine, nothing left there by others is read
            netns.private_paths()
            KUBELET_DEVICE_PLUGINS.mkdir(parents=True, exist_ok=True)
            subprocess.run(["mount", "--bind", str(self.device_plugin_dir), str(KUBELET_DEVICE_PLUGINS)], check=True)
        # This namespace has no default route: without a route to Service IPs the kernel refuses a connection
        # from the node itself (a test, the kubelet's probes) before kube-proxy's OUTPUT rules can rewrite it.
        subprocess.run(["ip", "route", "replace", controlplane.SERVICE_CIDR, "dev", "lo", "src", self.ip], check=True)

    def _start_containerd(self) -> None:
        cni = self.dir / "cni"
        cni.mkdir(exist_ok=True)
        self.registry_config_dir.mkdir(exist_ok=True)
        (cni / "10-gpu-stack-e2e.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "gpu-stack-e2e", "plugins": [
                {"type": "bridge", "bridge": "gse2e0", "isGateway": True, "ipMasq": False, "hairpinMode": True,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR}]], "routes": [{"dst": "0.0.0.0/0"}],
                          "dataDir": str(self.dir / "cni-ipam")}},
                {"type": "portmap", "capabilities": {"portMappings": True}}]}, indent=2))
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        # runsc, the default, and the handler the NVIDIA toolkit registers (the chart's RuntimeClass `nvidia`)
        # as a stand-in that records each container's spec into .nvidia_runtime_log: both through the runc shim.
        runtimes = "".join(f"""[{cri}.containerd.runtimes.{handler}]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.{handler}.options]
  BinaryName = "{ROOT}/hack/node/{binary}"
  Root = "{self.dir}/runsc-root"
""" for handler, binary in (("runsc", "runsc-wrap"), (NVIDIA_HANDLER, "nvidia-runtime-standin")))
        (self.dir / "containerd.toml").write_text(f"""version = 2
root = "{self.dir}/containerd/root"
state = "{self.dir}/containerd/state"
[grpc]
  address = "{self.socket}"
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
[{cri}.containerd]
  snapshotter = "native"
  default_runtime_name = "runsc"
{runtimes}[{cri}.cni]
  bin_dir = "{CNI_BIN}"
  conf_dir = "{cni}"
[{cri}.registry]
  config_path = "{self.registry_config_dir}"
""")
        self._spawn_containerd()

    def _spawn_containerd(self) -> None:
        self._spawn("containerd", ["containerd", "--config", str(self.dir / "containerd.toml")],
                    env={"RUNSC_WRAP_STATE": str(self.dir / "runsc-wrap-state"),
                         "NVIDIA_RUNTIME_STANDIN_LOG": str(self.nvidia_runtime_log),
                         "NVIDIA_RUNTIME_STANDIN_DRIVER_ROOT": str(self.mock_driver_root)})
        deadline = time.monotonic() + 30
        while self.ctr("version", check=False).returncode:
            if time.monotonic() > deadline or self.procs["containerd"].poll() is not None:
                raise NodeError(f"containerd did not start\n{self.log_tail('containerd')}")
            time.sleep(0.3)

    def restart_containerd(self, signum: int = signal.SIGTERM) -> int:
        """Send containerd `signum`, wait for it to exit, and start it again with its config file as it is now (what
        systemd's Restart=always does on a node; the shims and their containers keep running). Returns how the old
        process ended (Popen.returncode: -signum when the signal ended it)."""
        old = self.procs["containerd"]
        old.send_signal(signum)
        code = old.wait(timeout=60)
        self._spawn_containerd()
        return code

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(["ctr", "-a", str(self.socket), "-n", "k8s.io", *args], capture_output=True, text=True,
                              check=False, timeout=300)
        if check and proc.returncode:
            raise NodeError(f"ctr {' '.join(args)}: {proc.stderr.strip()}")
        return proc

    def load_image(self, *archives: Path) -> None:
        """Import image archives (docker-archive or OCI) into the node's containerd."""
        for archive in archives:
            self.ctr("images", "import", "--no-unpack", str(archive))

    def _start_kubelet(self) -> None:
        pki = self.cluster.pki
        assert pki is not None
        cert, key = write_client_cert(pki, self.dir / "kubelet-client", f"system:node:{self.name}", "system:nodes")
        kubeconfig = write_kubeconfig(self.dir / "kubelet.kubeconfig", self.cluster.server, pki.ca_cert, cert, key,
                                      user=f"system:node:{self.name}")
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "failCgroupV1": False, "cgroupDriver": "cgroupfs", "cgroupsPerQOS": False, "enforceNodeAllocatable": [],
            "failSwapOn": False, "localStorageCapacityIsolation": False, "evictionHard": {},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(pki.ca_cert)}},
            "authorization": {"mode": "Webhook"},
            "address": self.ip, "readOnlyPort": 0, "healthzBindAddress": "127.0.0.1",
            "resolvConf": "/etc/resolv.conf", "serializeImagePulls": False,
            # not /var/log/pods: a kubelet removes the pod log directories of pods it does not know there,
            # so two nodes on one machine (two test runs) would delete each other's logs
            "podLogsDir": str(self.dir / "pod-logs"),
        }
        (self.dir / "kubelet.yaml").write_text(json.dumps(config, indent=2))
        self._spawn("kubelet", [str(self.assets / "kubelet"), "--config", str(self.dir / "kubelet.yaml"),
                                "--kubeconfig", str(kubeconfig), "--hostname-override", self.name,
                                "--node-ip", self.ip, "--root-dir", str(self.kubelet_root),
                                "--cert-dir", str(self.dir / "kubelet-pki"), "--v=1"])

    def _start_kube_proxy(self) -> None:
        pki = self.cluster.pki
        assert pki is not None
        cert, key = write_client_cert(pki, self.dir / "kube-proxy-client", "system:kube-proxy")
        kubeconfig = write_kubeconfig(self.dir / "kube-proxy.kubeconfig", self.cluster.server, pki.ca_cert, cert, key,
                                      user="system:kube-proxy")
        self._spawn("kube-proxy", [str(self.assets / "kube-proxy"), "--kubeconfig", str(kubeconfig),
                                   "--proxy-mode", "iptables", "--cluster-cidr", POD_CIDR,
                                   "--hostname-override", self.name, "--conntrack-max-per-core", "0",
                                   "--v=1"])

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([self.cluster.kubectl, "--kubeconfig", str(self.cluster.kubeconfig), *args],
                              capture_output=True, text=True, check=False, timeout=120, input=input)
        if check and proc.returncode:
            raise NodeError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
        return proc

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        # Ready, and the taints the API server added at registration lifted by the node lifecycle controller
        jsonpath = '{.status.conditions[?(@.type=="Ready")].status}{.spec.taints}'
        while self.kubectl("get", "node", self.name, "-o", f"jsonpath={jsonpath}", check=False).stdout != "True":
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                why = f"{', '.join(dead)} exited" if dead else f"not Ready after {READY_TIMEOUT:.0f}s"
                logs = "\n".join(self.log_tail(n) for n in dict.fromkeys([*dead, "kubelet", "containerd"]))
                raise NodeError(f"node {self.name}: {why}\n{logs}")
            time.sleep(1)
        # the kubernetes Service's endpoint (pods reach the API server through it) and kube-proxy's rules for it
        while self.kubectl("get", "endpointslices", "-n", "default", "-l", "kubernetes.io/service-name=kubernetes",
                           "-o", "jsonpath={.items[*].endpoints[*].addresses[*]}", check=False).stdout != self.ip:
            if time.monotonic() > deadline:
                raise NodeError(f"no endpoint {self.ip} for the kubernetes Service\n{self.log_tail('kube-proxy')}")
            time.sleep(1)


def node_images(kubectl: str) -> tuple[Path, Path, Path]:
    """The pause, busybox and kubectl image archives (hack/image/node-images.sh builds them once)."""
    out = subprocess.run([str(ROOT / "hack" / "image" / "node-images.sh"), str(IMAGES_DIR), kubectl],
                         capture_output=True, text=True, check=False)
    if out.returncode:
        raise NodeError(f"hack/image/node-images.sh failed:\n{out.stderr}")
    return IMAGES_DIR / "pause.tar", IMAGES_DIR / "busybox.tar", IMAGES_DIR / "kubectl.tar"


def _pids_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if text in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    found.append(int(entry.name))
    return found


def _mounts_under(directory: Path) -> list[str]:
    prefix = f"{directory}/"
    with open("/proc/self/mounts") as mounts:
        return [line.split()[1] for line in mounts if line.split()[1].startswith(prefix)]
