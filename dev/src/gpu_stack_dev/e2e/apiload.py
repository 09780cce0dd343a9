"""Pod creation load through the real API server: what a Deployment scaled to hundreds of
replicas or a wide Job does to the admission webhooks.

A ServiceAccount with a token that may create pods in one namespace; `create_pods` POSTs two-container
GPU pods with `generateName` (each POST makes a new pod) to the API server with `concurrency` requests
in flight (aiohttp, one event loop, keep-alive connections), and returns every request's latency and
outcome. The API server calls the webhooks of the release for each create, over its own keep-alive
connections; failing closed, an unanswered webhook call is an HTTP 500 for the create.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import yaml

from gpu_stack_dev import controlplane, paths

from . import e2elib
from .e2elib import E2ECluster

LOADER = "gpu-stack-loader"
SIZING = ["--workers", "2", "--threads", "4"]  # as deployed (chart webhook.workers/threads)


def pod_body(gpu: bool = True) -> dict[str, Any]:
    """A two-container pod, one container asking for a GPU (unless not `gpu`): what the webhooks judge on
    every create."""
    limits = {"nvidia.com/gpu": "1", "cpu": "1", "memory": "1Gi"} if gpu else {"cpu": "1", "memory": "1Gi"}
    gpu_resources = {"limits": limits}
    side = {"limits": {"cpu": "100m", "memory": "64Mi"}}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "load-", "labels": {"app": "gpu-load" if gpu else "plain-load"}},
            "spec": {"containers": [
                {"name": "main", "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04", "resources": gpu_resources,
                 "env": [{"name": f"SETTING_{i}", "value": str(i)} for i in range(10)]},
                {"name": "sidecar", "image": "busybox:1.36", "resources": side}]}}


def loader_token(cluster: E2ECluster, namespace: str) -> str:
    """A ServiceAccount allowed to create pods in `namespace`, and a bearer token for it."""
    cluster.kubectl("create", "serviceaccount", LOADER, "-n", namespace)
    cluster.kubectl("create", "role", LOADER, "--verb=create,list,delete,deletecollection", "--resource=pods",
                    "-n", namespace)
    cluster.kubectl("create", "rolebinding", LOADER, f"--role={LOADER}", f"--serviceaccount={namespace}:{LOADER}",
                    "-n", namespace)
    return cluster.kubectl("create", "token", LOADER, "-n", namespace, "--duration=2h").stdout.strip()


def api_server(cluster: E2ECluster) -> tuple[str, ssl.SSLContext]:
    """The API server's URL and a TLS context trusting its CA (from the kubeconfig)."""
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    entry = config["clusters"][0]["cluster"]
    context = ssl.create_default_context()
    if "certificate-authority-data" in entry:
        with tempfile.NamedTemporaryFile("wb", suffix=".crt") as ca:
            ca.write(base64.b64decode(entry["certificate-authority-data"]))
            ca.flush()
            context.load_verify_locations(ca.name)
    elif "certificate-authority" in entry:
        context.load_verify_locations(entry["certificate-authority"])
    return entry["server"].rstrip("/"), context


@dataclass
class LoadResult:
    total: int
    concurrency: int
    seconds: float
    latencies: list[float] = field(default_factory=list)  # seconds, created pods only
    failures: Counter[str] = field(default_factory=Counter)  # "HTTP 500: message" -> count

    @property
    def created(self) -> int:
        return len(self.latencies)

    @property
    def rate(self) -> float:
        return self.created / self.seconds if self.seconds else 0.0

    @property
    def mean_ms(self) -> float:
        return 1000 * statistics.fmean(self.latencies) if self.latencies else 0.0

    def percentile_ms(self, p: float) -> float:
        if not self.latencies:
            return 0.0
        ordered = sorted(self.latencies)
        return 1000 * ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]

    @property
    def max_ms(self) -> float:
        return 1000 * max(self.latencies, default=0.0)

    def line(self) -> str:
        fails = ", ".join(f"{n} x {what}" for what, n in self.failures.most_common(3))
        return (f"{self.created}/{self.total} created at {self.concurrency} concurrent, {self.rate:.0f} pods/s, "
                f"avg {self.mean_ms:.0f} ms, p99 {self.percentile_ms(99):.0f} ms, max {self.max_ms:.0f} ms"
                + (f"; failures: {fails}" if fails else ""))


class _Creates:
    """The POST of create number i and the bookkeeping of its outcome, shared by the closed-loop and the
    paced batches."""

    def __init__(self, session: aiohttp.ClientSession, url: str, token: str, namespace: str, total: int,
                 concurrency: int, pods: Callable[[int], dict[str, Any]] | None) -> None:
        self.session = session
        self.body = json.dumps(pod_body()).encode()
        self.distinct = {i: json.dumps(pods(i)).encode() for i in range(total)} if pods is not None else {}
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json",
                        "Accept": "application/json"}
        self.target = f"{url}/api/v1/namespaces/{namespace}/pods"
        self.result = LoadResult(total, concurrency, 0.0)

    async def create(self, i: int, started: float) -> None:
        """POST create number i; its latency counts from `started` (a perf_counter reading)."""
        result = self.result
        try:
            async with self.session.post(self.target, data=self.distinct.get(i, self.body),
                                         headers=self.headers) as reply:
                text = await reply.read()
                if reply.status == 201:
                    result.latencies.append(time.perf_counter() - started)
                else:
                    try:
                        message = json.loads(text).get("message", "")
                    except ValueError:
                        message = text[:200].decode(errors="replace")
                    result.failures[f"HTTP {reply.status}: {message[:160]}"] += 1
        except (aiohttp.ClientError, TimeoutError) as exc:
            result.failures[f"{type(exc).__name__}: {str(exc)[:160]}"] += 1


async def create_batch(session: aiohttp.ClientSession, url: str, token: str, namespace: str, total: int,
                       concurrency: int, pods: Callable[[int], dict[str, Any]] | None = None) -> LoadResult:
    """`total` pod creates with `concurrency` in flight on an open session (its keep-alive connections
    to the API server are reused from one batch to the next); create number i POSTs pods(i), by default
    pod_body(). Closed loop: each client sends its next create when the last is answered, so the API
    server runs as fast as it can and latency grows with what every create costs it."""
    creates = _Creates(session, url, token, namespace, total, concurrency, pods)
    todo = iter(range(total))

    async def worker() -> None:
        for i in todo:
            await creates.create(i, time.perf_counter())

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    creates.result.seconds = time.perf_counter() - began
    return creates.result


def arrivals(total: int, rate: float, seed: int) -> list[float]:
    """Seconds from the start at which each of `total` creates is sent: a Poisson process of `rate` per
    second (exponential gaps), the same for the same seed, so every state of a comparison gets the same
    arrivals."""
    gaps = random.Random(seed)
    at, out = 0.0, []
    for _ in range(total):
        at += gaps.expovariate(rate)
        out.append(at)
    return out


async def paced_batch(session: aiohttp.ClientSession, url: str, token: str, namespace: str, total: int,
                      rate: float, connections: int, pods: Callable[[int], dict[str, Any]] | None = None,
                      seed: int = 25) -> LoadResult:
    """`total` pod creates sent at `rate` per second (Poisson arrivals, `arrivals`) whatever the answers,
    over at most `connections` keep-alive connections: the open loop of controllers creating pods. A
    create's latency counts from when it was due, so a create that waited for a free connection or for
    the event loop is charged with the wait (no coordinated omission)."""
    creates = _Creates(session, url, token, namespace, total, connections, pods)
    began = time.perf_counter()
    tasks = []
    for i, due in enumerate(arrivals(total, rate, seed)):
        delay = began + due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(creates.create(i, began + due)))
    await asyncio.gather(*tasks)
    creates.result.seconds = time.perf_counter() - began
    return creates.result


def session(context: ssl.SSLContext, concurrency: int, timeout: float = 60.0) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(ssl=context, limit=concurrency, keepalive_timeout=60)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout))


async def _create_pods(url: str, context: ssl.SSLContext, token: str, namespace: str, total: int,
                       concurrency: int, timeout: float) -> LoadResult:
    async with session(context, concurrency, timeout) as client:
        return await create_batch(client, url, token, namespace, total, concurrency)


def create_pods(cluster: E2ECluster, token: str, namespace: str, total: int, concurrency: int,
                timeout: float = 60.0) -> LoadResult:
    url, context = api_server(cluster)
    return asyncio.run(_create_pods(url, context, token, namespace, total, concurrency, timeout))


class BareWebhook(e2elib.LiveWebhook):
    """bench/baseline_app.py (parse, allow) where LiveWebhook runs `gpu-stack-webhook serve`;
    `baseline_args` are added to its command line (e.g. --mutate-answer)."""

    baseline_args: tuple[str, ...] = ()

    def _serve(self, args: list[str]) -> None:
        assert self.pki is not None
        self.port = controlplane.free_port()
        command = [sys.executable, str(paths.ROOT / "bench" / "baseline_app.py"), "--cert", str(self.pki.cert),
                   "--key", str(self.pki.key), "--bind", f"127.0.0.1:{self.port}", *SIZING, *self.baseline_args]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir,
                                            start_new_session=True)
        if not self._wait_healthy():
            raise RuntimeError(f"baseline did not start:\n{self.log()}")


def repoint(cluster: e2elib.E2ECluster, hook: e2elib.LiveWebhook, release: e2elib.Release) -> None:
    """Every webhook of the release's configurations -> `hook` (LiveWebhook.repoint only rewrites the
    chart's `service` references, and this switches back and forth between two loopback servers)."""
    assert hook.pki is not None
    ca = base64.b64encode(hook.pki.ca_cert.read_bytes()).decode()
    for kind in e2elib.WEBHOOK_KINDS:
        for obj in cluster.get_json(kind, "-l", release.selector)["items"]:
            patch = []
            for i, webhook in enumerate(obj["webhooks"]):
                client = webhook["clientConfig"]
                path = client["service"]["path"] if "service" in client else urlsplit(client["url"]).path
                patch.append({"op": "replace", "path": f"/webhooks/{i}/clientConfig",
                              "value": {"url": f"https://127.0.0.1:{hook.port}{path}", "caBundle": ca}})
            cluster.kubectl("patch", kind, obj["metadata"]["name"], "--type=json", "-p", json.dumps(patch))


def point_at(cluster: e2elib.E2ECluster, hook: e2elib.LiveWebhook, release: e2elib.Release, namespace: str,
             denies: bool) -> None:
    """Re-point the configurations and wait until the API server uses them (a dry-run pod that our
    webhook denies and the allow-all admits)."""
    repoint(cluster, hook, release)
    probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bench-probe"},
             "spec": {"containers": [{"name": "c", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": 1}},
                                      "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]}}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        proc = cluster.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(probe),
                               check=False)
        if ("denied the request" in proc.stderr) == denies and (proc.returncode == 0 or denies):
            return
        time.sleep(0.3)
    raise RuntimeError(f"the API server did not switch to {type(hook).__name__}: {proc.returncode} {proc.stderr}")
