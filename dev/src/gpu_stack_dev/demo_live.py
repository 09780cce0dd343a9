"""`make demo` against a real control plane: the chart installed with Helm, the webhook called by the API
server, real `kubectl apply` of hack/demo/manifests.

Reuses the end-to-end building blocks (gpu_stack_dev.e2e.e2elib: E2ECluster, Releases, LiveWebhook) and
gpu_stack_dev.controlplane; this module only decides what to show. `run(cluster)` installs the release
`gpu-stack-demo` with Chart-values-examples/per-node-configs.yaml (exclusive, time-slicing, MPS and MIG
configs side by side, so every manifest meets the config it names), serves `gpu-stack-webhook serve` on
loopback with the release's webhook configurations re-pointed at it, applies every manifest into a
fresh namespace, reads the admitted objects back, and removes everything again.
"""

from __future__ import annotations

import collections
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from gpu_stack_dev import controlplane
from gpu_stack_dev.e2e.e2elib import (
    FAKE_WEBHOOK_IMAGE,
    E2ECluster,
    LiveWebhook,
    Releases,
    unique,
)
from gpu_stack_dev.paths import ROOT

MANIFESTS = ROOT / "hack" / "demo" / "manifests"
OVERLAY = "per-node-configs.yaml"
RELEASE = "gpu-stack-demo"
# What the read-back shows: the mutating webhook's work as the API server stored it.
READ_BACK = (
    ("mps-nbody", "{.spec.hostIPC} {.spec.tolerations[?(@.key=='gpu-stack.io/mps')]}"),
    ("request-only", "{.spec.containers[0].resources}"),
)


def describe(cluster: controlplane.Cluster) -> str:
    if cluster.kind == "existing":
        return f"the existing cluster of KUBECONFIG={cluster.kubeconfig} (GPU_STACK_E2E_CLUSTER=existing)"
    return ("a throwaway control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) "
            f"on {cluster.server}")


def heading(text: str) -> None:
    print(f"\n\033[1m== {text}\033[0m" if sys.stdout.isatty() else f"\n== {text}", flush=True)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """The helpers print every command they run (a trail for failing tests); shown here only on failure."""
    trail = io.StringIO()
    try:
        with contextlib.redirect_stdout(trail):
            yield
    except BaseException:
        sys.stderr.write(trail.getvalue())
        raise


def kubectl(cluster: E2ECluster, *args: str) -> subprocess.CompletedProcess[str]:
    """Real kubectl, its output printed as a terminal shows it (warnings and errors on stderr come first)."""
    proc = subprocess.run([cluster.kubectl_bin, *args], capture_output=True, text=True, env=cluster.env,
                          timeout=120, check=False)
    for stream in (proc.stderr, proc.stdout):
        if stream.strip():
            print(stream.rstrip())
    return proc


def run(plane: controlplane.Cluster) -> int:
    with tempfile.TemporaryDirectory(prefix="gpu-stack-demo-") as tmp:
        cluster = E2ECluster.from_controlplane(plane, Path(tmp) / "helm-home")
        releases = Releases(cluster)
        hook: LiveWebhook | None = None
        try:
            # The image is only named: the API server calls `gpu-stack-webhook serve` on loopback below.
            heading(f"helm install {RELEASE} charts/gpu-stack -f Chart-values-examples/{OVERLAY} "
                    f"--set webhook.image.repository={FAKE_WEBHOOK_IMAGE}")
            with quiet():
                release, proc = releases.install(OVERLAY, name=RELEASE, namespace=unique(RELEASE))
            print(proc.stdout.split("\nNOTES:")[0].rstrip())
            with quiet():
                namespace = cluster.create_namespace(unique("gpu-demo"))
                releases.namespaces.append(namespace)
                hook = LiveWebhook(cluster, Path(tmp) / "webhook").start(release, probe_namespace=namespace)
            heading(f"gpu-stack-webhook serve on https://127.0.0.1:{hook.port}; the API server calls it "
                    f"(webhook configurations re-pointed there); namespace {namespace}")
            denied = admitted = 0
            for manifest in sorted(MANIFESTS.glob("*.yaml")):
                heading(f"kubectl apply -f {manifest.name}")
                print("\n".join(f"  {ln}" for ln in manifest.read_text().splitlines() if ln.startswith("# ")))
                proc = kubectl(cluster, "apply", "-n", namespace, "-f", os.path.relpath(manifest))
                denied += proc.returncode != 0
                admitted += proc.stdout.count(" created")
            heading("Read back from the API server: what the mutating webhook changed")
            for pod, jsonpath in READ_BACK:
                print(f"$ kubectl get pod {pod} -o jsonpath=\"{jsonpath}\"")
                kubectl(cluster, "get", "pod", pod, "-n", namespace, "-o", f"jsonpath={jsonpath}")
                print()
            with quiet():
                pods = json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout)["items"]
            creators = collections.Counter(p["metadata"].get("ownerReferences", [{"kind": "kubectl"}])[0]["kind"]
                                           for p in pods)
            print(f"{len(pods)} pods admitted in {namespace}, created by "
                  + ", ".join(f"{kind} ({n})" for kind, n in sorted(creators.items())))
            heading(f"{admitted} objects created, {denied} refused; removing the release, namespaces and webhook")
        finally:
            with quiet():
                if hook is not None and hook.process is not None and hook.process.poll() is None:
                    hook.process.send_signal(signal.SIGINT)  # gunicorn's quick shutdown: no keep-alive drain
                    hook.stop()
                releases.cleanup()
    return 0
