"""Policy lookups against the real API (`serve --cluster-lookups` with the admin kubeconfig): the
ConfigMaps a pod imports with envFrom, and the Pod Security level of an MPS pod's namespace."""

from __future__ import annotations

import json

from .e2elib import E2ECluster, Releases


def pod(name: str, annotations: dict[str, str] | None = None, **spec: object) -> str:
    container = {"name": "main", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": 1}}}
    container.update(spec)
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": annotations or {}},
                       "spec": {"containers": [container]}})


def test_lookups_read_configmaps_and_pod_security(cluster: E2ECluster, releases: Releases, live_webhook) -> None:
    release, _ = releases.install("mps-x10.yaml")
    namespace = cluster.create_namespace()
    hook = live_webhook(release, lookups=True, probe_namespace=namespace)

    cluster.kubectl("create", "configmap", "gpu-env", "-n", namespace, "--from-literal=NVIDIA_VISIBLE_DEVICES=all")
    cluster.kubectl("create", "configmap", "plain-env", "-n", namespace, "--from-literal=MODE=fast")
    denied = cluster.kubectl("create", "-n", namespace, "-f", "-", check=False,
                             input=pod("imports-gpu-env", envFrom=[{"configMapRef": {"name": "gpu-env"}}]))
    assert denied.returncode == 1
    assert 'GPU002 container "main" imports ConfigMap "gpu-env" (envFrom, no prefix), which holds ' \
           "NVIDIA_VISIBLE_DEVICES" in denied.stderr, denied.stderr
    allowed = cluster.kubectl("create", "-n", namespace, "-f", "-",
                              input=pod("imports-plain-env", envFrom=[{"configMapRef": {"name": "plain-env"}}]))
    assert "envFrom" not in allowed.stderr  # read and found clean: no "must not hold" warning
    assert allowed.stdout == "pod/imports-plain-env created\n"

    baseline = cluster.create_namespace(labels={"pod-security.kubernetes.io/enforce": "baseline"})
    opt_in = pod("mps-in-baseline", {"gpu-stack.io/mps": "true"})
    mps = cluster.kubectl("create", "-n", baseline, "-f", "-", check=False, input=opt_in)
    assert mps.returncode == 1, hook.log()[-3000:]
    assert 'Pod Security "baseline" enforced in namespace ' + baseline in mps.stderr, mps.stderr
    assert "pod-security.kubernetes.io/enforce=" in mps.stderr
