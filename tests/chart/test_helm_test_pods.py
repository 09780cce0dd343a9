"""The helm test pods, judged by the real policy engine with the policy the chart renders: the pod
the denial test dry-runs is denied by GPU002 (and nothing else), and the CUDA sample is admitted."""

from __future__ import annotations

import json
from typing import Any

import yaml
from gpu_stack_dev.chartlib import FULLNAME, one, render
from gpu_stack_webhook.policy.config import parse_config
from gpu_stack_webhook.policy.engine import Policy

from . import pss
from .test_webhook import POLICY_CM


def _policy_and_pods() -> tuple[Policy, dict[str, Any], dict[str, Any]]:
    objs = render(3, set_json={"webhook.helmTests.namespace": "gpu-check"}).objects()
    policy = Policy(parse_config(yaml.safe_load(one(objs, "ConfigMap", POLICY_CM)["data"]["policy.yaml"])))
    tester = one(objs, "Pod", f"{FULLNAME}-test-webhook")
    env = {e["name"]: e["value"] for e in tester["spec"]["containers"][0]["env"]}
    denied = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gpu-stack-test-denied",
                                                               "namespace": env["TEST_NAMESPACE"]},
              **json.loads(env["DENIED_POD_OVERRIDES"])}
    cuda = one(objs, "Pod", f"{FULLNAME}-test-cuda")
    return policy, denied, cuda


def test_denial_test_pod_is_denied_by_gpu002_only() -> None:
    policy, denied, _ = _policy_and_pods()
    evaluation = policy.evaluate(denied, "Pod")
    assert [f.rule_id for f in evaluation.denials] == ["GPU002"]
    # Pod Security "restricted" cannot be what denies it in a restricted namespace.
    assert pss.check(denied["spec"]) == []


def test_cuda_sample_pod_is_admitted() -> None:
    policy, _, cuda = _policy_and_pods()
    # The apiserver defaults requests from limits before admission (see the shared fixtures).
    pod = json.loads(json.dumps(cuda))
    for container in pod["spec"]["containers"]:
        resources = container["resources"]
        resources["requests"] = {**resources["limits"], **resources.get("requests", {})}
    assert policy.evaluate(pod, "Pod").denials == []


def test_every_test_hook_is_named_after_a_test_pod_of_the_release_namespace() -> None:
    """`helm test --logs` reads the logs of a pod named like each test hook, in the release namespace, whatever
    the hook's kind (Helm v4.2.3 pkg/action/release_testing.go GetPodLogs): a hook without such a pod fails it.
    Checked where the test pods run in the release namespace: the defaults, and a test namespace without the
    CUDA sample (the CUDA sample runs in the test namespace, where --logs cannot find it)."""
    for values in ({}, {"webhook.helmTests.namespace": "gpu-check", "webhook.helmTests.cudaSample": False}):
        hooks = [o for o in render(3, set_json=values).objects()
                 if "test" in (o["metadata"].get("annotations") or {}).get("helm.sh/hook", "")]
        pods = {o["metadata"]["name"] for o in hooks if o["kind"] == "Pod"}
        assert pods, values
        assert {(o["kind"], o["metadata"]["name"]) for o in hooks if o["metadata"]["name"] not in pods} == set(), values
