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
from gpu_stack_webhook.kube.client import KubernetesClientApi, NotServed, object_not_found
from gpu_stack_webhook.kube.lookups import ApiFacts

from .kube_replay import Replay, _handler
from .test_kube_adapter import adapter
from .tls_helpers import Pki, make_pki, serving_https

CLAIM = "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/one"
TEMPLATE = "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaimtemplates/one"
# What kube-apiserver answers for a group/version it does not serve (its NotFoundHandler), and for a missing object
# of one it serves.
PAGE_NOT_FOUND = {"status": 404, "response_headers": {"Content-Type": "text/plain; charset=utf-8"},
                  "response_body": "404 page not found"}
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
                 {"method": "GET", "path": TEMPLATE, **PAGE_NOT_FOUND}]
    with serving(pki, exchanges) as (replay, api):
        assert api.read_resource_claim("ml", "one") is None
        not_served = re.escape("the API server does not serve resource.k8s.io/v1 resourceclaims")
        with pytest.raises(NotServed, match=not_served):
            api.read_resource_claim("ml", "one")
        with pytest.raises(NotServed, match=re.escape("does not serve resource.k8s.io/v1 resourceclaimtemplates")):
            api.read_resource_claim_template("ml", "one")
        assert replay.unmatched == []


def test_lookups_say_the_rule_cannot_be_applied_and_log_it_once(pki: Pki, caplog: pytest.LogCaptureFixture) -> None:
    exchanges = [{"method": "GET", "path": CLAIM, **PAGE_NOT_FOUND},
                 {"method": "GET", "path": CLAIM.replace("/one", "/two"), **PAGE_NOT_FOUND}]
    with serving(pki, exchanges) as (replay, api), caplog.at_level(logging.WARNING, "gpu_stack_webhook.kube.lookups"):
        facts = ApiFacts(api)
        first = facts.resource_claim("ml", "one")
        assert (first.known, first.note) == (False, "the API server does not serve resource.k8s.io/v1 "
                                                    "resourceclaims, so the rule cannot read resourceclaims")
        assert facts.resource_claim("ml", "one") == first  # cached for the TTL: no second request
        assert facts.resource_claim("ml", "two").note == first.note
        assert len(replay.requests) == 2
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["the API server does not serve resource.k8s.io/v1 resourceclaims: the rules that read "
                     "resourceclaims cannot be applied on this API server"]


@pytest.mark.parametrize(("body", "found"), [
    (OBJECT_NOT_FOUND["response_body"], True), ("404 page not found", False), (None, False),
    ({"kind": "Status", "reason": "NotFound"}, True), ({"kind": "Status", "reason": "Gone"}, False)])
def test_object_not_found_is_the_status_only(body: Any, found: bool) -> None:
    assert object_not_found(json.dumps(body) if isinstance(body, dict) else body) is found
