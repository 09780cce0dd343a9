"""Scale on a real scheduler: a fleet of GPU nodes published as the chart's agents
would (gpu_stack_dev.e2e.fleet, the `per-node-configs` overlay), then GPU pods written as README.md tells users
to write them, created through the `make e2e` API server with the webhook on (the chart's configurations
pointed at `gpu-stack-webhook serve` on loopback) and off (no configurations); the time from the first
create until every pod is bound or reported unschedulable by kube-scheduler, side by side in one run.

    KUBEBUILDER_ASSETS=... .venv/bin/python bench/scheduler_scale.py [--nodes 500 --pods 5000 --rounds 2]

Fleet (`fleet_specs`): the overlay's exclusive, time-slicing x4 and MPS x10 configs on 40/30/30% of the
nodes. Pods (`pod_at`): 60% a plain one-GPU pod, 30% the same with the MPS opt-in annotation, 10% pinned to
the time-sliced config with a nodeSelector on the device plugin config label. With the webhook off, MPS
pods get no toleration of the MPS taint and are reported unschedulable: the counts of bound and
unschedulable pods per state say so, beside the times. Writes its section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_stack_dev import controlplane
from gpu_stack_dev.bench import apiserver_calls as calls_
from gpu_stack_dev.bench import apiserver_plane, apiserver_webhooks, provenance, report
from gpu_stack_dev.e2e import apiload, e2elib, fleet
from gpu_stack_dev.paths import ROOT

OVERLAY = "per-node-configs.yaml"
BEGIN = "<!-- scheduler-scale:begin (bench/scheduler_scale.py) -->"
END = "<!-- scheduler-scale:end -->"
ON, OFF = calls_.ON, calls_.OFF
# Node kinds of the fleet, cycled: (device plugin config, GPU model, GPUs), of the overlay's configs.
KINDS = (("default", "NVIDIA-L4", 4), ("default", "NVIDIA-L4", 4),
         ("ts-x4", "Tesla-T4", 4), ("ts-x4", "Tesla-T4", 4), ("ts-x4", "Tesla-T4", 4),
         ("mps-x10", "NVIDIA-L4", 1), ("mps-x10", "NVIDIA-L4", 1), ("mps-x10", "NVIDIA-L4", 1),
         ("default", "NVIDIA-L4", 4), ("default", "NVIDIA-L4", 4))
CUDA_IMAGE = "nvcr.io/nvidia/cuda:12.9.1-base-ubuntu24.04"
MPS_ANNOTATION = "gpu-stack.io/mps"
POLL_SECONDS = 1.0


def fleet_specs(nodes: int) -> list[fleet.NodeSpec]:
    return [fleet.NodeSpec(name=f"gpu-{i:04d}", gpus=KINDS[i % len(KINDS)][2], model=KINDS[i % len(KINDS)][1],
                           config=KINDS[i % len(KINDS)][0]) for i in range(nodes)]


def pod_kind(index: int) -> str:
    """Evenly spread: of every 10 pods, 6 plain, 3 MPS, 1 pinned to the time-sliced config."""
    return ("plain", "mps", "plain", "plain", "mps", "plain", "pinned", "plain", "mps", "plain")[index % 10]


def pod_at(index: int, config_label: str) -> dict[str, Any]:
    """Pod number `index` as README.md shows: a limit on nvidia.com/gpu, plus the MPS opt-in annotation
    or a nodeSelector on the device plugin config label."""
    kind = pod_kind(index)
    metadata: dict[str, Any] = {"name": f"scale-{index:05d}", "labels": {"bench": "scheduler-scale"}}
    spec: dict[str, Any] = {"restartPolicy": "Never",
                            "containers": [{"name": "cuda", "image": CUDA_IMAGE, "command": ["sleep", "infinity"],
                                            "resources": {"limits": {fleet.FULL_GPU: 1}}}]}
    if kind == "mps":
        metadata["annotations"] = {MPS_ANNOTATION: "true"}
    elif kind == "pinned":
        spec["nodeSelector"] = {config_label: "ts-x4"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


@dataclass
class ScaleRun:
    round: int
    state: str  # ON or OFF
    pods: int
    created: int = 0
    create_seconds: float = 0.0  # first create to last create answered
    decided_seconds: float = 0.0  # first create to every created pod bound or unschedulable
    bound: int = 0
    unschedulable: int = 0
    reasons: dict[str, int] = field(default_factory=dict)  # unschedulable pods by the scheduler's message
    failures: dict[str, int] = field(default_factory=dict)  # creates refused, by message


def decided(pods: Sequence[Mapping[str, Any]]) -> tuple[int, int, dict[str, int]]:
    """(bound, unschedulable, unschedulable by message) of a pod list as the scheduler left it."""
    bound = unschedulable = 0
    reasons: dict[str, int] = {}
    for pod in pods:
        if pod["spec"].get("nodeName"):
            bound += 1
            continue
        for condition in pod.get("status", {}).get("conditions", []):
            if condition["type"] == "PodScheduled" and condition["status"] == "False":
                unschedulable += 1
                message = condition.get("message", "")
                reasons[message] = reasons.get(message, 0) + 1
    return bound, unschedulable, reasons


def ratios(runs: Sequence[ScaleRun]) -> list[float]:
    """decided_seconds(on) / decided_seconds(off) per round that measured both."""
    off = {r.round: r.decided_seconds for r in runs if r.state == OFF}
    return [r.decided_seconds / off[r.round] for r in sorted(runs, key=lambda r: r.round)
            if r.state == ON and off.get(r.round)]


def render(runs: Sequence[ScaleRun], *, nodes: int, stamp: str, command: str, concurrency: int,
           gpus: Mapping[str, int], notes: Sequence[str] = ()) -> str:
    pods = runs[0].pods if runs else 0
    kinds = {k: sum(pod_kind(i) == k for i in range(pods)) for k in ("plain", "mps", "pinned")}
    out = [BEGIN, "## Placement at scale on kube-scheduler", "",
           *([stamp, ""] if stamp else []),
           f"Generated by `{command}` (bench/scheduler_scale.py): the `make e2e` control plane (kube-apiserver, "
           f"kube-controller-manager and kube-scheduler v1.36) with the chart installed with `{OVERLAY}`; "
           f"{nodes} GPU nodes published as its agents would (gpu_stack_dev.e2e.fleet): "
           + ", ".join(f"{n} {resource}" for resource, n in sorted(gpus.items()))
           + f" advertised. {pods:,} pods per batch written as README.md shows: {kinds['plain']:,} asking for one "
           f"`nvidia.com/gpu`, {kinds['mps']:,} the same with `{MPS_ANNOTATION}: \"true\"`, {kinds['pinned']:,} "
           f"pinned to the `ts-x4` config with a nodeSelector; {concurrency} creates in flight. Time: from the "
           "first create until every created pod is bound or has `PodScheduled=False` (the API server's pod "
           f"list polled every {POLL_SECONDS:g} s). {ON}: the chart's configurations pointed at "
           f"`gpu-stack-webhook serve` on loopback; {OFF}. States alternate in mirrored order per round.", "",
           "| round | state | created | creates s | bound or unschedulable s | bound | unschedulable | "
           "creates refused |", "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for run in sorted(runs, key=lambda r: (r.round, r.state != OFF)):
        out.append(f"| {run.round} | {run.state} | {run.created:,} | {run.create_seconds:.1f} | "
                   f"{run.decided_seconds:.1f} | {run.bound:,} | {run.unschedulable:,} | "
                   f"{sum(run.failures.values())} |")
    found = ratios(runs)
    out += ["", "Time until every pod is bound or unschedulable, webhook on / off, per round: "
            + (", ".join(f"{r:.2f}x" for r in found) + f" (median {statistics.median(found):.2f}x)." if found
               else "no round measured both.")]
    for state in (OFF, ON):
        reasons: dict[str, int] = {}
        for run in runs:
            if run.state == state:
                for message, n in run.reasons.items():
                    reasons[message] = reasons.get(message, 0) + n
        if reasons:
            top = sorted(reasons.items(), key=lambda kv: -kv[1])[:3]
            out += ["", f"Why pods were unschedulable, {state} (all rounds; the scheduler's message):", "",
                    *(f"* {n:,} x `{message}`" for message, n in top)]
    if notes:
        out += ["", *(f"* {n}" for n in notes)]
    out.append(END)
    return "\n".join(out) + "\n"


# --- the cluster ----------------------------------------------------------------------------------


async def publish_nodes(url: str, context: Any, token: str, nodes: Sequence[fleet.PublishedNode],
                        concurrency: int = 20) -> None:
    """What fleet.Fleet.publish does per node (the Node, then the kubelet's status and the node lifecycle
    controller's taint removal), as concurrent requests: 500 nodes through kubectl take minutes."""
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    todo = iter(nodes)

    async def call(client: Any, method: str, path: str, body: Mapping[str, Any], kind: str) -> None:
        async with client.request(method, url + path, data=json.dumps(body).encode(),
                                  headers={**headers, "Content-Type": kind}) as reply:
            if reply.status >= 300:
                raise RuntimeError(f"{method} {path}: {reply.status} {(await reply.text())[:300]}")

    async def worker(client: Any) -> None:
        for node in todo:
            await call(client, "POST", "/api/v1/nodes", node.manifest(), "application/json")
            merge = "application/merge-patch+json"
            await call(client, "PATCH", f"/api/v1/nodes/{node.name}/status", {"status": node.status()}, merge)
            await call(client, "PATCH", f"/api/v1/nodes/{node.name}",
                       {"spec": {"taints": [dict(t) for t in node.taints] or None}}, merge)

    async with apiload.session(context, concurrency) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))


async def list_pods(client: Any, url: str, token: str, namespace: str) -> list[dict[str, Any]]:
    async with client.get(f"{url}/api/v1/namespaces/{namespace}/pods",
                          headers={"Authorization": f"Bearer {token}", "Accept": "application/json"}) as reply:
        return list((await reply.json())["items"])


async def clear(client: Any, url: str, token: str, namespace: str) -> None:
    """Every pod of the namespace gone (grace period 0: no kubelet confirms a graceful deletion)."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    async with client.delete(f"{url}/api/v1/namespaces/{namespace}/pods", headers=headers,
                             data=json.dumps({"gracePeriodSeconds": 0})) as reply:
        if reply.status >= 300:
            raise RuntimeError(f"deletecollection: {reply.status} {(await reply.text())[:300]}")
    while await list_pods(client, url, token, namespace):
        await asyncio.sleep(0.5)


async def one_batch(url: str, context: Any, token: str, namespace: str, run: ScaleRun, concurrency: int,
                    config_label: str, timeout: float, quiet: list[int]) -> None:
    async with apiload.session(context, concurrency, timeout=120) as client:
        await clear(client, url, token, namespace)
        apiserver_plane.settle(quiet)
        began = time.perf_counter()
        created = asyncio.create_task(apiload.create_batch(client, url, token, namespace, run.pods, concurrency,
                                                           lambda i: pod_at(i, config_label)))
        while True:
            await asyncio.sleep(POLL_SECONDS)
            done = created.done()
            pods = await list_pods(client, url, token, namespace)
            bound, unschedulable, reasons = decided(pods)
            if done and bound + unschedulable >= len(pods):
                break
            if time.perf_counter() - began > timeout:
                raise RuntimeError(f"{run.state}: {bound + unschedulable}/{len(pods)} pods decided "
                                   f"after {timeout:.0f} s")
        result = created.result()
        run.decided_seconds = time.perf_counter() - began
        run.create_seconds = result.seconds
        run.created = result.created
        run.bound, run.unschedulable, run.reasons = bound, unschedulable, reasons
        run.failures = dict(result.failures)


def measure(plane: Any, tmp: Path, nodes: int, pods: int, rounds: int, concurrency: int,
            timeout: float) -> tuple[list[ScaleRun], dict[str, int]]:
    cluster = e2elib.E2ECluster.from_controlplane(plane, tmp / "helm-home")
    releases = e2elib.Releases(cluster)
    ours = e2elib.LiveWebhook(cluster, tmp / "webhook")
    runs: list[ScaleRun] = []
    try:
        release, _ = releases.install(OVERLAY)
        namespace = cluster.create_namespace()
        sharing = fleet.ChartSharing.render(cluster.helm, OVERLAY)
        planned = [fleet.plan(spec, sharing) for spec in fleet_specs(nodes)]
        gpus: dict[str, int] = {}
        for node in planned:
            for resource, value in node.resources.items():
                if resource.startswith(fleet.RESOURCE_PREFIX):
                    gpus[resource] = gpus.get(resource, 0) + int(value)
        url, context = apiload.api_server(cluster)
        admin = apiload.loader_token(cluster, namespace)
        asyncio.run(publish_nodes(url, context, cluster_admin_token(cluster), planned))
        ours.start(release, extra_args=apiload.SIZING)
        assert ours.process is not None
        quiet = [*apiserver_plane.plane_pids(plane).values(), ours.process.pid]
        apiload.point_at(cluster, ours, release, namespace, denies=True)
        saved = apiserver_webhooks.webhook_configurations(cluster, release)
        for i in range(1, rounds + 1):
            order = (OFF, ON) if i % 2 else (ON, OFF)
            for state in order:
                apiserver_webhooks.set_webhook(cluster, release, saved, namespace, state)
                run = ScaleRun(round=i, state=state, pods=pods)
                asyncio.run(one_batch(url, context, admin, namespace, run, concurrency, sharing.config_label,
                                      timeout, quiet))
                runs.append(run)
                print(f"  round {i} {state:34} {run.created}/{pods} created in {run.create_seconds:.1f} s, "
                      f"decided in {run.decided_seconds:.1f} s: {run.bound} bound, {run.unschedulable} "
                      f"unschedulable" + (f", refused {run.failures}" if run.failures else ""), flush=True)
        apiserver_webhooks.set_webhook(cluster, release, saved, namespace, ON)
    finally:
        ours.stop()
        releases.cleanup()
    return runs, gpus


def cluster_admin_token(cluster: e2elib.E2ECluster) -> str:
    """A token allowed to create Nodes: a ServiceAccount bound to cluster-admin (the loader's token may
    only create pods in its namespace)."""
    namespace = cluster.create_namespace()
    cluster.kubectl("create", "serviceaccount", "fleet-publisher", "-n", namespace)
    cluster.kubectl("create", "clusterrolebinding", f"fleet-publisher-{namespace}", "--clusterrole=cluster-admin",
                    f"--serviceaccount={namespace}:fleet-publisher")
    return cluster.kubectl("create", "token", "fleet-publisher", "-n", namespace, "--duration=2h").stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md")
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per batch before giving up")
    args = parser.parse_args(argv)
    given = argv if argv is not None else sys.argv[1:]
    command = "make bench" if not given else "bench/scheduler_scale.py " + " ".join(given)
    stamp = provenance.stamp(command)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpu-stack-sched-") as tmp, \
            controlplane.connect(prepare=True) as plane:
        runs, gpus = measure(plane, Path(tmp), args.nodes, args.pods, args.rounds, args.concurrency, args.timeout)
    section = render(runs, nodes=args.nodes, stamp=stamp, command=command, concurrency=args.concurrency, gpus=gpus,
                     notes=[f"This part took {time.monotonic() - started:.0f} s."])
    report.write_section(args.out, section, BEGIN, END)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
