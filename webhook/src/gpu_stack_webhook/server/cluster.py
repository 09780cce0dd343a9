"""What `gpu-stack-webhook serve` needs from the cluster: self-managed TLS and API lookups.

`add_arguments` adds the flags to the `serve` parser; `connect(args)` makes the API access, the facts for
the rules and the live policy source (`serve` builds its Policy with them); `prepare(args, connection)`
runs before gunicorn binds and returns where the certificate is, the /readyz hook and extra gunicorn hooks:

* `--tls-mode files` (default): --cert/--key are read as they are (cert-manager or a user Secret mounted
  by the chart); a renewed pair on disk is picked up by tls/serving.py.
* `--tls-mode self-managed`: tls/startup.py sets up the Secret, CA, serving certificate and caBundle now,
  writes the pair to --cert-dir and makes the /readyz hook and the renewal thread (started in `when_ready`).
* `--cluster-lookups`: the rules may read ConfigMaps and namespace labels (kube/lookups.py), with a short
  request timeout and a TTL cache.
"""

from __future__ import annotations

import argparse
import datetime
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_stack_webhook.kube.client import DEFAULT_TIMEOUT, KubernetesClientApi
from gpu_stack_webhook.kube.live import (
    DevicePluginReader,
    LastGood,
    OperatorReader,
    Reader,
    RuntimeClassReader,
    add_source_arguments,
)
from gpu_stack_webhook.kube.lookups import ApiFacts, OwnerFacts
from gpu_stack_webhook.policy.facts import OFFLINE, ClusterFacts
from gpu_stack_webhook.tls import startup as tls_startup
from gpu_stack_webhook.tls.config import SelfManagedTls

SA_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
DEFAULT_CERT_DIR = "/run/gpu-stack/tls"
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(text: str) -> datetime.timedelta:
    """'90d', '2160h', '10m', '30s', '500ms' (argparse type)."""
    match = _DURATION.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"not a duration (e.g. 2160h, 30d, 10m, 5s): {text!r}")
    return datetime.timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2)])


def add_arguments(srv: argparse.ArgumentParser) -> None:
    tls = srv.add_argument_group("TLS")
    tls.add_argument("--tls-mode", choices=["files", "self-managed"], default="files",
                     help="files: serve --cert/--key as given; self-managed: keep a CA and certificate in a "
                          "Secret and patch the webhook configurations' caBundle (default %(default)s)")
    tls.add_argument("--cert-dir", default=DEFAULT_CERT_DIR,
                     help="self-managed: where tls.crt/tls.key are written (default %(default)s)")
    tls.add_argument("--tls-secret", help="self-managed: the Secret holding CA and certificate")
    tls.add_argument("--namespace", help="self-managed: the Secret's namespace (default $POD_NAMESPACE, else "
                                         "the pod's ServiceAccount namespace)")
    tls.add_argument("--service", help="self-managed: the webhook Service name (certificate DNS names)")
    tls.add_argument("--mutating-webhook-configuration", help="self-managed: name to patch caBundle into")
    tls.add_argument("--validating-webhook-configuration", help="self-managed: name to patch caBundle into "
                                                                "(also the Secret's owner)")
    tls.add_argument("--cert-validity", type=duration, default=duration("90d"))
    tls.add_argument("--cert-renew-before", type=duration, default=duration("30d"))
    tls.add_argument("--ca-validity", type=duration, default=duration("1825d"))
    tls.add_argument("--ca-renew-before", type=duration, default=duration("365d"))
    tls.add_argument("--ca-overlap", type=duration, default=duration("1h"),
                     help="time a new CA is in the caBundle before it signs (default 1h)")
    tls.add_argument("--tls-check-interval", type=duration, default=duration("10m"),
                     help="how often the master re-checks Secret and caBundle (default 10m)")
    api = srv.add_argument_group("Kubernetes API")
    api.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster ServiceAccount)")
    api.add_argument("--cluster-lookups", action="store_true",
                     help="let the rules read envFrom ConfigMaps and namespace Pod Security labels")
    api.add_argument("--lookup-timeout", type=duration, default=duration("2s"))
    api.add_argument("--lookup-ttl", type=duration, default=duration("30s"))
    live = srv.add_argument_group("Policy source (docs/gpu-operator.md)")
    add_source_arguments(live, "file", "file: the sharing configs of --config")
    live.add_argument("--policy-source-interval", type=duration, default=duration("2s"),
                      help="how often the live configuration is read (default 2s)")
    live.add_argument("--policy-source-keep", type=duration, default=duration("10s"),
                      help="how long the last good read of the live configuration and the RuntimeClasses is used "
                           "while the API server does not answer, before GPU pods are denied (default 10s)")
    live.add_argument("--runtime-classes", choices=["names", "live"], default="names",
                      help="which RuntimeClasses select the NVIDIA runtime: names: those of the policy's "
                           "gpuRuntimeClassNames; live: also every RuntimeClass whose handler is one of its "
                           "nvidiaRuntimeHandlers, read every --policy-source-interval (default %(default)s)")


def _namespace(args: argparse.Namespace, pod_namespace: str | None) -> str:
    if args.namespace:
        return str(args.namespace)
    if pod_namespace:
        return pod_namespace
    try:
        return SA_NAMESPACE_FILE.read_text(encoding="utf-8").strip()
    except OSError:
        raise ValueError("--namespace is required (no $POD_NAMESPACE, no ServiceAccount namespace file)") from None


@dataclass(frozen=True)
class Connection:
    api: KubernetesClientApi | None = None  # None when nothing asked for the API
    facts: ClusterFacts = OFFLINE
    # --policy-source other than file, --runtime-classes live: the reader of the live configuration (kube/live.py).
    live: OperatorReader | DevicePluginReader | RuntimeClassReader | None = None


@dataclass
class Prepared:
    certfile: str
    keyfile: str
    readiness: Callable[[], bool] | None = None
    gunicorn_settings: dict[str, Any] = field(default_factory=dict)


def settings_from(args: argparse.Namespace, pod_namespace: str | None = None) -> SelfManagedTls:
    missing = [flag for flag, value in (
        ("--tls-secret", args.tls_secret), ("--service", args.service)) if not value]
    if not (args.mutating_webhook_configuration or args.validating_webhook_configuration):
        missing.append("--mutating-webhook-configuration or --validating-webhook-configuration")
    if missing:
        raise ValueError(f"--tls-mode self-managed needs {', '.join(missing)}")
    return SelfManagedTls(
        namespace=_namespace(args, pod_namespace), secret_name=args.tls_secret, service_name=args.service,
        mutating_configuration=args.mutating_webhook_configuration or "",
        validating_configuration=args.validating_webhook_configuration or "",
        cert_dir=Path(args.cert_dir), cert_validity=args.cert_validity, cert_renew_before=args.cert_renew_before,
        ca_validity=args.ca_validity, ca_renew_before=args.ca_renew_before, ca_overlap=args.ca_overlap,
    )


def connect(args: argparse.Namespace) -> Connection:
    """The API access the flags ask for. Raises ValueError with a message for the user when it cannot be
    configured."""
    needs_api = (args.tls_mode == "self-managed" or args.cluster_lookups or args.policy_source != "file"
                 or args.runtime_classes == "live")
    if not needs_api:
        return Connection()
    try:
        api = KubernetesClientApi.from_environment(args.kubeconfig, DEFAULT_TIMEOUT)
    except Exception as exc:
        raise ValueError(f"cannot configure Kubernetes API access: {exc}") from None
    facts: ClusterFacts = OFFLINE
    if args.cluster_lookups:
        timeout = args.lookup_timeout.total_seconds()
        facts = ApiFacts(KubernetesClientApi(api.api_client, (timeout, timeout)), ttl=args.lookup_ttl.total_seconds())
    elif args.policy_source == "gpu-operator":  # the operator's own pods are told by their DaemonSet
        timeout = args.lookup_timeout.total_seconds()
        facts = OwnerFacts(KubernetesClientApi(api.api_client, (timeout, timeout)), ttl=args.lookup_ttl.total_seconds())
    return Connection(api=api, facts=facts, live=live_reader(args, api))


def prepare(args: argparse.Namespace, connection: Connection, pod_namespace: str | None = None) -> Prepared:
    """Raises ValueError with a message for the user when something cannot be set up. `pod_namespace`
    ($POD_NAMESPACE, settings.py) is the Secret's namespace when --namespace is not given."""
    if args.tls_mode != "self-managed":
        if not (args.cert and args.key):
            raise ValueError("--cert and --key are required unless --tls-mode self-managed")
        return Prepared(certfile=args.cert, keyfile=args.key)
    assert connection.api is not None
    serving = tls_startup.start(connection.api, settings_from(args, pod_namespace),
                                args.tls_check_interval.total_seconds())
    return Prepared(certfile=serving.certfile, keyfile=serving.keyfile, readiness=serving.readiness,
                    gunicorn_settings={"when_ready": serving.when_ready})


def live_reader(args: argparse.Namespace, api: KubernetesClientApi
                ) -> OperatorReader | DevicePluginReader | RuntimeClassReader | None:
    """The reader of --policy-source and --runtime-classes (None for `file` and `names`), with the lookups'
    short request timeout."""
    timeout = args.lookup_timeout.total_seconds()
    reads = KubernetesClientApi(api.api_client, (timeout, timeout))
    keep = args.policy_source_keep.total_seconds()
    source: OperatorReader | DevicePluginReader | None = None
    if args.policy_source == "gpu-operator":
        source = OperatorReader(reads, args.cluster_policy, args.operator_namespace, args.operator_service_account,
                                kept=LastGood("gpu-operator", keep))
    elif args.policy_source == "device-plugin":
        namespace, _, name = (args.plugin_configmap or "").partition("/")
        if not (namespace and name):
            raise ValueError("--policy-source device-plugin needs --plugin-configmap NAMESPACE/NAME")
        source = DevicePluginReader(reads, namespace, name, args.plugin_default_config,
                                    kept=LastGood("device-plugin", keep))
    if args.runtime_classes == "live":
        inner: Reader | None = source
        return RuntimeClassReader(reads, inner, kept=LastGood("runtime-classes", keep))
    return source
