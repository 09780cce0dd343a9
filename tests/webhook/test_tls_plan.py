"""The self-managed TLS plan (tls/plan.py) as plain data: a Secret as read, the caBundles' CAs, the time and
the settings in; the action, its reasons and the Secret to write out. No Kubernetes, no files."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from gpu_stack_webhook.kube.client import MUTATING, VALIDATING
from gpu_stack_webhook.kube.objects import SecretObject, WebhookConfiguration
from gpu_stack_webhook.tls.certs import KeyPair, make_ca, make_serving_cert
from gpu_stack_webhook.tls.config import (
    CA_CRT,
    CA_KEY,
    CA_NEXT_KEY,
    LABELS,
    NEXT_ADDED_ANNOTATION,
    TLS_CRT,
    SelfManagedTls,
)
from gpu_stack_webhook.tls.material import Material, fingerprint, load_bundle
from gpu_stack_webhook.tls.plan import (
    Action,
    holds_bundle,
    owner_references,
    plan_secret,
    published_fingerprints,
    stale_webhooks,
)

NS, SECRET, SVC = "gpu-stack", "gpu-stack-webhook-tls", "gpu-stack-webhook"
DAY = datetime.timedelta(days=1)
HOUR = datetime.timedelta(hours=1)
DNS = [SVC, f"{SVC}.{NS}", f"{SVC}.{NS}.svc", f"{SVC}.{NS}.svc.cluster.local"]
SETTINGS = SelfManagedTls(namespace=NS, secret_name=SECRET, service_name=SVC, mutating_configuration=SVC,
                    validating_configuration=SVC, cert_dir=Path("/nonexistent"))
OWNER = ({"apiVersion": "admissionregistration.k8s.io/v1", "kind": VALIDATING, "name": SVC, "uid": "u-1"},)


@dataclass(frozen=True)
class State:
    """What a reconcile sees: the Secret (None: absent), the CAs in every caBundle, the owner, the clock."""

    secret: SecretObject | None
    published: frozenset[bytes] = frozenset()
    owner: tuple[dict[str, str], ...] = OWNER
    later: datetime.timedelta = datetime.timedelta(0)  # how far the clock is past the certificates' making
    cas: dict[str, KeyPair] = field(default_factory=dict)  # the CAs used, by role, to check the outcome


def pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def tls_secret(data: dict[str, bytes], *, owned: bool = True, annotations: dict[str, str] | None = None,
               type: str = "kubernetes.io/tls") -> SecretObject:
    return SecretObject(NS, SECRET, data, type=type, annotations=annotations or {},
                        owner_references=OWNER if owned else (), resource_version="7", labels={"team": "gpu"})


def healthy(ca_days: float = 1825, cert_days: float = 60, names: list[str] = DNS, signer: KeyPair | None = None,
            **changes: bytes | None) -> tuple[dict[str, bytes], KeyPair]:
    ca = make_ca(valid_for=ca_days * DAY)
    serving = make_serving_cert(signer or ca, names, valid_for=cert_days * DAY)
    data = Material(signing=ca, bundle=(ca.certificate,), serving=serving).data()
    for key, value in changes.items():
        if value is None:
            data.pop(key.replace("_", "."))
        else:
            data[key.replace("_", ".")] = value
    return data, ca


def rotating(added_ago: datetime.timedelta, published: bool) -> State:
    ca, pending = make_ca(valid_for=100 * DAY), make_ca()
    material = Material(signing=ca, bundle=(ca.certificate, pending.certificate), pending=pending,
                        serving=make_serving_cert(ca, DNS, valid_for=60 * DAY))
    added = (datetime.datetime.now(datetime.UTC) - added_ago).isoformat()
    seen = frozenset({fingerprint(ca.certificate), fingerprint(pending.certificate)} if published else
                     {fingerprint(ca.certificate)})
    return State(tls_secret(material.data(), annotations={NEXT_ADDED_ANNOTATION: added}), seen,
                 cas={"old": ca, "pending": pending})


def state(secret_data: tuple[dict[str, bytes], KeyPair], **kw: Any) -> State:
    data, ca = secret_data
    owned = kw.pop("owned", True)
    return State(tls_secret(data, owned=owned), cas={"old": ca}, **kw)


def with_expired_extra_ca() -> State:
    data, ca = healthy()
    short = make_ca(valid_for=DAY)
    data[CA_CRT] += short.cert_pem
    return State(tls_secret(data), later=2 * DAY, cas={"old": ca})


# (the state, the action, a reason or "" for none, the problem or "" for none, the CA that signs after it)
CASES: list[Any] = [
    pytest.param(lambda: State(None), Action.CREATE, "created", "", "new", id="no-secret"),
    pytest.param(lambda: State(tls_secret({"x": b"y"}, type="Opaque")), Action.REFUSE, "",
                 f"Secret {NS}/{SECRET} has type Opaque, not kubernetes.io/tls; delete it", None, id="other-type"),
    pytest.param(lambda: state(healthy()), Action.KEEP, "", "", "old", id="healthy"),
    pytest.param(lambda: state(healthy(), owned=False), Action.UPDATE, "", "", "old", id="healthy-unowned"),
    pytest.param(lambda: state(healthy(), owned=False, owner=()), Action.KEEP, "", "", "old",
                 id="healthy-owner-not-yet-installed"),
    pytest.param(lambda: state(healthy(cert_days=10)), Action.UPDATE, "the serving certificate expires at", "",
                 "old", id="serving-near-expiry"),
    pytest.param(lambda: state(healthy(names=["elsewhere"])), Action.UPDATE, "new serving certificate",
                 "the serving certificate names ['elsewhere']", "old", id="serving-wrong-names"),
    pytest.param(lambda: state(healthy(signer=make_ca())), Action.UPDATE, "new serving certificate",
                 "not signed by the current CA", "old", id="serving-other-ca"),
    pytest.param(lambda: state(healthy(tls_crt=b"junk")), Action.UPDATE, "new serving certificate",
                 "tls.crt is not a PEM certificate", "old", id="serving-unparseable"),
    pytest.param(lambda: state(healthy(tls_key=None)), Action.UPDATE, "new serving certificate",
                 "tls.crt or tls.key is missing", "old", id="serving-key-missing"),
    pytest.param(lambda: state(healthy(ca_crt=b"garbage")), Action.REPAIR, "corrupted: ca.crt is missing",
                 "ca.crt is missing or holds no PEM certificate", "new", id="ca-garbage"),
    pytest.param(lambda: state(healthy(ca_key=make_ca().key_pem)), Action.REPAIR, "corrupted: ca.key is not",
                 "ca.key is not an EC private key of any certificate in ca.crt", "new", id="ca-key-foreign"),
    pytest.param(lambda: state(healthy(ca_key=None)), Action.REPAIR, "corrupted: ca.key",
                 "ca.key (the CA's private key) is missing", "new", id="ca-key-missing"),
    pytest.param(lambda: state(healthy(ca_days=3), later=4 * DAY), Action.REPAIR, "corrupted: the CA expired",
                 "the CA expired at", "new", id="ca-expired"),
    pytest.param(lambda: state(healthy(ca_days=100)), Action.UPDATE, "the CA expires in 99 days: a new CA joins",
                 "", "old", id="ca-due-rotation-starts"),
    pytest.param(lambda: rotating(2 * HOUR, published=False), Action.KEEP, "", "", "old",
                 id="pending-ca-not-in-every-cabundle"),
    pytest.param(lambda: rotating(datetime.timedelta(minutes=10), published=True), Action.KEEP, "", "", "old",
                 id="pending-ca-published-overlap-not-over"),
    pytest.param(lambda: rotating(2 * HOUR, published=True), Action.UPDATE,
                 "the new CA is in every caBundle: it now signs", "", "pending", id="pending-ca-promoted"),
    pytest.param(with_expired_extra_ca, Action.UPDATE, "expired CA certificates left the bundle", "", "old",
                 id="expired-ca-leaves-the-bundle"),
]


@pytest.mark.parametrize(("make", "action", "reason", "problem", "signer"), CASES)
def test_plan_for_each_state(make: Callable[[], State], action: Action, reason: str, problem: str,
                             signer: str | None) -> None:
    given = make()
    now = datetime.datetime.now(datetime.UTC) + given.later
    plan = plan_secret(given.secret, SETTINGS, now, given.published, given.owner)
    assert plan.action is action
    assert problem in plan.problem and bool(plan.problem) == bool(problem)
    assert (reason and any(reason in r for r in plan.reasons)) or (not reason and not plan.reasons), plan.reasons
    if action is Action.REFUSE:
        assert plan.material is None and plan.secret is None
        return
    material = plan.material
    assert material is not None and material.serving is not None and material.serving_problem == ""
    # the serving pair is always usable afterwards: signed by the signing CA, for the Service's names
    material.serving.certificate.verify_directly_issued_by(material.signing.certificate)
    sans = material.serving.certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sorted(sans.get_values_for_type(x509.DNSName)) == sorted(DNS)
    if signer == "new":
        assert all(material.signing.certificate != ca.certificate for ca in given.cas.values())
    else:
        assert material.signing.certificate == given.cas[signer or "old"].certificate
    if action is Action.KEEP:
        assert plan.secret is None
        return
    written = plan.secret
    assert written is not None and written.type == "kubernetes.io/tls"
    assert dict(written.data) == material.data()
    assert written.owner_references == OWNER  # set once the owner exists, kept afterwards
    assert dict(written.labels) == {**({"team": "gpu"} if given.secret else {}), **LABELS}
    assert written.resource_version == ("7" if given.secret else "")  # a replace carries what was read
    assert load_bundle(written.data[CA_CRT])[0] == material.signing.certificate  # signing CA first


def test_a_rotation_keeps_the_old_ca_trusted_and_waits_with_the_new_key() -> None:
    given = state(healthy(ca_days=100))
    plan = plan_secret(given.secret, SETTINGS, datetime.datetime.now(datetime.UTC), given.published, given.owner)
    assert plan.secret is not None
    old = given.cas["old"].certificate
    bundle = load_bundle(plan.secret.data[CA_CRT])
    assert len(bundle) == 2 and bundle[0] == old  # the old CA still signs, the new one is trusted already
    assert plan.secret.data[CA_KEY] == given.cas["old"].key_pem
    assert KeyPair(pem(bundle[1]), plan.secret.data[CA_NEXT_KEY]).certificate == bundle[1]
    assert NEXT_ADDED_ANNOTATION in plan.secret.annotations
    assert given.secret is not None and plan.secret.data[TLS_CRT] == given.secret.data[TLS_CRT]  # not re-issued


def test_a_promotion_keeps_the_old_ca_in_the_bundle_and_drops_the_pending_key() -> None:
    given = rotating(2 * HOUR, published=True)
    plan = plan_secret(given.secret, SETTINGS, datetime.datetime.now(datetime.UTC), given.published, given.owner)
    assert plan.secret is not None
    assert load_bundle(plan.secret.data[CA_CRT]) == (given.cas["pending"].certificate, given.cas["old"].certificate)
    assert CA_NEXT_KEY not in plan.secret.data and NEXT_ADDED_ANNOTATION not in plan.secret.annotations


def test_a_repair_keeps_the_still_valid_cas_of_the_damaged_bundle() -> None:
    given = state(healthy(ca_key=make_ca().key_pem))
    plan = plan_secret(given.secret, SETTINGS, datetime.datetime.now(datetime.UTC), given.published, given.owner)
    assert plan.secret is not None
    assert load_bundle(plan.secret.data[CA_CRT])[1:] == (given.cas["old"].certificate,)


# --- the caBundles ------------------------------------------------------------------------------------------


def config(kind: str, **bundles: bytes) -> WebhookConfiguration:
    return WebhookConfiguration(kind, SVC, f"uid-{kind}", {f"{n}.gpu-stack.io": b for n, b in bundles.items()})


def test_published_means_in_every_webhook_of_every_configuration() -> None:
    one, two = make_ca(), make_ca()
    both = one.cert_pem + two.cert_pem
    assert published_fingerprints([config(MUTATING, mutate=both), config(VALIDATING, validate=both)]) == {
        fingerprint(one.certificate), fingerprint(two.certificate)}
    assert published_fingerprints([config(MUTATING, mutate=both, other=one.cert_pem),
                                   config(VALIDATING, validate=both)]) == {fingerprint(one.certificate)}
    assert published_fingerprints([config(MUTATING, mutate=both), None]) == frozenset()
    assert published_fingerprints([config(MUTATING), config(VALIDATING, validate=both)]) == frozenset()
    assert published_fingerprints([config(MUTATING, mutate=b"")]) == frozenset()


def test_only_webhooks_without_the_bundle_are_patched() -> None:
    bundle = make_ca().cert_pem
    mixed = config(MUTATING, mutate=bundle, other=b"", old=make_ca().cert_pem)
    assert stale_webhooks(mixed, bundle) == ["other.gpu-stack.io", "old.gpu-stack.io"]
    assert not holds_bundle(mixed, bundle)
    assert stale_webhooks(config(VALIDATING, validate=bundle), bundle) == []
    assert holds_bundle(config(VALIDATING, validate=bundle), bundle)
    assert not holds_bundle(config(VALIDATING), bundle)  # no webhooks: nothing trusts it


def test_the_owner_is_the_configuration_read() -> None:
    assert owner_references(config(MUTATING)) == ({"apiVersion": "admissionregistration.k8s.io/v1",
                                                   "kind": MUTATING, "name": SVC, "uid": f"uid-{MUTATING}"},)
    assert owner_references(None) == ()
    assert owner_references(WebhookConfiguration(VALIDATING, SVC, "", {})) == ()
