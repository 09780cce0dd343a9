"""Scale benchmark of `kubectl gpu-stack inspect`: N GPU nodes and M pods created through a real API
server, then the command timed (wall clock of the whole process, and the API part it reports with -v)
and its request count taken from its own -v line.

    .venv/bin/python bench/inspect_scale.py --kubeconfig K [--nodes 500 --pods 20000] [--report]

`make bench-inspect` runs it on a throwaway control plane (hack/controlplane.py) and passes --report,
which writes bench/inspect-scale.md (appended to BENCHMARKS.md by every `make bench`) and replaces the
same section in BENCHMARKS.md now. tests/e2e/test_inspect_scale.py runs `populate` and asserts the output.

Cluster shape: nodes cycle through the four kinds of gpu_stack_dev.inspect_cluster (exclusive A100 x2,
time-sliced T4 x2 (x4), MPS L4 (x10), MIG mixed A100 all-balanced). Every node gets pods/nodes pods: two
that hold one GPU resource each, one Succeeded pod that held one (filtered out by the server), the rest
CPU-only; spread over 20 namespaces. Objects are POSTed by a thread pool as pre-built JSON.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import re
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_stack_dev import inspect_cluster
from gpu_stack_dev.bench import provenance
from gpu_stack_dev.bench import report as report_writer
from gpu_stack_dev.paths import ROOT

BIN = Path(sys.executable).parent
LABEL_KEY, LABEL_VALUE = "gpu-stack.io/e2e", "scale"
SELECTOR = f"{LABEL_KEY}={LABEL_VALUE}"
NAMESPACES = [f"scale-{i:02d}" for i in range(20)]
KINDS = inspect_cluster.NODES[:4]  # exclusive, time-sliced, MPS, MIG
HOLDS = {  # per node kind: the two resources its GPU pods request
    0: ("nvidia.com/gpu", "nvidia.com/gpu"),
    1: ("nvidia.com/gpu", "nvidia.com/gpu"),
    2: ("nvidia.com/gpu", "nvidia.com/gpu"),
    3: ("nvidia.com/mig-1g.5gb", "nvidia.com/mig-2g.10gb"),
}
REPORT = ROOT / "bench" / "inspect-scale.md"
BENCHMARKS = ROOT / "BENCHMARKS.md"
BEGIN, END = "<!-- inspect-scale:begin (bench/inspect_scale.py --report) -->", "<!-- inspect-scale:end -->"


def expected_summary(nodes: int) -> str:
    """The summary line inspect must print for `nodes` (a multiple of 4) scale nodes."""
    per_kind = nodes // 4
    gpu_alloc = per_kind * (2 + 8 + 10)
    gpu_req = per_kind * 3 * 2
    return (f"{nodes} GPU nodes, {per_kind * 6} GPUs; free: nvidia.com/gpu {gpu_alloc - gpu_req}/{gpu_alloc}, "
            f"nvidia.com/mig-1g.5gb {per_kind}/{per_kind * 2}, nvidia.com/mig-2g.10gb 0/{per_kind}, "
            f"nvidia.com/mig-3g.20gb {per_kind}/{per_kind}; {nodes * 2} pods holding GPU resources")


def scale_nodes(count: int) -> Iterator[dict[str, Any]]:
    for i in range(count):
        node = copy.deepcopy(KINDS[i % 4])
        node["metadata"]["name"] = f"scale-{i:04d}-{node['metadata']['name']}"
        node["metadata"]["labels"]["kubernetes.io/hostname"] = node["metadata"]["name"]
        node["metadata"]["labels"][LABEL_KEY] = LABEL_VALUE
        yield node


def scale_pods(nodes: list[dict[str, Any]], count: int) -> Iterator[tuple[dict[str, Any], str | None]]:
    """(pod, phase to set afterwards or None)."""
    per_node = count // len(nodes)
    assert per_node >= 3 and per_node * len(nodes) == count, "pods must be a multiple of nodes, >= 3 per node"
    for i, node in enumerate(nodes):
        name = node["metadata"]["name"]
        first, second = HOLDS[i % 4]
        for j in range(per_node):
            namespace = NAMESPACES[(i + j) % len(NAMESPACES)]
            gpus = {first: 1} if j in (0, 2) else {second: 1} if j == 1 else None
            pod = inspect_cluster.pod(namespace, f"{name}-{j:03d}", name, [inspect_cluster.container("main", gpus)])
            pod.pop("status")
            yield pod, "Succeeded" if j == 2 else None


@dataclass
class Populated:
    nodes: int
    pods: int
    requests: int
    seconds: float
    server: str = ""  # the API server's gitVersion
    load: tuple[float, float, float] = (0.0, 0.0, 0.0)  # os.getloadavg() before creating


def populate(kubeconfig: Path, nodes: int, pods: int, workers: int = 12,
             objects: tuple[list[dict[str, Any]], list[tuple[dict[str, Any], str | None]]] | None = None) -> Populated:
    """Create the scale cluster through the API with concurrent POSTs (raw JSON, no client models); `objects`:
    other nodes and (pod, phase) to create instead (bench/inspect_usage.py)."""
    from kubernetes import client, config  # noqa: PLC0415

    configuration = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)  # type: ignore[no-untyped-call]
    configuration.connection_pool_maxsize = workers
    api = client.ApiClient(configuration)
    # The client's urllib3 pool (TLS and credentials from the kubeconfig), fed pre-serialised JSON.
    http, host = api.rest_client.pool_manager, configuration.host
    headers = {"Accept": "application/json", **({"Authorization": configuration.api_key["authorization"]}
                                                if "authorization" in configuration.api_key else {})}
    requests = 0

    def call(method: str, path: str, body: dict[str, Any], content_type: str = "application/json") -> None:
        response = http.request(method, host + path, body=json.dumps(body).encode(),
                                headers={**headers, "Content-Type": content_type})
        if response.status >= 300 and response.status != 409:
            raise RuntimeError(f"{method} {path}: {response.status} {response.data[:300]!r}")

    load = os.getloadavg()
    started = time.perf_counter()
    for namespace in NAMESPACES:
        call("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
        call("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": "default"}})
    requests += 2 * len(NAMESPACES)
    node_objects = list(scale_nodes(nodes)) if objects is None else objects[0]
    pod_objects = list(scale_pods(node_objects, pods)) if objects is None else objects[1]

    def create_node(node: dict[str, Any]) -> None:
        status = node.pop("status")
        call("POST", "/api/v1/nodes", node)
        call("PATCH", f"/api/v1/nodes/{node['metadata']['name']}/status", {"status": status},
             "application/merge-patch+json")

    def create_pod(item: tuple[dict[str, Any], str | None]) -> None:
        pod, phase = item
        meta = pod["metadata"]
        call("POST", f"/api/v1/namespaces/{meta['namespace']}/pods", pod)
        if phase:
            call("PATCH", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
                 {"status": {"phase": phase}}, "application/merge-patch+json")

    with ThreadPoolExecutor(workers) as executor:
        list(executor.map(create_node, node_objects))
        list(executor.map(create_pod, pod_objects, chunksize=64))
    requests += 2 * nodes + pods + sum(1 for _, phase in pod_objects if phase)
    elapsed = time.perf_counter() - started
    version = json.loads(http.request("GET", host + "/version", headers=headers).data).get("gitVersion", "?")
    api.close()  # type: ignore[no-untyped-call]
    return Populated(nodes, pods, requests, elapsed, version, load)


@dataclass
class Run:
    wall: float  # the whole `kubectl-gpu_stack inspect` process
    cpu: float  # its CPU time (user + system), less sensitive to a busy machine than wall time
    api: float  # listing and reading, as the command reports it (-v)
    requests: int
    nodes: int
    pods: int
    stdout: str


VERBOSE = re.compile(r"read (\d+) nodes and (\d+) pods in (\d+) requests, ([\d.]+) s")


def run_inspect(kubeconfig: Path, *args: str) -> Run:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "NO_COLOR": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run([str(BIN / "kubectl-gpu_stack"), "inspect", "-v", *args], capture_output=True,
                          text=True, env=env, check=True, timeout=600)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    found = VERBOSE.search(proc.stderr)
    assert found, proc.stderr
    nodes, pods, requests, api = found.groups()
    return Run(wall, cpu, float(api), int(requests), int(nodes), int(pods), proc.stdout)


def report(populated: Populated, runs: list[Run], output_runs: dict[str, list[Run]]) -> str:
    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    lines = [
        BEGIN,
        "## `kubectl gpu-stack inspect` at scale (bench/inspect_scale.py)",
        "",
        provenance.stamp("make bench-inspect"),
        "",
        f"* Command: `make bench-inspect`; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"{os.cpu_count()} CPUs, Linux {platform.release()}, CPython {platform.python_version()}; "
        "API server, etcd, controller manager and the command on the same machine, shared with other work "
        f"(load average {populated.load[0]:.1f} before creating, {os.getloadavg()[0]:.1f} after the runs).",
        f"* Cluster: kube-apiserver {populated.server} (`make bench-inspect`: a throwaway control plane from "
        f"hack/controlplane.py, etcd 3.4); {populated.nodes} GPU nodes and "
        f"{populated.pods:,} pods created through the API in {populated.seconds:.1f} s "
        f"({populated.requests:,} requests, {populated.requests / populated.seconds:,.0f}/s, 12 concurrent POSTs).",
        f"* Listed by the command: {runs[0].nodes} nodes and {runs[0].pods:,} pods (bound, not finished: "
        "the server filters), pages of 500.",
        "",
        "| output | runs | requests | API time median (s) | whole process median (s) | min / max (s) "
        "| process CPU median (s) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, group in output_runs.items():
        walls = [r.wall for r in group]
        lines.append(f"| {name} | {len(group)} | {group[0].requests} | {median([r.api for r in group]):.2f} | "
                     f"{median(walls):.2f} | {min(walls):.2f} / {max(walls):.2f} | "
                     f"{median([r.cpu for r in group]):.2f} |")
    lines += ["", "API time: from the first request to the last page parsed (the command's -v line); whole "
              "process: also Python start-up, imports, the model and printing. Budget: 30 s for the whole "
              "process on this 2-CPU machine; tests/e2e/test_inspect_scale.py checks the output and that paging "
              "keeps the request count at pages, not objects (timings are not asserted).", END]
    return "\n".join(lines) + "\n"


def write_report(text: str) -> None:
    REPORT.write_text(text, encoding="utf-8")
    report_writer.write_section(BENCHMARKS, text, BEGIN, END)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubeconfig", type=Path, default=os.environ.get("KUBECONFIG"))
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--report", action="store_true", help="write bench/inspect-scale.md and BENCHMARKS.md")
    args = parser.parse_args(argv)
    if not args.kubeconfig:
        parser.error("--kubeconfig or KUBECONFIG is required")
    print(f"creating {args.nodes} nodes and {args.pods} pods ...", flush=True)
    populated = populate(args.kubeconfig, args.nodes, args.pods)
    print(f"created in {populated.seconds:.1f} s ({populated.requests} requests)", flush=True)
    outputs: dict[str, list[Run]] = {}
    for name, extra in (("table", ()), ("json", ("-o", "json"))):
        outputs[name] = [run_inspect(args.kubeconfig, "-l", SELECTOR, *extra) for _ in range(args.rounds)]
        print(f"{name}: " + ", ".join(f"{r.wall:.2f} s / {r.requests} requests" for r in outputs[name]), flush=True)
    summary = outputs["table"][0].stdout.rstrip("\n").rsplit("\n", 1)[-1]
    print(summary)
    if summary != expected_summary(args.nodes):
        print(f"unexpected summary, wanted: {expected_summary(args.nodes)}", file=sys.stderr)
        return 1
    text = report(populated, outputs["table"], outputs)
    print(text)
    if args.report:
        write_report(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
