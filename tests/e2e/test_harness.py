"""The harness itself: a real API server answers, its controllers run, the scheduler binds pods to the Nodes
a test publishes, the live webhook is called."""

from __future__ import annotations

import json

from gpu_stack_dev.e2e.e2elib import E2ECluster, Releases, unique
from gpu_stack_dev.e2e.fleet import delete_node, wait_scheduled


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


def test_the_scheduler_binds_to_a_published_node(cluster: E2ECluster) -> None:
    """A Node as a test publishes it (no kubelet): created, then capacity and Ready through the status
    subresource, and the not-ready taint the API server adds at creation removed. The scheduler binds a
    pod to it; an unsatisfiable request is reported in the pod's PodScheduled condition."""
    name = unique("harness-node")
    cluster.kubectl("create", "-f", "-", input=json.dumps(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}}))
    try:
        assert [t["key"] for t in cluster.get_json("node", name)["spec"].get("taints", [])] == [
            "node.kubernetes.io/not-ready"]
        status = {"capacity": {"cpu": "4", "memory": "8Gi", "pods": "10"},
                  "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "10"},
                  "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}
        cluster.kubectl("patch", "node", name, "--subresource=status", "--type=merge",
                        "-p", json.dumps({"status": status}))
        # The not-ready taint replaced by one only this test's pods tolerate (other tests' Pending pods stay off).
        isolate = {"key": "e2e.gpu-stack.io/harness", "value": name, "effect": "NoSchedule"}
        cluster.kubectl("patch", "node", name, "--type=merge", "-p", json.dumps({"spec": {"taints": [isolate]}}))
        namespace = cluster.create_namespace()
        for pod, cpu in (("fits", "1"), ("too-big", "5")):
            container = {"name": "main", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}
            cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(
                {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod},  # only this node (existing clusters)
                 "spec": {"nodeSelector": {"kubernetes.io/hostname": name}, "containers": [container],
                          "tolerations": [{**isolate, "operator": "Equal"}]}}))
        assert wait_scheduled(cluster, namespace, "fits") == ("True", "", name)
        status, message, _ = wait_scheduled(cluster, namespace, "too-big", want="False")
        assert status == "False" and "Insufficient cpu" in message, message
        cluster.kubectl("delete", "namespace", namespace, "--wait=false")
    finally:
        delete_node(cluster, name)


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
