"""`kubectl gpu-stack inspect --usage / --idle` end to end: the 4-node test cluster (whole GPUs, MIG, time-
sliced, MPS) and a node whose GPUs come from a DRA ResourceSlice with an allocated ResourceClaim, in a real API
server; a real Prometheus (Debian's package) scraping every second a stand-in dcgm-exporter whose series are
generated from the fields the chart's dcgm-exporter exports and labelled as dcgm-exporter labels them
(gpu_stack_dev.dcgm_fixture, --kubernetes-virtual-gpus and --kubernetes-enable-dra on)."""

from __future__ import annotations

import copy
import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from gpu_stack_dev import netns
from gpu_stack_dev.dcgm_fixture import Device, PodUse, chart_fields, exposition
from gpu_stack_dev.e2e.e2elib import E2ECluster
from gpu_stack_dev.inspect_cluster import NODES, PODS, chart_configmap, pod, render_chart
from gpu_stack_dev.prometheus_server import Exporter, PrometheusServer, free_port
from kubernetes import client

from .inspect_api import (
    api_client,
    apply_configmap,
    create_all,
    create_objects,
    create_pod,
    delete_objects,
    ensure_namespaces,
    inspect,
    service_account_kubeconfig,
)

pytestmark = pytest.mark.e2e
P = "usage-"  # node name prefix
# The cluster's namespaces, prefixed too: the inspect e2e module's pods may still be there
ML, SERVING, VISION = "usage-ml", "usage-serving", "usage-vision"
LABEL = {"gpu-stack.io/e2e": "inspect-usage"}
SELECTOR = "gpu-stack.io/e2e=inspect-usage"
CONFIGMAP_NAMESPACE = "inspect-usage-e2e"
WINDOW = 20  # seconds of samples the Prometheus holds before the command runs (--since 20s)
DRA_NODE = f"{P}gpu-dra"
PROMETHEUS_IP = "192.0.2.10"
DRA_LABELS = {"dra_claim_name": "trainer-gpu", "dra_claim_namespace": ML, "dra_driver_name": "gpu.nvidia.com",
              "dra_pool_name": DRA_NODE, "dra_device_name": "gpu-1"}


def _renamed() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    nodes = copy.deepcopy(NODES)
    for node in nodes:
        node["metadata"]["name"] = P + node["metadata"]["name"]
    pods = copy.deepcopy(PODS)
    for p in pods:  # nodes and namespaces of their own: the inspect e2e module's pods may still be there
        p["spec"]["nodeName"] = P + p["spec"]["nodeName"]
        p["metadata"]["namespace"] = "usage-" + p["metadata"]["namespace"]
    # A pod that holds a GPU but has no series (dcgm-exporter has not mapped it yet)
    pods.append(pod(ML, "just-started", f"{P}gpu-a100-exclusive",
                    [{"name": "main", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]))
    dra_node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": DRA_NODE, "labels": {}},
                "status": {"capacity": {"cpu": "8"}, "allocatable": {"cpu": "8"}}}
    dra_pod = pod(ML, "dra-trainer", DRA_NODE, [{"name": "train", "image": "busybox"}])
    return [*nodes, dra_node], [*pods, dra_pod]


def devices() -> list[Device]:
    a100, t4, l4 = "NVIDIA A100-SXM4-40GB", "Tesla T4", "NVIDIA L4"
    return [
        Device(f"{P}gpu-a100-exclusive", 0, a100, 2, 1200, [PodUse(ML, "train-bert", "trainer")]),
        Device(f"{P}gpu-a100-exclusive", 1, a100, 0, 0),
        Device(f"{P}gpu-t4-timesliced", 0, t4, 60, 4000,
               [PodUse(ML, "notebook-1", "jupyter", 55, 3000, "0"), PodUse(ML, "notebook-2", "jupyter", 1, 900,
                                                                              "1")], shared=True),
        Device(f"{P}gpu-t4-timesliced", 1, t4, 3, 300,
               [PodUse(VISION, "detector", "infer", 1, 100, "0"), PodUse(VISION, "detector", "tracker", 2, 200,
                                                                            "1")], shared=True),
        Device(f"{P}gpu-l4-mps", 0, l4, 32, 9000,
               [PodUse(SERVING, f"llm-{i}", "server", u, 3000, str(i)) for i, u in enumerate((30, 0, 2))],
               shared=True),
        Device(f"{P}gpu-a100-mig", 0, a100, 50, 2000, [PodUse(ML, "mig-small", "main")], mig_profile="1g.5gb",
               mig_instance=7),
        Device(f"{P}gpu-a100-mig", 0, a100, 1, 500, [PodUse(VISION, "mig-medium", "main")],
               mig_profile="3g.20gb", mig_instance=2),
        Device(DRA_NODE, 1, a100, 0.5, 100, [PodUse(ML, "dra-trainer", "train", dra=DRA_LABELS)]),
    ]


def _dra(api: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(api)
    custom.create_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{DRA_NODE}-gpu"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": DRA_NODE,
                 "pool": {"name": DRA_NODE, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}}} for i in range(2)]}})
    claim = custom.create_namespaced_custom_object("resource.k8s.io", "v1", ML, "resourceclaims", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "trainer-gpu"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}})
    uid = client.CoreV1Api(api).read_namespaced_pod("dra-trainer", ML).metadata.uid
    # What the scheduler writes when it allocates the device and reserves the claim for the pod
    claim["status"] = {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": DRA_NODE, "device": "gpu-1"}]}},
        "reservedFor": [{"resource": "pods", "name": "dra-trainer", "uid": uid}]}
    custom.replace_namespaced_custom_object_status("resource.k8s.io", "v1", ML, "resourceclaims", "trainer-gpu",
                                                   claim)


@dataclass(frozen=True)
class Plane:
    kubeconfig: Path
    prometheus: str

    @property
    def port(self) -> int:
        return int(self.prometheus.rsplit(":", 1)[1])


@pytest.fixture(scope="module")
def plane(cluster: E2ECluster) -> Iterator[Plane]:
    kubeconfig = Path(cluster.kubeconfig)
    api = api_client(kubeconfig)
    configmap = chart_configmap()
    configmap["metadata"]["namespace"] = CONFIGMAP_NAMESPACE
    apply_configmap(api, configmap)
    nodes, pods = _renamed()
    create_all(api, nodes, pods, LABEL)
    _dra(api)
    text = exposition(devices(), chart_fields(), virtual_gpus=True)
    exporter = Exporter(lambda: text)
    # The API server proxies only to addresses that are not loopback: Prometheus listens on one of the
    # documentation range (TEST-NET-1) put on this run's own network namespace's lo (hack/netns.py).
    if not netns.inside():
        pytest.fail("run under hack/netns.py: the test adds an address to its network namespace")
    subprocess.run(["ip", "addr", "replace", f"{PROMETHEUS_IP}/32", "dev", "lo"], check=True)
    try:
        with PrometheusServer([exporter.target], host=PROMETHEUS_IP) as prometheus:
            prometheus.wait_for_history("DCGM_FI_DEV_FB_USED", WINDOW, series=len(devices()))
            yield Plane(kubeconfig, prometheus.url)
    finally:
        exporter.close()
        client.CustomObjectsApi(api).delete_namespaced_custom_object("resource.k8s.io", "v1", ML, "resourceclaims",
                                                                     "trainer-gpu")
        client.CustomObjectsApi(api).delete_cluster_custom_object("resource.k8s.io", "v1", "resourceslices",
                                                                  f"{DRA_NODE}-gpu")
        cluster.kubectl("delete", "nodes", "-l", SELECTOR, "--wait=false", check=False)
        # No kubelet ends these pods: gone at once, so later modules that count the cluster's pods do not see them.
        for namespace in sorted({p["metadata"]["namespace"] for p in _renamed()[1]}):
            cluster.kubectl("delete", "pods", "--all", "-n", namespace, "--force", "--grace-period=0", check=False)


ARGS = ("-l", SELECTOR, "--configmap-namespace", CONFIGMAP_NAMESPACE, "--since", f"{WINDOW}s")


def test_usage_of_every_kind_of_holder(plane: Plane) -> None:
    result = inspect(*ARGS, "--usage", "--idle", "--prometheus", plane.prometheus, "-o", "json",
                     kubeconfig=plane.kubeconfig)
    assert result.returncode == 6, result.stderr  # usage-ml/just-started has no series
    doc = json.loads(result.stdout)
    assert len(doc["nodes"]) == 5  # the allocation report is all there
    usage = doc["usage"]
    assert (usage["status"], usage["window"], usage["queries"]) == ("partial", f"{WINDOW}s", 4)
    rows = {(h["namespace"], h["name"], h["resource"]): (
        h["sharing"], h["gpus"], h["figures"], h["utilizationMetric"],
        h["utilizationPercent"] and round(h["utilizationPercent"]["mean"], 1),
        h["memoryUsedMiB"] and round(h["memoryUsedMiB"]["mean"])) for h in usage["holders"]}
    util, engine = "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
    assert rows == {
        (ML, "train-bert", "nvidia.com/gpu"): ("whole", 1.0, "per-pod", util, 2.0, 1200),
        (ML, "just-started", "nvidia.com/gpu"): ("whole", 1.0, "none", None, None, None),
        (ML, "notebook-1", "nvidia.com/gpu"): ("time-slicing", 0.25, "per-pod", util, 55.0, 3000),
        (ML, "notebook-2", "nvidia.com/gpu"): ("time-slicing", 0.25, "per-pod", util, 1.0, 900),
        # two containers, two replicas: both per-process series are the pod's
        (VISION, "detector", "nvidia.com/gpu"): ("time-slicing", 0.5, "per-pod", util, 1.5, 300),
        (SERVING, "llm-0", "nvidia.com/gpu"): ("mps", 0.1, "per-pod", util, 30.0, 3000),
        (SERVING, "llm-1", "nvidia.com/gpu"): ("mps", 0.1, "per-pod", util, 0.0, 3000),
        (SERVING, "llm-2", "nvidia.com/gpu"): ("mps", 0.1, "per-pod", util, 2.0, 3000),
        (ML, "mig-small", "nvidia.com/mig-1g.5gb"): ("mig", 0.1429, "per-pod", engine, 50.0, 2000),
        (VISION, "mig-medium", "nvidia.com/mig-3g.20gb"): ("mig", 0.4286, "per-pod", engine, 1.0, 500),
        (ML, "dra-trainer", "gpu.nvidia.com/gpu-1"): ("dra", 1.0, "per-pod", util, 0.5, 100),
    }
    idle = [(h["namespace"], h["name"]) for h in usage["idle"]["holders"]]
    # most GPU-hours first: GPUs held x the window (every series covers all of it)
    assert idle == [(ML, "dra-trainer"), (ML, "train-bert"), (VISION, "detector"), (VISION, "mig-medium"),
                    (ML, "notebook-2"), (SERVING, "llm-1"), (SERVING, "llm-2")]
    assert usage["idle"]["holders"][0]["idleGpuHours"] == round(WINDOW / 3600, 4)
    assert usage["notes"] == ["no usage series for 1 holder pod in the last 20s (usage-ml/just-started): started "
                              "within the window, or not mapped by dcgm-exporter"]


def test_table_keeps_the_allocations_and_adds_usage(plane: Plane) -> None:
    result = inspect(*ARGS, "-n", SERVING, "--usage", "--idle", "--prometheus", plane.prometheus,
                     kubeconfig=plane.kubeconfig)
    assert (result.returncode, result.stderr) == (0, "")
    lines = result.stdout.splitlines()
    assert "  usage-serving/llm-0   server      nvidia.com/gpu   1" in lines  # the allocation table
    usage = lines.index(f"usage over the last {WINDOW}s, Prometheus at {plane.prometheus}")
    assert lines[usage + 1].split() == ["POD", "NODE", "RESOURCE", "SHARING", "GPUS", "UTIL%", "AVG", "UTIL%", "MAX",
                                        "FB", "MiB", "AVG", "FB", "MiB", "MAX", "FIGURES"]
    assert [line.split() for line in lines[usage + 2:usage + 5]] == [
        [f"{SERVING}/llm-0", f"{P}gpu-l4-mps", "nvidia.com/gpu", "mps", "0.1", "30", "30", "3000", "3000",
         "per", "pod"],
        [f"{SERVING}/llm-1", f"{P}gpu-l4-mps", "nvidia.com/gpu", "mps", "0.1", "0", "0", "3000", "3000",
         "per", "pod"],
        [f"{SERVING}/llm-2", f"{P}gpu-l4-mps", "nvidia.com/gpu", "mps", "0.1", "2", "2", "3000", "3000",
         "per", "pod"]]
    assert f"idle GPU holders, under 5% GPU utilisation for the last {WINDOW}s, most GPU-hours first" in lines
    assert lines[-1].endswith(f"3 pods in namespace {SERVING} holding GPU resources")


def test_unreachable_prometheus_keeps_the_table(plane: Plane) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = inspect(*ARGS, "--usage", "--prometheus", url, kubeconfig=plane.kubeconfig)
    assert result.returncode == 3
    table = [line.split() for line in result.stdout.splitlines()]
    assert [f"{ML}/train-bert", "trainer", "nvidia.com/gpu", "1"] in table
    assert f"usage over the last {WINDOW}s, Prometheus at {url}: not shown: cannot reach Prometheus at {url}: " \
        in result.stdout
    assert result.stderr.startswith(f"error: cannot reach Prometheus at {url}: ")


def test_bad_since_is_a_usage_error(plane: Plane) -> None:
    result = inspect(*ARGS[:-2], "--usage", "--since", "soon", "--prometheus", plane.prometheus,
                     kubeconfig=plane.kubeconfig)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == "error: not a duration: 'soon' (e.g. 30m, 2h, 90s)\n"


def _service(api: client.ApiClient, namespace: str, name: str, port: int | None) -> None:
    """A Service without selector in front of the Prometheus, as prometheus-operator's prometheus-operated is
    in front of its pods, and its Endpoints (no address when `port` is None). The API server proxies only to an
    endpoint whose targetRef is a pod with that IP (pkg/registry/core/service/storage ResourceLocation,
    isValidAddress): a Pod stands for the Prometheus process, its status as a kubelet would write it."""
    ensure_namespaces(api, [namespace])
    core = client.CoreV1Api(api)
    core.create_namespaced_service(namespace, {"metadata": {"name": name}, "spec": {
        "ports": [{"name": "web", "port": 9090, "targetPort": "web"}]}})
    if port is None:
        core.create_namespaced_endpoints(namespace, {"metadata": {"name": name}, "subsets": []})
        return
    create_pod(api, pod(namespace, f"{name}-0", DRA_NODE, [{"name": "prometheus", "image": "prometheus"}]))
    core.patch_namespaced_pod_status(f"{name}-0", namespace, {"status": {
        "phase": "Running", "podIP": PROMETHEUS_IP, "podIPs": [{"ip": PROMETHEUS_IP}]}})
    core.create_namespaced_endpoints(namespace, {"metadata": {"name": name}, "subsets": [
        {"addresses": [{"ip": PROMETHEUS_IP, "targetRef": {"kind": "Pod", "namespace": namespace,
                                                          "name": f"{name}-0"}}],
         "ports": [{"name": "web", "port": port}]}]})


@pytest.fixture(scope="module")
def services(plane: Plane) -> Iterator[None]:
    api = api_client(plane.kubeconfig)
    _service(api, "monitoring", "prometheus-operated", plane.port)
    _service(api, "monitoring", "no-pods", None)
    yield
    # The pod standing for Prometheus is bound and Running: no kubelet ends it, so it goes at once.
    client.CoreV1Api(api).delete_collection_namespaced_pod("monitoring", grace_period_seconds=0)
    client.CoreV1Api(api).delete_namespace("monitoring")


def test_the_default_path_is_the_api_server_proxy_to_prometheus_operated(plane: Plane, services: None) -> None:
    proxied = inspect(*ARGS, "--usage", "-o", "json", kubeconfig=plane.kubeconfig)
    direct = inspect(*ARGS, "--usage", "-o", "json", "--prometheus", plane.prometheus, kubeconfig=plane.kubeconfig)
    assert (proxied.returncode, direct.returncode) == (6, 6), proxied.stderr
    via, straight = json.loads(proxied.stdout)["usage"], json.loads(direct.stdout)["usage"]
    assert via["prometheus"] == "service monitoring/prometheus-operated:9090 (through the API server's proxy)"
    figures = ("namespace", "name", "resource", "figures", "utilizationMetric")
    assert [[h[k] for k in figures] for h in via["holders"]] == [[h[k] for k in figures] for h in straight["holders"]]


def test_a_service_without_pods_is_unreachable(plane: Plane, services: None) -> None:
    result = inspect(*ARGS, "--usage", "--prometheus-service", "monitoring/no-pods:9090", kubeconfig=plane.kubeconfig)
    assert result.returncode == 3
    assert result.stderr.startswith("error: cannot reach Prometheus at service monitoring/no-pods:9090 (through the "
                                    "API server's proxy): HTTP 503: ")


@pytest.mark.parametrize("grant", [False, True], ids=["chart-default", "prometheusService"])
def test_the_chart_inspect_rbac_proxies_to_prometheus_only_when_named(plane: Plane, services: None, tmp_path: Path,
                                                                      grant: bool) -> None:
    # The chart's inspect ClusterRole and Role let the user read the cluster, not proxy to a Service, unless
    # inspect.rbac.prometheusService names it.
    api = api_client(plane.kubeconfig)
    user = service_account_kubeconfig(api, plane.kubeconfig, CONFIGMAP_NAMESPACE, "usage-viewer", tmp_path / "sa")
    subject = {"kind": "ServiceAccount", "name": "usage-viewer", "namespace": CONFIGMAP_NAMESPACE}
    templates = ["clusterrole", "clusterrolebinding", "role", "rolebinding"]
    values = ["--set-json", f"inspect.rbac.subjects={json.dumps([subject])}"]
    if grant:
        templates += ["prometheus-role", "prometheus-rolebinding"]
        values += ["--set", "inspect.rbac.prometheusService=monitoring/prometheus-operated:9090"]
    shown = [arg for t in templates for arg in ("--show-only", f"templates/inspect/{t}.yaml")]
    objects = render_chart([*values, *shown], namespace=CONFIGMAP_NAMESPACE)
    create_objects(api, objects)
    try:
        for _ in range(50):  # RBAC changes reach the authorizer's cache within moments
            result = inspect(*ARGS, "--usage", "-o", "json", kubeconfig=user)
            if result.returncode not in ((1, 4) if grant else (1,)):
                break
            time.sleep(0.2)
    finally:
        delete_objects(api, objects)
    if grant:  # as the admin's own default path: figures, and a holder without series (exit 6)
        assert result.returncode == 6, result.stderr
        admin = json.loads(inspect(*ARGS, "--usage", "-o", "json", kubeconfig=plane.kubeconfig).stdout)["usage"]
        figures = ("namespace", "name", "resource", "figures")
        assert [[h[k] for k in figures] for h in json.loads(result.stdout)["usage"]["holders"]] == \
            [[h[k] for k in figures] for h in admin["holders"]]
        return
    assert result.returncode == 4, result.stderr
    assert result.stderr.startswith("error: Prometheus at service monitoring/prometheus-operated:9090 (through the API "
                                    "server's proxy) refused the request (403 Forbidden): ")
    assert result.stderr.endswith("; proxying needs `get` on services/proxy for monitoring/prometheus-operated\n")


DOCS = Path(__file__).resolve().parents[2] / "docs" / "inspect.md"
DOC_COMMAND = "$ kubectl gpu-stack inspect -n usage-serving --usage --idle --since 20s"


def _documented_tail() -> str:
    """The lines docs/inspect.md shows after DOC_COMMAND's `...` (the allocation table is left out there)."""
    lines = DOCS.read_text().splitlines()
    start = lines.index(DOC_COMMAND)
    assert lines[start + 1] == "..."
    end = lines.index("```", start)
    return "\n".join(lines[start + 2:end]) + "\n"


def test_the_docs_show_this_output(plane: Plane, services: None) -> None:
    result = inspect(*ARGS, "-n", SERVING, "--usage", "--idle", kubeconfig=plane.kubeconfig)
    assert (result.returncode, result.stderr) == (0, "")
    tail = result.stdout[result.stdout.index("usage over the last"):]
    assert tail == _documented_tail(), tail
