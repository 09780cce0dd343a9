"""RuntimeClasses declared non-GPU (webhook.policy.nonGpuRuntimeClassNames) on a real API server: a pod naming
one is not sent to the webhook for it (here the webhook has no endpoint, so a sent pod is refused as
unreachable); a pod naming an undeclared one is sent to /validate only, and one with a GPU request to both. The
chart's ValidatingAdmissionPolicy refuses a RuntimeClass of a declared name with an NVIDIA handler, and an install
over one that already exists stops with our message."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from gpu_stack_dev.e2e.e2elib import E2ECluster, Releases

from .test_match_conditions import GPU, dry_run, refused_by_our_webhook
from .test_prerequisites import assert_stopped_with

DECLARED = {"webhook.policy.nonGpuRuntimeClassNames": ["gvisor", "kata"]}
EXISTING_NVIDIA_GVISOR = (
    "gpu-stack: webhook.policy.nonGpuRuntimeClassNames names RuntimeClass gvisor, but its handler nvidia is the "
    "NVIDIA runtime (webhook.policy.nvidiaRuntimeHandlers), so pods naming it would get GPUs without the webhook "
    "seeing them; remove gvisor from webhook.policy.nonGpuRuntimeClassNames")
REFUSED_BY_POLICY = ("RuntimeClass gvisor is declared not to be the NVIDIA runtime (gpu-stack "
                     "webhook.policy.nonGpuRuntimeClassNames)")


def runtime_class(cluster: E2ECluster, name: str, handler: str) -> Any:
    obj = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": name}, "handler": handler}
    return cluster.kubectl("create", "-f", "-", input=json.dumps(obj), check=False)


def pod(name: str, runtime: str, **container: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"runtimeClassName": runtime, "containers": [{"name": "main", "image": "cuda", **container}]}}


@pytest.fixture
def runtime_classes(cluster: E2ECluster) -> Any:
    names = ["gvisor", "kata", "sandboxed"]
    cluster.kubectl("delete", "runtimeclass", *names, "--ignore-not-found")
    yield
    cluster.kubectl("delete", "runtimeclass", *names, "--ignore-not-found")


def test_declared_runtime_classes_are_not_sent_and_cannot_become_nvidia(cluster: E2ECluster, releases: Releases,
                                                                        runtime_classes: Any) -> None:
    assert runtime_class(cluster, "gvisor", "nvidia").returncode == 0
    release, proc = releases.install(set_json=DECLARED, check=False)
    assert_stopped_with(cluster, release, proc.returncode, proc.stderr, EXISTING_NVIDIA_GVISOR)
    releases.uninstall(release, check=False)
    cluster.kubectl("delete", "runtimeclass", "gvisor")

    releases.install(set_json=DECLARED)
    deadline = time.monotonic() + 60  # until the API server's policy informer has the new policy
    while (proc := runtime_class(cluster, "gvisor", "nvidia")).returncode == 0:
        assert time.monotonic() < deadline, "the RuntimeClass policy never refused gvisor with handler nvidia"
        cluster.kubectl("delete", "runtimeclass", "gvisor")
        time.sleep(1)
    assert REFUSED_BY_POLICY in proc.stderr and "its handler nvidia is the NVIDIA runtime" in proc.stderr, proc.stderr
    for name, handler in (("gvisor", "runsc"), ("kata", "kata"), ("sandboxed", "runsc")):
        created = runtime_class(cluster, name, handler)
        assert created.returncode == 0, created.stderr

    namespace = cluster.create_namespace()
    releases.namespaces.append(namespace)
    for name in ("gvisor", "kata"):
        admitted = dry_run(cluster, namespace, pod(f"on-{name}", name))
        assert admitted.returncode == 0, admitted.stderr
        assert refused_by_our_webhook(dry_run(cluster, namespace, pod(f"gpu-on-{name}", name, resources=GPU)))
    # An undeclared runtime class is sent to /validate only: no mutating rule changes a pod for its runtime class
    # alone. With a GPU it is sent to /mutate, which the API server calls first.
    sandboxed = dry_run(cluster, namespace, pod("on-sandboxed", "sandboxed"))
    assert refused_by_our_webhook(sandboxed) and '"validate.gpu-stack.io"' in sandboxed.stderr, sandboxed.stderr
    gpu = dry_run(cluster, namespace, pod("gpu-on-sandboxed", "sandboxed", resources=GPU))
    assert refused_by_our_webhook(gpu) and '"mutate.gpu-stack.io"' in gpu.stderr, gpu.stderr
