"""The real NVIDIA GPU Operator v26.7.0 controller against an e2e cluster (`GpuOperator`, a context manager).

The build lies beside the repository in ../shared/gpu-operator (its README: how it was built and run);
`source_dir()` finds it, GPU_STACK_GPU_OPERATOR_SRC overrides. Nothing is downloaded: binary (sha256 checked)
and operand assets are unpacked once into .tools/gpu-operator-v26.7.0.

`start()` installs the three nvidia.com CRDs the controllers watch, the operator's namespace (any name), the
chart's RBAC for it (rbac.yaml, namespace rewritten), and runs the binary as that ServiceAccount (a
TokenRequest token). Its assets path /opt/gpu-operator is hard-coded: it runs in a private mount namespace with
the assets bound on /opt (`unshare -m`; `unshare -rm` when not root). `stop()` removes all of that, waits until
the RuntimeClasses are garbage-collected, and leaves no process.

`prepare_node()` publishes a fake GPU node: the labels the reconcile needs (nvidia.com/gpu.present, NFD's OS
labels), containerRuntimeVersion, Ready, no not-ready taint (the node lifecycle controller is off on the plane).
It has no allocatable resources: the scheduler never binds the operand pods, so they stay Pending and unbound
and the DaemonSet controller's rolling updates (delete a pod, create its successor) finish without a kubelet.
A pod refused at admission shows as a FailedCreate event of its DaemonSet (`failed_creates`).

One GpuOperator per cluster at a time: the operator reconciles the oldest ClusterPolicy only, and names its
operand ClusterRoles alike in every namespace.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import lzma
import os
import shutil
import signal
import subprocess
import tarfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from gpu_stack_dev.controlplane.base import die_with_parent, free_port, http_ok, stop_process
from gpu_stack_dev.paths import ROOT

from .e2elib import E2ECluster, unique
from .operator_manifests import merged, rbac_for, validation_pod

VERSION = "v26.7.0"
BINARY_SHA256 = "70b2a7beba366b3a16aebcdf5fe5a6d07e057f56e66ed8b53b572fbd99eda0bd"  # ../shared/gpu-operator/README.md
CACHE = ROOT / ".tools" / f"gpu-operator-{VERSION}"
CLUSTER_POLICY = ROOT / "tests" / "fixtures" / f"gpu-operator-{VERSION}" / "clusterpolicy.yaml"
CRDS = ("nvidia.com_clusterpolicies.yaml", "nvidia.com_nvidiadrivers.yaml", "nvidia.com_gpuclusters.yaml")
RUNTIME_CLASSES = ("nvidia", "nvidia-cdi", "nvidia-legacy")
# The chart's operator Deployment env (operator-deployment.yaml); other images come from the ClusterPolicy.
OPERATOR_ENV = {"WATCH_NAMESPACE": "", "VALIDATOR_IMAGE": f"nvcr.io/nvidia/gpu-operator:{VERSION}",
                "DRIVER_MANAGER_IMAGE": "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.12.0"}
GPU_NODE_LABELS = {
    "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
    "feature.node.kubernetes.io/pci-10de.present": "true", "nvidia.com/gpu.present": "true",
    # Without these two no reconcile succeeds; the driver image tag is built from them (595.91.07-ubuntu24.04).
    "feature.node.kubernetes.io/system-os_release.ID": "ubuntu",
    "feature.node.kubernetes.io/system-os_release.VERSION_ID": "24.04",
    "feature.node.kubernetes.io/kernel-version.full": "6.8.0-100-generic",
}
T = TypeVar("T")


class GpuOperatorError(RuntimeError):
    pass


@dataclass(frozen=True)
class FailedCreate:
    """A FailedCreate event of a DaemonSet: its pod was refused (the message carries the denial text)."""

    daemonset: str
    message: str
    count: int


def source_dir() -> Path | None:
    """../shared/gpu-operator beside the repository (beside the main checkout for a git worktree)."""
    given = os.environ.get("GPU_STACK_GPU_OPERATOR_SRC")
    candidates = [Path(given)] if given else [ROOT.parent / "shared" / "gpu-operator"]
    dot_git = ROOT / ".git"
    if not given and dot_git.is_file():  # a worktree: "gitdir: <main>/.git/worktrees/<name>"
        gitdir = Path(dot_git.read_text().split(":", 1)[1].strip())
        candidates.append(gitdir.parents[2].parent / "shared" / "gpu-operator")
    return next((c for c in candidates if (c / "gpu-operator.xz").is_file()), None)


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def unpack(source: Path, cache: Path = CACHE) -> tuple[Path, Path]:
    """(binary, assets dir holding gpu-operator/ and validator/), unpacked once into `cache`."""
    cache.mkdir(parents=True, exist_ok=True)
    binary, assets = cache / "gpu-operator", cache / "opt"
    if not binary.is_file() or _sha256(binary) != BINARY_SHA256:
        partial = cache / "gpu-operator.partial"
        with lzma.open(source / "gpu-operator.xz") as packed, partial.open("wb") as out:
            shutil.copyfileobj(packed, out)
        if (got := _sha256(partial)) != BINARY_SHA256:
            partial.unlink()
            raise GpuOperatorError(f"{source / 'gpu-operator.xz'} unpacks to sha256 {got}, not {BINARY_SHA256}")
        partial.chmod(0o755)
        partial.rename(binary)
    stamp = cache / "assets.sha256"
    wanted = _sha256(source / "assets.tar.xz")
    if not (assets / "gpu-operator").is_dir() or not stamp.is_file() or stamp.read_text() != wanted:
        shutil.rmtree(assets, ignore_errors=True)
        with tarfile.open(source / "assets.tar.xz") as tar:
            tar.extractall(assets, filter="data")
        stamp.write_text(wanted)
    return binary, assets


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 60, interval: float = 0.5) -> T:
    """probe()'s first answer that is not None; GpuOperatorError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while (answer := probe()) is None:
        if time.monotonic() > deadline:
            raise GpuOperatorError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
    return answer


class GpuOperator:
    def __init__(self, cluster: E2ECluster, workdir: Path, namespace: str = "gpu-operator",
                 source: Path | None = None) -> None:
        found = source or source_dir()
        if found is None:
            raise GpuOperatorError("no GPU Operator build: ../shared/gpu-operator (or GPU_STACK_GPU_OPERATOR_SRC)")
        self.cluster, self.workdir, self.namespace, self.source = cluster, workdir, namespace, found
        self.policy_name = "cluster-policy"
        self.nodes: list[str] = []
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "gpu-operator.log"

    def __enter__(self) -> GpuOperator:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> None:
        gpu_nodes = self.cluster.kubectl("get", "nodes", "-l", "nvidia.com/gpu.present=true", "-o", "name").stdout
        if gpu_nodes.strip():  # the operator takes the OS of the first GPU node it lists
            raise GpuOperatorError(f"GPU nodes left by another test: {gpu_nodes.split()}")
        binary, assets = unpack(self.source)
        self.workdir.mkdir(parents=True, exist_ok=True)
        crds = [name.removeprefix("nvidia.com_").removesuffix(".yaml") + ".nvidia.com" for name in CRDS]
        wait_for(f"CRDs {crds} not terminating (another test may have deleted them)", lambda: None if any(
            self.cluster.kubectl("get", "crd", c, "-o", "jsonpath={.metadata.deletionTimestamp}", check=False)
            .stdout.strip() for c in crds) else True)
        self.cluster.kubectl("apply", "--server-side", "--force-conflicts",
                             *(a for c in CRDS for a in ("-f", str(self.source / "crds" / c))))
        self.cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", *(f"crd/{c}" for c in crds))
        self.cluster.create_namespace(self.namespace)
        rbac = rbac_for((self.source / "rbac.yaml").read_text(), self.namespace)
        self.cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": rbac}))
        kubeconfig = self._serviceaccount_kubeconfig()
        health = free_port()
        env = {**os.environ, **OPERATOR_ENV, "OPERATOR_NAMESPACE": self.namespace, "KUBECONFIG": str(kubeconfig)}
        run = (f'mount --bind "$0" /opt && exec "$1" --leader-elect=false --zap-log-level=info '
               f"--metrics-bind-address=127.0.0.1:{free_port()} --health-probe-bind-address=127.0.0.1:{health}")
        unshare = ["unshare", "-m", "--propagation", "private"] if os.geteuid() == 0 else ["unshare", "-rm"]
        with self.log_path.open("wb") as log:  # killed with the test process, whatever stops it
            self.process = subprocess.Popen([*unshare, "sh", "-c", run, str(assets), str(binary)], env=env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True,
                                            preexec_fn=die_with_parent)  # noqa: PLW1509
        ready = f"http://127.0.0.1:{health}/readyz"
        wait_for("the operator's /readyz", lambda: (self._running() and http_ok(ready)) or None)

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process, timeout=10)
            with contextlib.suppress(ProcessLookupError):  # anything it left in its session
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process = None
        kubectl = self.cluster.kubectl
        kubectl("delete", "clusterpolicies.nvidia.com", "--all", "--ignore-not-found", "--wait=true", check=False)
        # The ClusterPolicy's RuntimeClasses go with it (GC): later installs may create an "nvidia" of their own. Waited
        # for while its CRD is still there: the garbage collector must map the owner's kind to see it gone (a plane
        # just started may not watch the CRD yet: it does within its discovery resync, 30 s).
        left: GpuOperatorError | None = None
        try:
            wait_for("the operator's RuntimeClasses garbage-collected", lambda: not self.runtime_classes() or None,
                     timeout=90)
        except GpuOperatorError as exc:
            left = exc  # raised once the rest is removed
        for name in self.nodes:
            kubectl("delete", "node", name, "--ignore-not-found", "--wait=false", check=False)
        self.nodes.clear()
        kubectl("delete", "namespace", self.namespace, "--ignore-not-found", "--wait=true", "--timeout=120s",
                check=False)
        for doc in rbac_for((self.source / "rbac.yaml").read_text(), self.namespace):
            if "namespace" not in doc["metadata"]:  # cluster-scoped
                kubectl("delete", doc["kind"], doc["metadata"]["name"], "--ignore-not-found", check=False)
        kubectl("delete", "--ignore-not-found", "--wait=true", "--timeout=120s",
                *(a for c in CRDS for a in ("-f", str(self.source / "crds" / c))), check=False)
        if left is not None:
            raise left

    def _running(self) -> bool:  # or GpuOperatorError with its log once the operator has exited
        if self.process is not None and self.process.poll() is not None:
            raise GpuOperatorError(f"the operator exited {self.process.returncode}:\n{self.log()[-3000:]}")
        return True

    def _serviceaccount_kubeconfig(self) -> Path:
        """The admin kubeconfig's cluster with a TokenRequest token of the operator's ServiceAccount."""
        token = self.cluster.kubectl("create", "token", "gpu-operator", "-n", self.namespace, "--duration=6h").stdout
        admin = yaml.safe_load(self.cluster.kubeconfig.read_text())
        context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
        path = self.workdir / "gpu-operator.kubeconfig"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "gpu-operator",
            "clusters": [next(c for c in admin["clusters"] if c["name"] == context["cluster"])],
            "users": [{"name": "gpu-operator", "user": {"token": token.strip()}}],
            "contexts": [{"name": "gpu-operator", "context": {"cluster": context["cluster"], "user": "gpu-operator"}}],
        }))
        path.chmod(0o600)
        return path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    # --- what the operator reconciles ------------------------------------------------------------------
    def apply_cluster_policy(self, spec_overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The chart's default ClusterPolicy with `spec_overrides` merged into its spec; returns what was sent."""
        others = [p["metadata"]["name"] for p in self.cluster.get_json("clusterpolicies.nvidia.com")["items"]
                  if p["metadata"]["name"] != self.policy_name]
        if others:  # the operator would reconcile the oldest one only
            raise GpuOperatorError(f"other ClusterPolicies exist: {others}")
        policy: dict[str, Any] = yaml.safe_load(CLUSTER_POLICY.read_text())
        policy["spec"] = merged(policy["spec"], spec_overrides or {})
        self.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(policy))
        return policy

    def switch_to_nri(self) -> None:
        """spec.cdi.nriPluginEnabled: true (CDI devices injected by the toolkit's NRI plugin, no RuntimeClass)."""
        self.cluster.kubectl("patch", "clusterpolicies.nvidia.com", self.policy_name, "--type=merge",
                             "-p", json.dumps({"spec": {"cdi": {"nriPluginEnabled": True}}}))

    def cluster_policy(self) -> Any:
        return self.cluster.get_json("clusterpolicies.nvidia.com", self.policy_name)

    def prepare_node(self, name: str | None = None, labels: Mapping[str, str] | None = None) -> str:
        """A Node as NFD and a kubelet would leave a GPU node, Ready, without the not-ready taint."""
        name = name or unique("fake-gpu-node")
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": name, "labels": {**GPU_NODE_LABELS, "kubernetes.io/hostname": name, **(labels or {})}}}
        (kubectl := self.cluster.kubectl)("create", "-f", "-", input=json.dumps(node))
        self.nodes.append(name)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        status = {"nodeInfo": {"containerRuntimeVersion": "containerd://2.1.4", "kernelVersion": "6.8.0-100-generic"},
                  "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": now,
                                  "lastTransitionTime": now, "message": "fake GPU node (no kubelet)"}]}
        kubectl("patch", "node", name, "--subresource=status", "--type=merge", "-p", json.dumps({"status": status}))
        # TaintNodesByCondition admission added node.kubernetes.io/not-ready:NoSchedule at creation.
        kubectl("patch", "node", name, "--type=merge", "-p", json.dumps({"spec": {"taints": None}}))
        return name

    def runtime_classes(self) -> dict[str, dict[str, Any]]:
        """The RuntimeClasses owned by a ClusterPolicy, by name."""
        items = self.cluster.get_json("runtimeclasses.node.k8s.io")["items"]
        return {rc["metadata"]["name"]: rc for rc in items
                if any(o["kind"] == "ClusterPolicy" for o in rc["metadata"].get("ownerReferences", []))}

    def daemonsets(self) -> dict[str, dict[str, Any]]:
        return {ds["metadata"]["name"]: ds for ds in self.cluster.get_json("daemonsets", "-n", self.namespace)["items"]}

    def pods_of(self, daemonset: Mapping[str, Any]) -> list[dict[str, Any]]:
        uid = daemonset["metadata"]["uid"]
        return [p for p in self.cluster.get_json("pods", "-n", self.namespace)["items"]
                if any(o["uid"] == uid for o in p["metadata"].get("ownerReferences", []))]

    def validation_pod(self, component: str, node: str, resource: str = "nvidia.com/gpu") -> dict[str, Any]:
        """The validator's `component` (cuda | plugin) workload pod on `node` (operator_manifests.validation_pod)."""
        return validation_pod(self.daemonsets()["nvidia-operator-validator"], unpack(self.source)[1], self.namespace,
                              component, node, resource)

    def failed_creates(self, daemonset: str | None = None) -> list[FailedCreate]:
        """FailedCreate events of the namespace's DaemonSets (of one, if named), oldest first."""
        selector = "reason=FailedCreate,involvedObject.kind=DaemonSet"
        if daemonset:
            selector += f",involvedObject.name={daemonset}"
        items = self.cluster.get_json("events", "-n", self.namespace, f"--field-selector={selector}")["items"]
        items.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
        return [FailedCreate(e["involvedObject"]["name"], e.get("message", ""), e.get("count") or 1) for e in items]

    def wait_runtime_classes(self, present: bool = True, names: Sequence[str] = RUNTIME_CLASSES,
                             timeout: float = 60) -> dict[str, dict[str, Any]]:
        def probe() -> dict[str, dict[str, Any]] | None:
            found = self.runtime_classes()
            return found if (set(names) <= set(found) if present else not set(names) & set(found)) else None
        return self._wait(f"RuntimeClasses {list(names)} {'present' if present else 'absent'}", probe, timeout)

    def wait_daemonsets(self, names: Sequence[str], timeout: float = 60,
                        check: Callable[[dict[str, Any]], bool] = lambda ds: True) -> dict[str, dict[str, Any]]:
        """The named DaemonSets once each exists and passes `check` (e.g. a template the operator rewrote)."""
        def probe() -> dict[str, dict[str, Any]] | None:
            found = self.daemonsets()
            return found if all(n in found and check(found[n]) for n in names) else None
        return self._wait(f"DaemonSets {list(names)}", probe, timeout)

    def wait_pods_created(self, names: Sequence[str], timeout: float = 60) -> dict[str, list[dict[str, Any]]]:
        """Each named DaemonSet's pods once there is one of its current template per node it wants (a rolling
        update done); on timeout the error lists the FailedCreate events (where admission denials show)."""
        def probe() -> dict[str, list[dict[str, Any]]] | None:
            found, pods = self.daemonsets(), {}
            for name in names:
                ds = found.get(name)
                if not ds or ds["status"].get("observedGeneration") != ds["metadata"]["generation"]:
                    return None
                status = ds["status"]
                want, current = status.get("desiredNumberScheduled", 0), status.get("updatedNumberScheduled", 0)
                pods[name] = [p for p in self.pods_of(ds) if not p["metadata"].get("deletionTimestamp")]
                if want < 1 or current != want or len(pods[name]) != want:
                    return None
            return pods
        try:
            return wait_for(f"pods of DaemonSets {list(names)}", probe, timeout)
        except GpuOperatorError as exc:
            denials = "\n".join(f"  {e.daemonset} (x{e.count}): {e.message}" for e in self.failed_creates())
            raise GpuOperatorError(f"{exc}\nFailedCreate events:\n{denials or '  none'}") from None

    def _wait(self, what: str, probe: Callable[[], T | None], timeout: float) -> T:
        def alive_probe() -> T | None:
            self._running()
            return probe()
        try:
            return wait_for(what, alive_probe, timeout)
        except GpuOperatorError as exc:
            raise GpuOperatorError(f"{exc}\noperator log (tail):\n{self.log()[-2000:]}") from None
