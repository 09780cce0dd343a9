"""Cluster lookups (`serve --cluster-lookups`) against the real API, with the webhook ServiceAccount's token
and the chart's ClusterRole: envFrom ConfigMap contents (GPU002), the namespace's Pod Security level (GPU006
hostIPC for MPS), and the API going away mid-run (the offline verdict, with a warning saying why)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpu_stack_dev.e2e.e2elib import E2ECluster, LiveWebhook, Release, Releases, unique

from .test_tls_selfmanaged import sa_kubeconfig

GPU_LIMIT = {"limits": {"nvidia.com/gpu": 1}}
DENIED = 'Error from server (Forbidden): error when creating "STDIN": admission webhook '
GPU002_HOLDS = (DENIED + '"validate.gpu-stack.io" denied the request: GPU002 container "main" imports ConfigMap '
                '"{}" (envFrom, no prefix), which holds NVIDIA_VISIBLE_DEVICES; GPUs are assigned by the device '
                "plugin: remove that key or set an envFrom prefix (spec.containers[0].envFrom[0])")
MPS_WARNINGS = ("Warning: gpu-stack GPU006: added MPS toleration gpu-stack.io/mps (annotation gpu-stack.io/mps)\n"
                "Warning: gpu-stack GPU006: added "
                "nodeSelector nvidia.com/mps.capable=true (annotation gpu-stack.io/mps)\n"
                "Warning: gpu-stack GPU008: set runtimeClassName nvidia: GPU pods run under the NVIDIA runtime")
# The envFrom pods ask for a GPU: in the chart's default layout only GPU pods run under the NVIDIA runtime
# and reach GPU002 (and get the runtime class).
RUNTIME_CLASS = "Warning: gpu-stack GPU008: set runtimeClassName nvidia: GPU pods run under the NVIDIA runtime"


def pod(name: str, *, env_from: str | None = None, annotations: dict[str, str] | None = None,
        gpu: bool = False) -> str:
    container: dict[str, Any] = {"name": "main", "image": "busybox"}
    if env_from:
        container["envFrom"] = [{"configMapRef": {"name": env_from}}]
    if gpu:
        container["resources"] = GPU_LIMIT
    return json.dumps({"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": name, "annotations": annotations or {}},
                       "spec": {"containers": [container]}})


def create(cluster: E2ECluster, namespace: str, manifest: str) -> tuple[int, str, str]:
    proc = cluster.kubectl("create", "-n", namespace, "-f", "-", input=manifest, check=False)
    return proc.returncode, proc.stdout.strip(), proc.stderr.strip()


class Relay:
    """A TCP relay to the API server that can be cut: the webhook's route to the API "going down"."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections: list[socket.socket] = []
        self.open = True
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while self.open:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.open:
                client.close()
                return
            upstream = socket.create_connection(self.target)
            self.connections += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def cut(self) -> None:
        """Connections refused from now on, and the open ones closed."""
        self.open = False
        with contextlib.suppress(OSError):  # wakes the blocked accept(); close() alone does not on Linux
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        for conn in self.connections:
            with contextlib.suppress(OSError):
                conn.close()


@pytest.fixture
def release(releases: Releases) -> Release:
    installed, _ = releases.install()
    return installed


@pytest.fixture
def relay(cluster: E2ECluster) -> Iterator[Relay]:
    server = yaml.safe_load(cluster.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    host, port = server.removeprefix("https://").rsplit(":", 1)
    relay = Relay((host, int(port)))
    yield relay
    relay.cut()


def lookup_webhook(cluster: E2ECluster, release: Release, live_webhook: Any, tmp_path: Path,
                   server: str | None = None) -> LiveWebhook:
    """The live webhook with lookups as the chart's ServiceAccount, optionally through another server URL."""
    kubeconfig = sa_kubeconfig(cluster, release, tmp_path / "sa.kubeconfig")
    if server:
        config = yaml.safe_load(kubeconfig.read_text())
        config["clusters"][0]["cluster"]["server"] = server
        config["clusters"][0]["cluster"]["tls-server-name"] = "127.0.0.1"
        kubeconfig.write_text(yaml.safe_dump(config))
    namespace = cluster.create_namespace()
    return live_webhook(release, extra_args=["--kubeconfig", str(kubeconfig), "--cluster-lookups",
                                             "--lookup-ttl", "1s"], probe_namespace=namespace)


def test_envfrom_configmap_contents(cluster: E2ECluster, release: Release, live_webhook: Any,
                                    tmp_path: Path) -> None:
    lookup_webhook(cluster, release, live_webhook, tmp_path)
    namespace = cluster.create_namespace()
    cluster.kubectl("create", "configmap", "gpu-env", "-n", namespace, "--from-literal=NVIDIA_VISIBLE_DEVICES=all")
    cluster.kubectl("create", "configmap", "app-env", "-n", namespace, "--from-literal=LOG_LEVEL=debug")
    # Offline all three would be a warning ("has no prefix; it must not hold NVIDIA_VISIBLE_DEVICES").
    assert create(cluster, namespace, pod("holds-it", env_from="gpu-env", gpu=True)) == (
        1, "", f"{RUNTIME_CLASS}\n" + GPU002_HOLDS.format("gpu-env"))
    assert create(cluster, namespace, pod("clean", env_from="app-env", gpu=True)) == (
        0, "pod/clean created", RUNTIME_CLASS)
    assert create(cluster, namespace, pod("missing", env_from="later-env", gpu=True)) == (
        0, "pod/missing created", f"{RUNTIME_CLASS}\n"
        'Warning: gpu-stack GPU002: container "main": envFrom ConfigMap "later-env" must '
        "not hold NVIDIA_VISIBLE_DEVICES (not found yet)")


def test_namespace_pod_security(cluster: E2ECluster, release: Release, live_webhook: Any, tmp_path: Path) -> None:
    lookup_webhook(cluster, release, live_webhook, tmp_path)
    baseline = cluster.create_namespace(unique("baseline"), labels={"pod-security.kubernetes.io/enforce": "baseline"})
    privileged = cluster.create_namespace(unique("privileged"),
                                          labels={"pod-security.kubernetes.io/enforce": "privileged"})
    mps_pod = pod("mps", annotations={"gpu-stack.io/mps": "true"}, gpu=True)
    # Without the lookup the pod would get hostIPC and then be refused by PodSecurity for a field the user
    # never set; the webhook says why and what to change instead (mps.podSecurityConflict: deny, the default).
    assert create(cluster, baseline, mps_pod) == (1, "", (
        DENIED + '"mutate.gpu-stack.io" denied the request: GPU006 MPS pods (annotation gpu-stack.io/mps) get '
        f'hostIPC, which Pod Security "baseline" enforced in namespace {baseline} forbids, so the pod would be '
        "rejected; label the namespace pod-security.kubernetes.io/enforce=privileged, or set the webhook policy "
        "mps.injectHostIPC=false (NVIDIA MPS does not need hostIPC) (spec.hostIPC)"))
    assert create(cluster, privileged, mps_pod) == (0, "pod/mps created", (
        "Warning: gpu-stack GPU006: hostIPC=true for MPS (annotation gpu-stack.io/mps); off: mps.injectHostIPC\n"
        + MPS_WARNINGS))
    assert cluster.kubectl("get", "pod", "mps", "-n", privileged, "-o", "jsonpath={.spec.hostIPC}").stdout == "true"


def test_api_down_mid_run(cluster: E2ECluster, release: Release, live_webhook: Any, tmp_path: Path,
                          relay: Relay) -> None:
    """The webhook reaches the API through a relay that is cut while it serves: lookups fail fast, the
    offline verdict applies, and the warning says the API was unreachable."""
    hook = lookup_webhook(cluster, release, live_webhook, tmp_path, server=f"https://127.0.0.1:{relay.port}")
    namespace = cluster.create_namespace(unique("baseline"), labels={"pod-security.kubernetes.io/enforce": "baseline"})
    for name in ("gpu-env", "gpu-env-2"):
        cluster.kubectl("create", "configmap", name, "-n", namespace, "--from-literal=NVIDIA_VISIBLE_DEVICES=all")
    assert create(cluster, namespace, pod("before", env_from="gpu-env", gpu=True)) == (
        1, "", f"{RUNTIME_CLASS}\n" + GPU002_HOLDS.format("gpu-env"))
    # not looked up before the cut (answers are cached for --lookup-ttl)
    unseen = cluster.create_namespace(unique("baseline"), labels={"pod-security.kubernetes.io/enforce": "baseline"})

    relay.cut()
    assert create(cluster, namespace, pod("after", env_from="gpu-env-2", gpu=True)) == (
        0, "pod/after created", f"{RUNTIME_CLASS}\n"
        'Warning: gpu-stack GPU002: container "main": envFrom ConfigMap "gpu-env-2" must '
        "not hold NVIDIA_VISIBLE_DEVICES (API unreachable)")
    # The level cannot be read: hostIPC is added as offline, with a warning, and PodSecurity has the last word.
    assert create(cluster, unseen, pod("mps", annotations={"gpu-stack.io/mps": "true"}, gpu=True)) == (1, "", (
        "Warning: gpu-stack GPU006: hostIPC=true for MPS (annotation gpu-stack.io/mps); Pod Security unchecked: "
        f"API unreachable\n{MPS_WARNINGS}\n"
        'Error from server (Forbidden): error when creating "STDIN": pods "mps" is forbidden: violates PodSecurity '
        '"baseline:latest": host namespaces (hostIPC=true)'))
    assert hook.process is not None and hook.process.poll() is None  # still serving
