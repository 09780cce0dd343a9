"""Pod startup on a real node, webhook on and off, side by side in one run.

    python hack/netns.py run -- .venv/bin/python bench/pod_startup.py [--pods 20 --rounds 3]
    (make bench runs it so, after make e2e-image)

A control plane and a real node (gpu_stack_dev.node: kubelet, containerd + gVisor) with the chart installed as the
node tests install it (gpu_stack_dev.e2e.node_install: per-node-configs, the image `make image` built), its two
webhook pods Ready. Per round and state, N pods without GPUs (busybox `sleep`, what most pods of a GPU
cluster are) are created at once, and each pod's time from its create call to the first time it is seen
Running is taken; then they are deleted. "on": the chart's two webhook configurations in place (their
matchConditions keep pods without GPUs from the webhook, so this measures what the API server pays for
them); "off": both configurations removed (the webhook pods keep running, so the node carries the same
load). The states alternate first place each round. Writes its section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpu_stack_dev import controlplane, netns, node
from gpu_stack_dev.bench import provenance, report
from gpu_stack_dev.e2e import e2elib
from gpu_stack_dev.e2e import node_install as install
from gpu_stack_dev.paths import ROOT

BEGIN = "<!-- pod-startup:begin (bench/pod_startup.py) -->"
END = "<!-- pod-startup:end -->"
ON, OFF = "on", "off"
POLL_SECONDS = 0.2


@dataclass
class StartupRun:
    round: int
    state: str
    seconds: list[float] = field(default_factory=list)  # per pod: create call to first seen Running
    total: float = 0.0  # first create to the last pod Running

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def p90(self) -> float:
        if len(self.seconds) == 1:
            return self.seconds[0]
        return statistics.quantiles(self.seconds, n=10, method="inclusive")[-1]


def ratio(runs: list[StartupRun], attr: str) -> list[float]:
    """on/off of `attr`, per round."""
    by = {(r.round, r.state): getattr(r, attr) for r in runs}
    return [by[(n, ON)] / by[(n, OFF)] for n in sorted({r.round for r in runs})]


def render(runs: list[StartupRun], *, pods: int, stamp: str, command: str, notes: list[str]) -> str:
    out = [BEGIN, "## Pod startup on a real node, webhook on / off", "", stamp, "",
           f"{pods} pods without GPUs created at once per round and state on one node (kubelet v1.36.2, "
           "containerd 1.6 + gVisor, 2 cores); per pod, the time from its create call to first seen Running "
           f"(polled every {POLL_SECONDS} s). On: the chart's webhook configurations in place; off: removed.", "",
           "| round | state | median s | p90 s | max s | all Running after s |", "|---|---|---|---|---|---|"]
    for run in runs:
        out.append(f"| {run.round} | {run.state} | {run.median:.2f} | {run.p90:.2f} | {max(run.seconds):.2f} | "
                   f"{run.total:.2f} |")
    medians, totals = ratio(runs, "median"), ratio(runs, "total")
    out += ["", "On / off per round: median " + ", ".join(f"{r:.2f}x" for r in medians)
            + "; all Running " + ", ".join(f"{r:.2f}x" for r in totals)
            + f" (median of rounds {statistics.median(medians):.2f}x and {statistics.median(totals):.2f}x)."]
    out += ["", *(f"* {n}" for n in notes), END]
    return "\n".join(out) + "\n"


def kubectl(cluster: e2elib.E2ECluster, *args: str, stdin: str | None = None) -> str:
    return cluster.kubectl(*args, input=stdin).stdout


def one_batch(cluster: e2elib.E2ECluster, namespace: str, run: StartupRun, pods: int, timeout: float) -> None:
    from kubernetes import client  # noqa: PLC0415

    api = client.CoreV1Api(cluster.kubernetes)
    created: dict[str, float] = {}
    lock = threading.Lock()

    def create(index: int) -> None:
        name = f"startup-{run.round}-{run.state}-{index}"
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                "spec": {"terminationGracePeriodSeconds": 0,
                         "containers": [{"name": "main", "image": node.BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                                         "command": ["sleep", "3600"]}]}}
        began = time.perf_counter()
        api.create_namespaced_pod(namespace, body, _preload_content=False)  # type: ignore[arg-type]
        with lock:
            created[name] = began

    first = time.perf_counter()
    threads = [threading.Thread(target=create, args=(i,)) for i in range(pods)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    running: dict[str, float] = {}
    while len(running) < pods:
        if time.perf_counter() - first > timeout:
            raise TimeoutError(f"{pods - len(running)} pods not Running after {timeout:.0f} s ({run.state})")
        listed = json.loads(api.list_namespaced_pod(namespace, _preload_content=False).data)  # type: ignore[attr-defined]
        seen = time.perf_counter()
        for pod in listed["items"]:
            name = pod["metadata"]["name"]
            if name in created and name not in running and pod["status"].get("phase") == "Running":
                running[name] = seen
        time.sleep(POLL_SECONDS)
    run.seconds = [running[n] - created[n] for n in created]
    run.total = max(running.values()) - first
    kubectl(cluster, "delete", "pods", "--all", "-n", namespace, "--grace-period=0", "--wait=true", "--timeout=300s")


def measure(cluster: e2elib.E2ECluster, pods: int, rounds: int, timeout: float) -> list[StartupRun]:
    releases = e2elib.Releases(cluster)
    try:
        release, _ = releases.install("per-node-configs.yaml", namespace="gpu-stack", webhook_image=None,
                                         set_json=install.install_values(), extra=["--wait", "--timeout", "5m"])
        configurations = {kind: kubectl(cluster, "get", kind, "-l", release.selector, "-o", "json")
                          for kind in e2elib.WEBHOOK_KINDS}
        namespace = cluster.create_namespace(e2elib.unique("startup"))
        runs = []
        for number in range(1, rounds + 1):
            for state in ((ON, OFF) if number % 2 else (OFF, ON)):
                for kind, listed in configurations.items():
                    if state == ON:
                        items = json.loads(listed)["items"]
                        for item in items:
                            for key in ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields"):
                                item["metadata"].pop(key, None)
                        kubectl(cluster, "apply", "--server-side", "--force-conflicts", "-f", "-",
                                stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
                    else:
                        kubectl(cluster, "delete", kind, "-l", release.selector, "--ignore-not-found")
                time.sleep(2)  # the API server's webhook configuration informers catch up
                run = StartupRun(number, state)
                one_batch(cluster, namespace, run, pods, timeout)
                runs.append(run)
                print(f"round {number} {state}: median {run.median:.2f} s, all Running after {run.total:.2f} s",
                      file=sys.stderr)
        return runs
    finally:
        releases.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md")
    parser.add_argument("--pods", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per batch before giving up")
    args = parser.parse_args(argv)
    if not netns.inside():
        parser.error("run inside namespaces of its own: python hack/netns.py run -- ... (make bench does)")
    given = argv if argv is not None else sys.argv[1:]
    command = "make bench" if not given else "bench/pod_startup.py " + " ".join(given)
    stamp = provenance.stamp(command)
    started = time.monotonic()
    assets = controlplane.resolve_assets(prepare=True)
    assert assets is not None
    with controlplane.ControlPlane(assets, node_ip=node.NODE_IP) as plane, node.Node(plane) as real, \
            tempfile.TemporaryDirectory(prefix="gpu-stack-startup-") as tmp:
        real.load_image(install.IMAGE_ARCHIVE)
        cluster = e2elib.E2ECluster.from_controlplane(plane, Path(tmp))
        runs = measure(cluster, args.pods, args.rounds, args.timeout)
    section = render(runs, pods=args.pods, stamp=stamp, command=command,
                     notes=[f"This part took {time.monotonic() - started:.0f} s."])
    report.write_section(args.out, section, BEGIN, END)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
