"""A first install never blocks the cluster: the chart installed on a real API server with no webhook
endpoint at all (its pods never run, as with an image that cannot be pulled), for the defaults and
every overlay. Pods, Deployments and Jobs without GPUs are admitted in every namespace the webhook
covers; every request the webhook would deny, and every GPU pod, is still refused (failurePolicy Fail),
with the API server's error naming our webhook. The generated matchConditions evaluate in the API server,
within its CEL cost limits for the largest pods (cel/match_conditions.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from gpu_stack_dev.e2e.e2elib import ROOT, E2ECluster, Release, Releases, overlays
from gpu_stack_webhook.policy import signals
from gpu_stack_webhook.policy.config import parse_config
from gpu_stack_webhook.policy.engine import Policy

from .test_install import STANDINS, apply_crds

MANIFESTS = sorted((ROOT / "hack" / "demo" / "manifests").glob("*.yaml"))
UNREACHABLE = "failed calling webhook"
OUR_WEBHOOKS = ('"mutate.gpu-stack.io"', '"validate.gpu-stack.io"')
GPU = {"limits": {"nvidia.com/gpu": "1"}}


def refused_by_our_webhook(proc: Any) -> bool:
    return proc.returncode != 0 and UNREACHABLE in proc.stderr and any(w in proc.stderr for w in OUR_WEBHOOKS)


def dry_run(cluster: E2ECluster, namespace: str, obj: dict[str, Any]) -> Any:
    return cluster.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(obj),
                           check=False)


def release_policy(cluster: E2ECluster, release: Release) -> Policy:
    text = cluster.kubectl("get", "configmap", f"{release.fullname}-webhook-policy", "-n", release.namespace,
                           "-o", "jsonpath={.data.policy\\.yaml}").stdout
    return Policy(parse_config(yaml.safe_load(text)))


@pytest.fixture
def crds(cluster: E2ECluster) -> Any:
    applied: list[str] = []
    yield lambda name: applied.extend(apply_crds(cluster, name))
    if applied:
        cluster.kubectl("delete", "crd", *applied, "--ignore-not-found", "--wait=true", "--timeout=60s")


@pytest.mark.parametrize("overlay", overlays())
def test_without_a_webhook_endpoint_only_what_a_rule_judges_is_refused(cluster: E2ECluster, releases: Releases,
                                                                        crds: Any, overlay: str) -> None:
    if overlay in STANDINS:
        crds(STANDINS[overlay][0])
    release, _ = releases.install(overlay)
    assert cluster.get_json("endpoints", release.fullname + "-webhook", "-n", release.namespace).get(
        "subsets") in (None, [])
    namespace = cluster.create_namespace()
    releases.namespaces.append(namespace)

    # What a user does first on a cluster with the chart installed and its webhook not (yet) running.
    for args in (("run", "plain", "--image=nginx"), ("create", "deployment", "web", "--image=nginx"),
                 ("create", "job", "once", "--image=busybox")):
        proc = cluster.kubectl(*args, "-n", namespace, check=False)
        assert proc.returncode == 0, (args, proc.stderr)
    overrides = json.dumps({"spec": {"containers": [{"name": "gpu", "image": "cuda", "resources": GPU}]}})
    proc = cluster.kubectl("run", "gpu", "--image=cuda", "-n", namespace, "--overrides", overrides, check=False)
    assert refused_by_our_webhook(proc), proc.stderr

    # Every manifest of the demo: what the webhook would deny is refused (fail closed); what it would act
    # on is refused while it is down; what no rule reads is admitted.
    policy = release_policy(cluster, release)
    for path in MANIFESTS:
        for obj in yaml.safe_load_all(path.read_text()):
            if not obj:
                continue
            obj.get("metadata", {}).pop("namespace", None)
            evaluation = policy.evaluate(obj, obj["kind"])
            proc = dry_run(cluster, namespace, obj)
            if evaluation.denials:
                # Refused: by our webhook's absence, or earlier by the API server itself (a RuntimeClass
                # the cluster does not have, in the layouts where the chart creates none).
                assert proc.returncode != 0, (path.name, proc.stdout)
                assert refused_by_our_webhook(proc) or "RuntimeClass" in proc.stderr, (path.name, proc.stderr)
            elif proc.returncode == 0:
                # Admitted without the webhook: it would have had nothing to say (no patch, no warning).
                assert not evaluation.findings, (path.name, evaluation.findings)
            else:
                assert refused_by_our_webhook(proc), (path.name, proc.stderr)


def test_largest_pods_stay_within_the_api_servers_cel_cost_limits(cluster: E2ECluster,
                                                                 releases: Releases) -> None:
    """The conditions read at most MAX_* entries of any list or map; beyond that the pod is sent to the
    webhook unread. At the bounds the API server evaluates them (no cost error): a plain pod is admitted;
    past them, and on a 1 MiB pod, the webhook is asked (here: refused as unreachable, not as too costly)."""
    releases.install()
    namespace = cluster.create_namespace()
    releases.namespaces.append(namespace)
    mc = signals
    resources = {f"example.com/resource-{j:04d}": "1" for j in range(mc.MAX_RESOURCES // 2)}
    at_bounds = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "at-bounds", "annotations": {f"a{j}.example.com/key": "v" for j in range(mc.MAX_ANNOTATIONS)}},
        "spec": {
            "containers": [{"name": f"c{i}", "image": "x", "resources": {"requests": resources, "limits": resources}}
                           for i in range(mc.MAX_CONTAINERS)],
            "nodeSelector": {f"n{j}.example.com/key": "v" for j in range(mc.MAX_SELECTOR)},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": f"x{j}.example.com/key", "operator": "In", "values": ["a"]}
                                      for j in range(mc.MAX_EXPRESSIONS)]} for _ in range(mc.MAX_TERMS)]}}}}}
    proc = dry_run(cluster, namespace, at_bounds)
    assert proc.returncode == 0, proc.stderr[-500:]

    past = json.loads(json.dumps(at_bounds))
    past["metadata"]["name"] = "past-bounds"
    past["spec"]["containers"].append({"name": "one-more", "image": "x"})
    proc = dry_run(cluster, namespace, past)
    assert refused_by_our_webhook(proc), proc.stderr[-500:]

    keys = {f"example.com/r{j}": "1" for j in range(150)}
    huge = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "huge", "annotations": {f"a{j}.example.com/k": "v" for j in range(2000)}},
        "spec": {"containers": [{"name": f"c{i}", "image": "x", "resources": {"limits": keys}} for i in range(260)],
                 "nodeSelector": {f"n{j}.example.com/k": "v" for j in range(2000)}}}
    assert len(json.dumps(huge)) > 1_000_000
    proc = dry_run(cluster, namespace, huge)
    assert refused_by_our_webhook(proc), proc.stderr[-500:]
    assert "cost" not in proc.stderr

