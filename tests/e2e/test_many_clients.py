"""Issue 18 through the real API server: 100 pod creates in flight at once, each judged by the live
webhook (`gpu-stack-webhook serve`, 2 workers x 4 threads, which the release's two webhook
configurations are re-pointed to). Every create must succeed, and no call the API server made to the
webhooks may have taken longer than 1 s: read from the API server's own histogram
`apiserver_admission_webhook_admission_duration_seconds` (before/after difference), so the API server's
queueing on a busy machine does not count against the webhook. With gunicorn's stock gthread worker
the calls waited up to the 10 s timeout and creates failed with `context deadline exceeded`.

On a machine too loaded for any webhook to answer the API server within 1 s (the 2 cores are shared),
the same load is run against a bare allow-all (bench/baseline_app.py) with the same configurations:
if that also has calls past 1 s, the test is skipped with both counts instead of failing on the
machine; if it has none, ours fails. Failed creates always fail. The 1,500-create comparison with a
bare allow-all is in `make bench` (bench/apiserver_load.py)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from .apiload import SIZING, BareWebhook, LoadResult, create_pods, loader_token, point_at
from .e2elib import E2ECluster, Release, Releases

CONCURRENT = 100
CREATES = 400
LIMIT = "1"  # the histogram's 1 s bucket
METRIC = "apiserver_admission_webhook_admission_duration_seconds"
HOOKS = ("mutate.gpu-stack.io", "validate.gpu-stack.io")


def webhook_calls(cluster: E2ECluster) -> tuple[Counter[str], Counter[str]]:
    """(calls, calls answered within 1 s) per webhook name, from the API server's /metrics."""
    text = cluster.kubectl("get", "--raw", "/metrics").stdout
    total: Counter[str] = Counter()
    fast: Counter[str] = Counter()
    for family in text_string_to_metric_families(text):
        if family.name != METRIC:
            continue
        for sample in family.samples:
            name = sample.labels.get("name", "")
            if name not in HOOKS:
                continue
            if sample.name == f"{METRIC}_count":
                total[name] += int(sample.value)
            elif sample.name == f"{METRIC}_bucket" and float(sample.labels["le"]) == float(LIMIT):
                fast[name] += int(sample.value)
    return total, fast


def judged_load(cluster: E2ECluster, token: str, namespace: str) -> tuple[LoadResult, dict[str, int], dict[str, int]]:
    """A warm-up, then CREATES creates with CONCURRENT in flight; (result, webhook calls, calls past 1 s)."""
    create_pods(cluster, token, namespace, CONCURRENT, CONCURRENT)  # connections, caches
    total0, fast0 = webhook_calls(cluster)
    result = create_pods(cluster, token, namespace, CREATES, CONCURRENT)
    total1, fast1 = webhook_calls(cluster)
    calls = {name: total1[name] - total0[name] for name in HOOKS}
    slow = {name: calls[name] - (fast1[name] - fast0[name]) for name in HOOKS}
    print(f"\n{result.line()}\nwebhook calls {calls}, past 1 s {slow}")
    assert not result.failures, result.line()
    assert result.created == CREATES
    assert all(calls[name] >= CREATES for name in HOOKS), calls  # the API server called both webhooks each time
    return result, calls, slow


def bare_allow_all_is_slow_too(cluster: E2ECluster, release: Release, namespace: str, token: str, workdir: Any) -> str:
    bare = BareWebhook(cluster, workdir)
    try:
        bare.start()
        point_at(cluster, bare, release, namespace, denies=False)
        _, calls, slow = judged_load(cluster, token, namespace)
    finally:
        bare.stop()
    return f"bare allow-all: {slow} of {calls} past 1 s" if any(slow.values()) else ""


def test_100_concurrent_pod_creates_are_all_judged_within_1_s(cluster: E2ECluster, releases: Releases,
                                                               live_webhook: Any, tmp_path: Any) -> None:
    # NFD off: its CRDs are release-owned templates another test's release in this session may hold.
    release, _ = releases.install(set_json={"nfd.enabled": False})
    namespace = cluster.create_namespace()
    hook = live_webhook(release, probe_namespace=namespace, extra_args=SIZING)
    token = loader_token(cluster, namespace)
    _, calls, slow = judged_load(cluster, token, namespace)
    assert "admission decision" in hook.log()
    if any(slow.values()):
        machine = bare_allow_all_is_slow_too(cluster, release, namespace, token, tmp_path / "bare")
        if machine:
            pytest.skip(f"this machine cannot answer within 1 s even with a zero-cost webhook ({machine}); "
                        f"ours: {slow} of {calls}")
    assert slow == dict.fromkeys(HOOKS, 0), f"webhook calls past 1 s: {slow} of {calls}"
