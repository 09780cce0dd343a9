"""The one adapter over the `kubernetes` client (kube.KubernetesClientApi), over real HTTPS, against the
responses a kube-apiserver v1.36 really gave the same client (shared fixtures api/*.json, replayed by
kube_replay.py): 200/201 bodies, 404 as None, 409 AlreadyExists and Conflict, 422 Invalid, 403."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from gpu_stack_webhook.kube.client import (
    MUTATING,
    VALIDATING,
    AlreadyExists,
    ApiUnavailable,
    Conflict,
    Forbidden,
    Invalid,
    KubernetesClientApi,
)
from gpu_stack_webhook.kube.connect import api_client
from gpu_stack_webhook.kube.lookups import ApiFacts
from gpu_stack_webhook.kube.objects import SecretObject, ca_bundle_patch
from kubernetes import client
from kubernetes.config import kube_config
from kubernetes.config.config_exception import ConfigException

from .kube_fake import kubeconfig
from .kube_replay import Replay, replaying
from .recordlib import recorded
from .tls_helpers import Pki, free_port, make_pki

NS, SECRET, CONFIG = "gpu-stack", "gpu-policy-webhook-tls", "gpu-policy-webhook"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("replay-pki"))


def adapter(host: str, pki: Pki, timeout: tuple[float, float] = (5.0, 5.0)) -> KubernetesClientApi:
    configuration = client.Configuration()
    configuration.host = host
    configuration.ssl_ca_cert = str(pki.ca_cert)
    configuration.retries = False
    configuration.api_key = {"BearerToken": "test-token"}
    configuration.api_key_prefix = {"BearerToken": "Bearer"}
    return KubernetesClientApi(client.ApiClient(configuration), timeout)


@pytest.fixture
def replay(request: pytest.FixtureRequest, pki: Pki) -> Iterator[tuple[Replay, KubernetesClientApi]]:
    with replaying(pki, request.param) as r:
        yield r, adapter(r.host, pki)
        assert r.unmatched == [], "the adapter sent requests nothing was recorded for"


def scenario(*names: str) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("replay", [list(names)], indirect=True, ids=["+".join(names)])


def _tls_secret(recorded_name: str) -> SecretObject:
    body = recorded(f"api/{recorded_name}")["request_body"]
    return SecretObject.from_body(body)


@scenario("secret-create-201.json", "secret-create-again-409-alreadyexists.json", "secret-read-200.json")
def test_create_then_already_exists_then_read(replay: tuple[Replay, KubernetesClientApi]) -> None:
    r, api = replay
    secret = _tls_secret("secret-create-201.json")
    created = api.create_secret(secret)
    assert (created.name, created.namespace, created.type) == (SECRET, NS, "kubernetes.io/tls")
    assert created.resource_version == "409" and set(created.data) == {"ca.crt", "tls.crt", "tls.key"}
    assert created.data["tls.crt"].startswith(b"-----BEGIN CERTIFICATE-----")
    with pytest.raises(AlreadyExists, match='secrets "gpu-policy-webhook-tls" already exists'):
        api.create_secret(secret)
    again = api.read_secret(NS, SECRET)
    assert again is not None and again.data == created.data
    # what was sent: the Secret as the recorded client sent it (data base64, type, labels, no resourceVersion)
    sent = r.requests[0]
    assert (sent.method, sent.path) == ("POST", f"/api/v1/namespaces/{NS}/secrets")
    assert sent.body == recorded("api/secret-create-201.json")["request_body"]
    assert r.all_used()


@scenario("secret-read-missing-404.json")
def test_a_missing_secret_reads_as_none(replay: tuple[Replay, KubernetesClientApi]) -> None:
    _, api = replay
    assert api.read_secret(NS, "gpu-policy-webhook-tls-missing") is None


@scenario("secret-replace-stale-resourceversion-409-conflict.json", "secret-reread-200.json",
          "secret-replace-200.json")
def test_stale_replace_conflicts_then_reread_and_replace(replay: tuple[Replay, KubernetesClientApi]) -> None:
    r, api = replay
    stale = _tls_secret("secret-replace-stale-resourceversion-409-conflict.json")
    assert stale.resource_version == "409"
    with pytest.raises(Conflict, match="Operation cannot be fulfilled"):
        api.replace_secret(stale)
    current = api.read_secret(NS, SECRET)
    assert current is not None and current.resource_version == "410"
    assert current.annotations == {"example.com/touched-by": "other-writer"}
    fresh = _tls_secret("secret-replace-200.json")
    replaced = api.replace_secret(SecretObject(
        NS, SECRET, fresh.data, labels=fresh.labels, annotations=current.annotations,
        resource_version=current.resource_version))
    assert replaced.resource_version == "411"
    assert r.requests[0].body["metadata"]["resourceVersion"] == "409"
    assert r.requests[2].body["metadata"]["resourceVersion"] == "410"
    assert r.requests[2].body["data"] == recorded("api/secret-replace-200.json")["request_body"]["data"]


@scenario("mwc-read-200.json", "mwc-patch-cabundle-strategicmerge-200.json",
          "vwc-read-200.json", "vwc-patch-cabundle-strategicmerge-200.json")
def test_ca_bundle_is_a_strategic_merge_patch_by_webhook_name(replay: tuple[Replay, KubernetesClientApi]) -> None:
    r, api = replay
    hooks = ((MUTATING, "gpu-policy-mutate.gpu-stack.io"), (VALIDATING, "gpu-policy-validate.gpu-stack.io"))
    for kind, webhook in hooks:
        config = api.read_webhook_configuration(kind, CONFIG)
        assert config is not None and list(config.ca_bundles) == [webhook]
        name = "mwc" if kind == MUTATING else "vwc"
        recorded_patch = recorded(f"api/{name}-patch-cabundle-strategicmerge-200.json")
        bundle = base64.b64decode(recorded_patch["request_body"]["webhooks"][0]["clientConfig"]["caBundle"])
        patched = api.patch_ca_bundle(kind, CONFIG, [webhook], bundle)
        assert patched.ca_bundles == {webhook: bundle}
        assert patched.uid == config.uid
    patches = [q for q in r.requests if q.method == "PATCH"]
    assert [q.content_type for q in patches] == ["application/strategic-merge-patch+json"] * 2
    for q, name in zip(patches, ("mwc", "vwc"), strict=True):
        # byte for byte the body the apiserver accepted with 200
        assert q.body == recorded(f"api/{name}-patch-cabundle-strategicmerge-200.json")["request_body"]


def test_the_patch_body_is_the_recorded_one() -> None:
    sent = recorded("api/mwc-patch-cabundle-strategicmerge-200.json")["request_body"]
    bundle = base64.b64decode(sent["webhooks"][0]["clientConfig"]["caBundle"])
    assert ca_bundle_patch(["gpu-policy-mutate.gpu-stack.io"], bundle) == sent


@scenario("mwc-patch-cabundle-mergepatch-partial-webhook.json")
def test_a_422_is_invalid_with_the_apiservers_message(replay: tuple[Replay, KubernetesClientApi]) -> None:
    # served whatever the adapter sends to that path: shows how a 422 Status body is surfaced
    _, api = replay
    with pytest.raises(Invalid) as info:
        api.patch_ca_bundle(MUTATING, CONFIG, ["gpu-policy-mutate.gpu-stack.io"], b"x")
    assert info.value.status == 422 and "is invalid" in info.value.message


@scenario("sa-token-no-rbac-secret-read-403.json", "sa-token-no-rbac-secret-create-403.json",
          "sa-token-no-rbac-mwc-patch-403.json")
def test_403_bodies_become_forbidden_naming_the_missing_permission(
    replay: tuple[Replay, KubernetesClientApi],
) -> None:
    _, api = replay
    with pytest.raises(Forbidden, match='cannot get resource "secrets"'):
        api.read_secret(NS, SECRET)
    with pytest.raises(Forbidden, match='cannot create resource "secrets"'):
        api.create_secret(_tls_secret("secret-create-201.json"))
    with pytest.raises(Forbidden, match='cannot patch resource "mutatingwebhookconfigurations"'):
        api.patch_ca_bundle(MUTATING, CONFIG, ["gpu-policy-mutate.gpu-stack.io"], b"x")


@scenario("namespace-read-psa-baseline-200.json", "configmap-read-200.json", "configmap-read-missing-404.json")
def test_lookups_read_namespace_labels_and_configmap_keys(replay: tuple[Replay, KubernetesClientApi]) -> None:
    _, api = replay
    labels = api.read_namespace(NS)
    assert labels is not None and labels["pod-security.kubernetes.io/enforce"] == "baseline"
    assert api.read_configmap(NS, "kube-root-ca.crt") == frozenset({"ca.crt"})
    assert api.read_configmap(NS, "gpu-policy-config") is None


@scenario("namespace-read-psa-baseline-200.json", "configmap-read-200.json")
def test_facts_over_the_adapter_ask_once_per_ttl(replay: tuple[Replay, KubernetesClientApi]) -> None:
    r, api = replay
    facts = ApiFacts(api, ttl=60)
    for _ in range(3):
        level = facts.pod_security_enforce(NS)
        keys = facts.configmap_keys(NS, "kube-root-ca.crt")
        assert (level.known, level.value) == (True, "baseline")
        assert (keys.known, keys.value) == (True, frozenset({"ca.crt"}))
    assert len(r.requests) == 2  # cached


def test_an_unreachable_apiserver_is_api_unavailable(pki: Pki) -> None:
    api = adapter(f"https://127.0.0.1:{free_port()}", pki, timeout=(1.0, 1.0))
    with pytest.raises(ApiUnavailable):
        api.read_secret(NS, SECRET)
    facts = ApiFacts(api)
    fact = facts.pod_security_enforce(NS)
    assert not fact.known and fact.note == "API unreachable"


def test_from_environment_reads_a_kubeconfig(tmp_path: Path, pki: Pki) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig("https://127.0.0.1:6443", pki)))
    api = KubernetesClientApi.from_environment(str(path))
    assert api.api_client.configuration.host == "https://127.0.0.1:6443"
    assert api.api_client.configuration.retries is False


def test_serve_uses_the_pod_account_and_inspect_the_users_kubeconfig(tmp_path: Path, pki: Pki,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """One client construction, two orders: `serve` never falls back to $KUBECONFIG (outside a pod and
    without --kubeconfig it fails), `inspect` reads it first."""

    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig("https://127.0.0.1:6443", pki)))
    # $KUBECONFIG as the client read it when it was imported
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ConfigException, match="Service host/port is not set"):
        api_client(in_cluster_first=True)
    users = api_client()
    assert users.configuration.host == "https://127.0.0.1:6443" and users.configuration.retries is False


def test_a_forked_worker_shares_no_pooled_connection_with_the_master(tmp_path: Path, pki: Pki) -> None:
    """gunicorn's master builds the app (preload_app) and may hold pooled connections when it forks the
    workers; each worker must open its own, never write to the master's sockets."""
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig("https://127.0.0.1:1", pki)))
    api = api_client(str(path), in_cluster_first=True)
    pools = api.rest_client.pool_manager
    pools.connection_from_url("https://127.0.0.1:1/api")
    assert len(pools.pools) == 1
    pid = os.fork()
    if pid == 0:  # the worker: no pool of the master's left
        os._exit(0 if len(pools.pools) == 0 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert len(pools.pools) == 1  # the master keeps its own
