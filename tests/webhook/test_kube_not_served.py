"""An API the server does not serve (resource.k8s.io/v1 before Kubernetes 1.34, or with DRA off) is not a missing
object: the adapter tells the API server's plain "404 page not found" from a NotFound Status (kube.client.NotServed),
and the lookups answer "cannot be applied" once, with one log line, not a retry every few seconds."""

from __future__ import annotations

import contextlib
import http.server
import json
import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest
from gpu_stack_webhook.gpuinspect.fetch import Query, Reader
from gpu_stack_webhook.kube.client import KubernetesClientApi, NotServed, object_not_found
from gpu_stack_webhook.kube.live import OperatorReader
from gpu_stack_webhook.kube.lookups import ApiFacts
from gpu_stack_webhook.policy.config import PolicyConfig
from gpu_stack_webhook.policy.facts import ASKING_RULE, AskingRule, Fact

from .kube_replay import Replay, _handler
from .test_kube_adapter import adapter
from .tls_helpers import Pki, make_pki, serving_https

CLAIM = "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/one"
TEMPLATE = "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaimtemplates/one"
# What kube-apiserver answers for a group/version it does not serve (its NotFoundHandler), and for a missing object
# of one it serves.
PAGE_NOT_FOUND = {"status": 404, "response_headers": {"Content-Type": "text/plain; charset=utf-8"},
                  "response_body": "404 page not found"}
# ... and for a version it does not serve of a group it serves (v1.32.13, resource.k8s.io/v1beta1 switched on, asked
# for resource.k8s.io/v1)
VERSION_NOT_SERVED = {"status": 404, "response_body": {
    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
    "message": "the server could not find the requested resource", "reason": "NotFound", "details": {}, "code": 404}}
OBJECT_NOT_FOUND = {"status": 404, "response_body": {
    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
    "message": 'resourceclaims.resource.k8s.io "one" not found', "reason": "NotFound",
    "details": {"name": "one", "group": "resource.k8s.io", "kind": "resourceclaims"}, "code": 404}}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("not-served-pki"))


@contextlib.contextmanager
def serving(pki: Pki, exchanges: list[dict[str, Any]]) -> Iterator[tuple[Replay, KubernetesClientApi]]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    replay = Replay(port=server.server_address[1], exchanges=exchanges, used=[False] * len(exchanges))
    server.RequestHandlerClass = _handler(replay)
    with serving_https(server, pki):
        yield replay, adapter(replay.host, pki)


def test_a_missing_claim_is_none_but_an_unserved_api_is_not_served(pki: Pki) -> None:
    exchanges = [{"method": "GET", "path": CLAIM, **OBJECT_NOT_FOUND},
                 {"method": "GET", "path": CLAIM, **PAGE_NOT_FOUND},
                 {"method": "GET", "path": TEMPLATE, **PAGE_NOT_FOUND},
                 {"method": "GET", "path": CLAIM, **VERSION_NOT_SERVED}]
    with serving(pki, exchanges) as (replay, api):
        assert api.read_resource_claim("ml", "one") is None
        not_served = re.escape("the API server does not serve resource.k8s.io/v1 resourceclaims")
        with pytest.raises(NotServed, match=not_served):
            api.read_resource_claim("ml", "one")
        with pytest.raises(NotServed, match=re.escape("does not serve resource.k8s.io/v1 resourceclaimtemplates")):
            api.read_resource_claim_template("ml", "one")
        with pytest.raises(NotServed, match=not_served):
            api.read_resource_claim("ml", "one")
        assert replay.unmatched == []


def test_lookups_say_the_rule_cannot_be_applied_and_log_it_once(pki: Pki, caplog: pytest.LogCaptureFixture) -> None:
    """One request for the API (not one per claim), one line per API and the rule that asked."""
    exchanges = [{"method": "GET", "path": CLAIM, **PAGE_NOT_FOUND},
                 {"method": "GET", "path": TEMPLATE, **PAGE_NOT_FOUND}]
    with serving(pki, exchanges) as (replay, api), caplog.at_level(logging.WARNING, "gpu_stack_webhook.kube.lookups"):
        facts = ApiFacts(api)
        asking = ASKING_RULE.set(AskingRule("GPU003"))
        try:
            first = facts.resource_claim("ml", "one")
            assert (first.known, first.note) == (False, "the API server does not serve resource.k8s.io/v1 "
                                                        "resourceclaims, so the rule cannot read resourceclaims")
            assert facts.resource_claim("ml", "one") == first  # cached for the TTL: no second request
            assert facts.resource_claim("ml", "two").note == first.note  # nor for another claim
            assert facts.resource_claim_template("ml", "one").known is False  # another resource: asked once
        finally:
            ASKING_RULE.reset(asking)
        assert facts.resource_claim("ml", "three").note == first.note  # outside a rule: no line
        asking = ASKING_RULE.set(AskingRule("GPU002"))
        try:
            assert facts.resource_claim("ml", "four").note == first.note  # another rule: its own line
        finally:
            ASKING_RULE.reset(asking)
        assert [r.path for r in replay.requests] == [CLAIM, TEMPLATE]
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "the API server does not serve resource.k8s.io/v1 resourceclaims: rule GPU003 cannot be applied to the "
        "pods' resourceclaims on this API server",
        "the API server does not serve resource.k8s.io/v1 resourceclaimtemplates: rule GPU003 cannot be applied "
        "to the pods' resourceclaimtemplates on this API server",
        "the API server does not serve resource.k8s.io/v1 resourceclaims: rule GPU002 cannot be applied to the pods' "
        "resourceclaims on this API server"]


def test_the_api_is_asked_again_after_the_ttl(pki: Pki) -> None:
    """A server upgraded to serve the API is seen within a TTL."""
    clock = [0.0]
    exchanges = [{"method": "GET", "path": CLAIM, **PAGE_NOT_FOUND},
                 {"method": "GET", "path": CLAIM.replace("/one", "/two"), **OBJECT_NOT_FOUND}]
    with serving(pki, exchanges) as (replay, api):
        facts = ApiFacts(api, ttl=30, clock=lambda: clock[0])
        assert facts.resource_claim("ml", "one").known is False
        clock[0] = 31
        assert facts.resource_claim("ml", "two") == Fact(known=True, value=None)
        assert len(replay.requests) == 2


@pytest.mark.parametrize(("body", "found"), [
    (OBJECT_NOT_FOUND["response_body"], True), ("404 page not found", False), (None, False),
    ({"kind": "Status", "reason": "NotFound", "details": {"name": "one"}}, True),
    ({"kind": "Status", "reason": "Gone"}, False),
    # kube-apiserver v1.32.13 with resource.k8s.io/v1beta1 switched on, asked for resource.k8s.io/v1: no object named
    (VERSION_NOT_SERVED["response_body"], False)])
def test_object_not_found_is_the_status_only(body: Any, found: bool) -> None:
    assert object_not_found(json.dumps(body) if isinstance(body, dict) else body) is found


def test_a_cluster_policy_crd_not_installed_fails_closed_at_once_naming_it(pki: Pki) -> None:
    """policy-only beside no GPU Operator (its CRD not installed): GPU010 says so, not an outage kept for a while."""
    exchanges = [{"method": "GET", "path": "/apis/nvidia.com/v1/clusterpolicies/cluster-policy", **PAGE_NOT_FOUND}]
    with serving(pki, exchanges) as (replay, api):
        config = OperatorReader(api, "cluster-policy", "gpu-operator")(PolicyConfig())
        assert config.source_error == (
            "clusterpolicies.nvidia.com cluster-policy cannot be read: the API server does not serve nvidia.com/v1 "
            "clusterpolicies (the GPU Operator's CRDs are not installed)")
        assert len(replay.requests) == 1


def test_inspect_says_dra_is_not_served_rather_than_showing_nothing(pki: Pki) -> None:
    """`kubectl gpu-stack inspect` on Kubernetes 1.32: no DRA devices, and a note saying why (not an error)."""
    slices = {"method": "GET", "path": "/apis/resource.k8s.io/v1/resourceslices",
              "query": {"fieldSelector": "spec.driver=gpu.nvidia.com", "limit": "500"}}
    with serving(pki, [{**slices, **PAGE_NOT_FOUND}]) as (replay, api):
        reader = Reader(api.api_client)
        assert reader.dra(Query()) == ([], [], [
            "DRA devices not read: the API server does not serve resource.k8s.io/v1 resourceslices (Kubernetes "
            "before 1.34, or DRA switched off)"])
        assert (len(replay.requests), replay.unmatched) == (1, [])
