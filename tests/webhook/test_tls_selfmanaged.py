"""Self-managed TLS (tls/selfmanaged.py carrying out tls/plan.py) against an in-memory KubeApi: first start,
racing replicas, renewal, CA rotation with overlap, corrupted Secrets, caBundle only where it belongs,
readiness."""

from __future__ import annotations

import datetime
import logging
import threading
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from gpu_stack_webhook.kube.client import MUTATING, VALIDATING, ApiUnavailable, Conflict, Forbidden, KubeError
from gpu_stack_webhook.kube.objects import SecretObject
from gpu_stack_webhook.tls.certs import KeyPair, make_ca, make_serving_cert
from gpu_stack_webhook.tls.config import CA_CRT, CA_KEY, CA_NEXT_KEY, TLS_CRT, TLS_KEY, SelfManagedTls
from gpu_stack_webhook.tls.material import fingerprint, load_bundle
from gpu_stack_webhook.tls.selfmanaged import TlsManager
from gpu_stack_webhook.tls.startup import bootstrap

from .kube_fake import FakeKube, standard_fake

NS, SECRET, SVC, CONFIG = "gpu-stack", "gpu-stack-webhook-tls", "gpu-stack-webhook", "gpu-stack-webhook"
DAY = datetime.timedelta(days=1)
DNS = [SVC, f"{SVC}.{NS}", f"{SVC}.{NS}.svc", f"{SVC}.{NS}.svc.cluster.local"]


def settings(tmp_path: Path, name: str = "replica", **kw: Any) -> SelfManagedTls:
    return SelfManagedTls(namespace=NS, secret_name=SECRET, service_name=SVC, mutating_configuration=CONFIG,
                    validating_configuration=CONFIG, cert_dir=tmp_path / name / "tls", **kw)


def stored(fake: FakeKube) -> SecretObject:
    return fake.secrets[(NS, SECRET)]


def cert_of(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def chains_to(cert: x509.Certificate, bundle: bytes) -> bool:
    for ca in load_bundle(bundle):
        try:
            cert.verify_directly_issued_by(ca)
            return True
        except Exception:
            continue
    return False


def assert_served_cert_is_trusted(fake: FakeKube, s: SelfManagedTls) -> None:
    """What a replica serves right now chains to a CA in the caBundle of every webhook (no failed request)."""
    served = cert_of(s.certfile.read_bytes())
    for kind in (MUTATING, VALIDATING):
        for name, bundle in fake.configs[(kind, CONFIG)].ca_bundles.items():
            assert chains_to(served, bundle), f"{kind} webhook {name} does not trust the served certificate"


def seed(fake: FakeKube, ca: KeyPair, serving: KeyPair, **extra: bytes) -> None:
    data = {CA_CRT: ca.cert_pem, CA_KEY: ca.key_pem, TLS_CRT: serving.cert_pem, TLS_KEY: serving.key_pem, **extra}
    fake.secrets[(NS, SECRET)] = SecretObject(NS, SECRET, data, resource_version="7", uid="uid-secret")


# --- first start ------------------------------------------------------------------------------------------


def test_first_start_creates_the_secret_patches_both_configurations_and_serves(tmp_path: Path) -> None:
    fake = standard_fake()
    s = settings(tmp_path)
    status = TlsManager(fake, s).reconcile()

    secret = stored(fake)
    assert secret.type == "kubernetes.io/tls"
    assert set(secret.data) == {TLS_CRT, TLS_KEY, CA_CRT, CA_KEY}
    assert fake.count("create_secret") == 1 and fake.count("replace_secret") == 0
    assert secret.owner_references == ({"apiVersion": "admissionregistration.k8s.io/v1",
                                        "kind": "ValidatingWebhookConfiguration", "name": CONFIG,
                                        "uid": f"uid-{VALIDATING}-{CONFIG}"},)
    serving = cert_of(secret.data[TLS_CRT])
    assert isinstance(serving.public_key(), ec.EllipticCurvePublicKey)
    assert serving.public_key().curve.name == "secp256r1"
    sans = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == DNS
    lifetime = serving.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    assert 89 * DAY < lifetime <= 90 * DAY
    ca = cert_of(secret.data[CA_CRT])
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    # caBundle of every webhook of both configurations is the Secret's ca.crt
    for kind in (MUTATING, VALIDATING):
        assert set(fake.configs[(kind, CONFIG)].ca_bundles.values()) == {secret.data[CA_CRT]}
    # the files gunicorn reads, and the ready-file the workers' /readyz checks
    assert s.certfile.read_bytes() == secret.data[TLS_CRT]
    assert s.keyfile.read_bytes() == secret.data[TLS_KEY]
    assert oct(s.keyfile.stat().st_mode & 0o777) == "0o600"
    assert status.ready and s.ready_file.exists()
    assert_served_cert_is_trusted(fake, s)


def test_a_second_reconcile_changes_nothing(tmp_path: Path) -> None:
    fake = standard_fake()
    manager = TlsManager(fake, settings(tmp_path))
    manager.reconcile()
    version = stored(fake).resource_version
    writes = fake.count("create_secret") + fake.count("replace_secret") + fake.count("patch_ca_bundle")
    assert manager.reconcile().ready
    assert stored(fake).resource_version == version
    assert fake.count("create_secret") + fake.count("replace_secret") + fake.count("patch_ca_bundle") == writes


def test_not_ready_until_the_webhook_configurations_exist(tmp_path: Path) -> None:
    fake = FakeKube()  # the Deployment's pod may start before Helm created the webhook configurations
    s = settings(tmp_path)
    manager = TlsManager(fake, s)
    status = manager.reconcile()
    assert not status.ready and not s.ready_file.exists()
    assert s.certfile.exists()  # gunicorn can bind meanwhile
    assert stored(fake).owner_references == ()
    fake.add_webhook_configuration(MUTATING, CONFIG, ["mutate.gpu-stack.io"])
    fake.add_webhook_configuration(VALIDATING, CONFIG, ["validate.gpu-stack.io"])
    assert manager.reconcile().ready
    assert stored(fake).owner_references[0]["kind"] == VALIDATING  # added once the owner exists
    assert_served_cert_is_trusted(fake, s)


# --- two replicas -----------------------------------------------------------------------------------------


class RacingFake(FakeKube):
    """Both replicas read "no Secret" before either creates it."""

    def __init__(self, parties: int) -> None:
        super().__init__()
        self.barrier = threading.Barrier(parties, timeout=30)
        self.first_reads: set[str] = set()

    def read_secret(self, namespace: str, name: str) -> SecretObject | None:
        found = super().read_secret(namespace, name)
        me = threading.current_thread().name
        if me not in self.first_reads:
            self.first_reads.add(me)
            self.barrier.wait()
        return found


def test_two_replicas_starting_together_agree_on_one_ca(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    fake = RacingFake(2)
    fake.add_webhook_configuration(MUTATING, CONFIG, ["mutate.gpu-stack.io"])
    fake.add_webhook_configuration(VALIDATING, CONFIG, ["validate.gpu-stack.io"])
    replicas = [settings(tmp_path, f"replica-{i}") for i in range(2)]
    errors: list[BaseException] = []

    def run(s: SelfManagedTls) -> None:
        try:
            TlsManager(fake, s).reconcile()
        except BaseException as exc:
            errors.append(exc)

    caplog.set_level(logging.INFO, logger="gpu_stack_webhook.tls")
    threads = [threading.Thread(target=run, args=(s,), name=f"replica-{i}") for i, s in enumerate(replicas)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert fake.count("create_secret") == 2  # both tried ...
    assert len(fake.secrets) == 1  # ... one won
    secret = stored(fake)
    for s in replicas:  # both serve the one certificate of the one CA
        assert s.certfile.read_bytes() == secret.data[TLS_CRT]
        assert s.ready_file.exists()
        assert_served_cert_is_trusted(fake, s)
    assert "created by another replica meanwhile; using it" in caplog.text


def test_a_stale_replace_re_reads_and_decides_again(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    fake = standard_fake()
    ca = make_ca()
    seed(fake, ca, make_serving_cert(ca, DNS, valid_for=10 * DAY))
    fake.fail_next["replace_secret"] = [Conflict(409, "Conflict", "the object has been modified")]
    caplog.set_level(logging.INFO, logger="gpu_stack_webhook.tls")
    assert TlsManager(fake, settings(tmp_path)).reconcile().ready
    assert fake.count("replace_secret") == 2 and fake.count("read_secret") == 2
    assert "(resourceVersion 7 is stale); re-reading" in caplog.text


# --- renewal and rotation ---------------------------------------------------------------------------------


def test_a_certificate_near_expiry_is_renewed_with_the_same_ca(tmp_path: Path) -> None:
    fake = standard_fake()
    ca = make_ca()
    old = make_serving_cert(ca, DNS, valid_for=10 * DAY)  # 10 days left: inside the 30-day window
    seed(fake, ca, old)
    s = settings(tmp_path)
    status = TlsManager(fake, s).reconcile()
    secret = stored(fake)
    new = cert_of(secret.data[TLS_CRT])
    assert new.serial_number != old.certificate.serial_number
    assert new.not_valid_after_utc - datetime.datetime.now(datetime.UTC) > 89 * DAY
    assert secret.data[CA_CRT] == ca.cert_pem and secret.data[CA_KEY] == ca.key_pem  # same CA
    assert secret.resource_version != "7"
    assert status.ready and s.certfile.read_bytes() == secret.data[TLS_CRT]
    assert_served_cert_is_trusted(fake, s)


def test_a_certificate_with_time_left_is_kept(tmp_path: Path) -> None:
    fake = standard_fake()
    ca = make_ca()
    seed(fake, ca, make_serving_cert(ca, DNS, valid_for=60 * DAY))
    TlsManager(fake, settings(tmp_path)).reconcile()
    assert fake.count("replace_secret") == 1  # only to add the ownerReference
    assert stored(fake).data[TLS_CRT] == fake.secrets[(NS, SECRET)].data[TLS_CRT]


def test_the_ca_is_rotated_with_an_overlap_and_no_request_fails(tmp_path: Path) -> None:
    fake = standard_fake()
    old_ca = make_ca(valid_for=100 * DAY)  # within ca_renew_before (365 days)
    seed(fake, old_ca, make_serving_cert(old_ca, DNS, valid_for=60 * DAY))
    s = settings(tmp_path, ca_overlap=datetime.timedelta(0))
    manager = TlsManager(fake, s)

    # 1: a new CA joins the bundle; the old CA still signs what is served
    manager.reconcile()
    secret = stored(fake)
    bundle = load_bundle(secret.data[CA_CRT])
    assert len(bundle) == 2 and bundle[0] == old_ca.certificate
    assert CA_NEXT_KEY in secret.data and secret.data[CA_KEY] == old_ca.key_pem
    assert chains_to(cert_of(s.certfile.read_bytes()), old_ca.cert_pem)
    assert_served_cert_is_trusted(fake, s)
    for kind in (MUTATING, VALIDATING):  # the apiserver trusts the new CA before anything it signs is served
        assert set(fake.configs[(kind, CONFIG)].ca_bundles.values()) == {secret.data[CA_CRT]}
    new_ca = bundle[1]

    # 2: the bundle with the new CA is published everywhere: the new CA signs a new serving certificate
    manager.reconcile()
    secret = stored(fake)
    assert CA_NEXT_KEY not in secret.data
    assert cert_of(secret.data[CA_CRT]) == new_ca  # signing CA first ...
    assert old_ca.certificate in load_bundle(secret.data[CA_CRT])  # ... the old one still trusted
    served = cert_of(s.certfile.read_bytes())
    assert chains_to(served, new_ca.public_bytes(serialization.Encoding.PEM))
    assert_served_cert_is_trusted(fake, s)
    # a replica that has not re-read the Secret yet still serves the old certificate: still trusted
    for kind in (MUTATING, VALIDATING):
        for bundle_pem in fake.configs[(kind, CONFIG)].ca_bundles.values():
            assert fingerprint(old_ca.certificate) in {fingerprint(c) for c in load_bundle(bundle_pem)}


def test_the_pending_ca_waits_for_the_overlap(tmp_path: Path) -> None:
    fake = standard_fake()
    old_ca = make_ca(valid_for=100 * DAY)
    seed(fake, old_ca, make_serving_cert(old_ca, DNS, valid_for=60 * DAY))
    s = settings(tmp_path)  # default overlap: 1 hour
    manager = TlsManager(fake, s)
    manager.reconcile()
    manager.reconcile()
    assert CA_NEXT_KEY in stored(fake).data  # not promoted yet
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=2)
    TlsManager(fake, s, clock=lambda: later).reconcile()
    assert CA_NEXT_KEY not in stored(fake).data
    assert_served_cert_is_trusted(fake, s)


# --- corrupted Secrets ------------------------------------------------------------------------------------


def _other_key_pem() -> bytes:
    return make_ca().key_pem


@pytest.mark.parametrize(
    ("damage", "logged", "ca_kept"),
    [
        pytest.param({TLS_CRT: b"not a certificate"}, "unusable serving certificate (tls.crt is not a PEM", True,
                     id="unparseable-cert"),
        pytest.param({TLS_KEY: b"garbage"}, "unusable serving certificate (tls.key is not", True,
                     id="unparseable-key"),
        pytest.param({TLS_KEY: "other"}, "unusable serving certificate (tls.key does not match tls.crt)", True,
                     id="key-does-not-match-cert"),
        pytest.param({CA_CRT: None}, "is corrupted (ca.crt is missing or holds no PEM certificate)", False,
                     id="ca-missing"),
        pytest.param({CA_KEY: None}, "is corrupted (ca.key (the CA's private key) is missing)", False,
                     id="ca-key-missing"),
        pytest.param({CA_KEY: "other"}, "is corrupted (ca.key is not an EC private key of any certificate", False,
                     id="ca-key-foreign"),
    ],
)
def test_a_corrupted_secret_is_replaced_with_a_clear_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: dict[str, Any], logged: str, ca_kept: bool
) -> None:
    fake = standard_fake()
    ca = make_ca()
    seed(fake, ca, make_serving_cert(ca, DNS, valid_for=60 * DAY))
    data = dict(stored(fake).data)
    for key, value in damage.items():
        if value is None:
            data.pop(key)
        else:
            data[key] = _other_key_pem() if value == "other" else value
    fake.secrets[(NS, SECRET)] = SecretObject(NS, SECRET, data, resource_version="7")
    s = settings(tmp_path)
    with caplog.at_level(logging.INFO, logger="gpu_stack_webhook.tls"):
        status = TlsManager(fake, s).reconcile()
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and logged in errors[0].getMessage(), caplog.text
    assert f"Secret {NS}/{SECRET}" in errors[0].getMessage()
    secret = stored(fake)
    assert (secret.data[CA_KEY] == ca.key_pem) is ca_kept
    assert status.ready
    assert_served_cert_is_trusted(fake, s)


def test_a_secret_of_another_type_is_reported_not_overwritten(tmp_path: Path) -> None:
    fake = standard_fake()
    fake.secrets[(NS, SECRET)] = SecretObject(NS, SECRET, {"x": b"y"}, type="Opaque", resource_version="3")
    with pytest.raises(KubeError, match=r"has type Opaque, not kubernetes\.io/tls; delete it"):
        TlsManager(fake, settings(tmp_path)).reconcile()
    assert fake.count("replace_secret") == 0


# --- caBundle only where it belongs -----------------------------------------------------------------------


def test_ca_bundle_is_patched_only_into_the_configurations_named_in_config(tmp_path: Path) -> None:
    fake = standard_fake()
    fake.add_webhook_configuration(MUTATING, "someone-else", ["other.example.com"])
    fake.add_webhook_configuration(VALIDATING, "someone-else", ["other.example.com"])
    fake.add_webhook_configuration(VALIDATING, "gpu-stack-webhook-old", ["validate.gpu-stack.io"])
    TlsManager(fake, settings(tmp_path)).reconcile()
    patched = {(args[0], args[1]) for method, args in fake.calls if method == "patch_ca_bundle"}
    assert patched == {(MUTATING, CONFIG), (VALIDATING, CONFIG)}
    for key in ((MUTATING, "someone-else"), (VALIDATING, "someone-else"), (VALIDATING, "gpu-stack-webhook-old")):
        assert set(fake.configs[key].ca_bundles.values()) == {b""}


def test_every_webhook_of_an_own_configuration_gets_the_bundle(tmp_path: Path) -> None:
    fake = FakeKube()
    fake.add_webhook_configuration(MUTATING, CONFIG, ["mutate.gpu-stack.io", "mutate-2.gpu-stack.io"])
    fake.add_webhook_configuration(VALIDATING, CONFIG, ["validate.gpu-stack.io"])
    TlsManager(fake, settings(tmp_path)).reconcile()
    assert len(set(fake.configs[(MUTATING, CONFIG)].ca_bundles.values())) == 1
    assert b"" not in fake.configs[(MUTATING, CONFIG)].ca_bundles.values()


# --- failures -----------------------------------------------------------------------------------------------


def test_bootstrap_gives_up_with_a_message_when_the_api_is_unreachable(tmp_path: Path) -> None:
    fake = standard_fake()
    fake.unreachable = True
    slept: list[float] = []
    with pytest.raises(ValueError, match=f"cannot set up Secret {NS}/{SECRET}: Unreachable"):
        bootstrap(TlsManager(fake, settings(tmp_path)), attempts=3, sleep=slept.append)
    assert len(slept) == 2


def test_bootstrap_retries_until_the_api_answers(tmp_path: Path) -> None:
    fake = standard_fake()
    fake.fail_next["read_secret"] = [ApiUnavailable(0, "Unreachable", "refused")]
    s = settings(tmp_path)
    bootstrap(TlsManager(fake, s), attempts=3, sleep=lambda _: None)
    assert s.ready_file.exists()


def test_missing_permissions_are_named(tmp_path: Path) -> None:
    fake = standard_fake()
    message = ('secrets "gpu-stack-webhook-tls" is forbidden: User "system:serviceaccount:gpu-stack:x" cannot get '
               'resource "secrets"')
    fake.fail_next["read_secret"] = [Forbidden(403, "Forbidden", message)]
    with pytest.raises(Forbidden, match="cannot get resource"):
        TlsManager(fake, settings(tmp_path)).reconcile()


def test_settings_refuse_a_renewal_window_longer_than_the_lifetime(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="renewed before it expires"):
        settings(tmp_path, cert_validity=10 * DAY, cert_renew_before=30 * DAY)


# --- one webhook configuration (the other half as CEL policies) --------------------------------------------


def test_with_validation_in_cel_only_the_mutating_configuration_is_patched_and_owns_the_secret(tmp_path: Path) -> None:
    """webhook.validation.mode=cel renders no ValidatingWebhookConfiguration: the replica is ready with the
    mutating one alone, which then owns the Secret."""
    fake = FakeKube()
    fake.add_webhook_configuration(MUTATING, CONFIG, ["mutate.gpu-stack.io"])
    s = SelfManagedTls(namespace=NS, secret_name=SECRET, service_name=SVC, mutating_configuration=CONFIG,
                 validating_configuration="", cert_dir=tmp_path / "tls")
    status = TlsManager(fake, s).reconcile()
    assert status.ready
    assert stored(fake).owner_references[0]["kind"] == MUTATING
    assert set(fake.configs[(MUTATING, CONFIG)].ca_bundles.values()) == {stored(fake).data[CA_CRT]}


def test_a_deleted_secret_is_made_again_as_soon_as_the_watch_says_so(tmp_path: Path) -> None:
    from gpu_stack_webhook.tls.selfmanaged import Renewer  # noqa: PLC0415

    fake = standard_fake()
    s = settings(tmp_path)
    manager = TlsManager(fake, s)
    assert manager.reconcile().ready
    old_ca = stored(fake).data[CA_CRT]
    changed = threading.Event()

    def changes(seconds: float) -> bool:  # the watch: returns when the Secret changes
        assert seconds > 3000  # without the watch the next check would be an hour away
        return changed.wait(seconds)

    renewer = Renewer(manager, interval=3600, changes=changes)
    renewer.start()
    try:
        del fake.secrets[(s.namespace, s.secret_name)]
        changed.set()
        deadline = datetime.datetime.now() + datetime.timedelta(seconds=10)
        while (s.namespace, s.secret_name) not in fake.secrets and datetime.datetime.now() < deadline:
            threading.Event().wait(0.05)
        new_ca = stored(fake).data[CA_CRT]
        assert new_ca != old_ca
        assert_served_cert_is_trusted(fake, s)
    finally:
        renewer.stop()


def test_a_watch_that_fails_falls_back_to_the_interval_with_one_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from gpu_stack_webhook.tls.selfmanaged import Renewer  # noqa: PLC0415

    calls = []

    def forbidden(seconds: float) -> bool:
        calls.append(seconds)
        raise ApiUnavailable(403, "Forbidden", "secrets is forbidden: cannot watch")

    renewer = Renewer(TlsManager(standard_fake(), settings(tmp_path)), interval=0.05, changes=forbidden)
    renewer.start()
    threading.Event().wait(0.5)
    renewer.stop()
    assert len(calls) == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["TLS Secret watch failed (checking every 0 s instead): ApiUnavailable: 403 Forbidden: "
                        "secrets is forbidden: cannot watch"]
