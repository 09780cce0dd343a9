"""The harness itself: a real API server answers, its controllers run, the live webhook is called."""

from __future__ import annotations

import json

from .e2elib import E2ECluster, Releases


def test_api_server_and_controllers(cluster: E2ECluster) -> None:
    version = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    if cluster.kind == "envtest":
        assert version["serverVersion"]["gitVersion"].startswith("v1.36.")
    namespace = cluster.create_namespace()
    cluster.kubectl("create", "deployment", "web", "--image=busybox", "-n", namespace)
    # The controller manager turns the Deployment into a ReplicaSet and a (Pending, nodeless) Pod.
    cluster.kubectl("wait", "--for=jsonpath={.status.replicas}=1", "deployment/web", "-n", namespace, "--timeout=60s")
    from kubernetes import client  # noqa: PLC0415

    pods = client.CoreV1Api(cluster.kubernetes).list_namespaced_pod(namespace).items
    assert [p.metadata.owner_references[0].kind for p in pods] == ["ReplicaSet"]
    assert cluster.helm("version", "--template", "{{ .Version }}").stdout.startswith("v4.")
    assert cluster.helm3("version", "--template", "{{ .Version }}").stdout.startswith("v3.")
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")


def test_live_webhook_denies_through_kubectl(cluster: E2ECluster, releases: Releases, live_webhook) -> None:
    release, _ = releases.install()
    namespace = cluster.create_namespace()
    hook = live_webhook(release, probe_namespace=namespace)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bad"},
           "spec": {"containers": [{"name": "main", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": 1}},
                                    "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]}}
    proc = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(pod), check=False)
    assert proc.returncode == 1
    # /mutate gave the GPU pod its runtime class (a warning), then /validate denied it.
    warning, error = proc.stderr.strip().splitlines()
    assert warning == "Warning: gpu-stack GPU008: set runtimeClassName nvidia: GPU pods run under the NVIDIA runtime"
    assert error.startswith('Error from server (Forbidden): error when creating "STDIN": admission webhook '
                            '"validate.gpu-stack.io" denied the request: GPU002 container "main" sets '
                            "NVIDIA_VISIBLE_DEVICES explicitly"), proc.stderr
    assert "GPU002" in hook.log()  # the decision log of the process the API server called
