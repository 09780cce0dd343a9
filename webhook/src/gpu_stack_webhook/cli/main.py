"""`gpu-stack-webhook`: serve the webhook (gunicorn over TLS), check manifests offline, or inspect the
cluster's GPUs (gpuinspect/command.py; the same command is the kubectl plugin `kubectl gpu-stack inspect`).

    gpu-stack-webhook serve --config policy.yaml --cert tls.crt --key tls.key --bind 0.0.0.0:8443
    gpu-stack-webhook check -f manifests/ [-f pod.yaml ...] [--config policy.yaml]
    gpu-stack-webhook inspect [-o wide|json|yaml] [--node NAME] [-l SELECTOR] [-n NAMESPACE]

`check` sends every object through the same code as the HTTP endpoints (an AdmissionReview built by
`admission_review`, answered by admission/pipeline.py, the response bytes decoded as the API server
decodes them): the mutating pass, its JSONPatch applied, then the validating pass on the patched
object. Exit status: 0 all allowed, 1 something denied, 2 input or config unreadable (takes
precedence: the results are incomplete).
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import json
import logging.config
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import jsonpatch
import orjson
import yaml
from gunicorn.app.base import BaseApplication

from gpu_stack_webhook.admission.decide import Endpoint
from gpu_stack_webhook.admission.pipeline import Reply, answer_document
from gpu_stack_webhook.admission.requests import admission_review
from gpu_stack_webhook.cel.check import evaluate_object
from gpu_stack_webhook.gpuinspect import command as inspect_command
from gpu_stack_webhook.policy.config import ConfigError, PolicyConfig, load_config
from gpu_stack_webhook.policy.engine import Policy
from gpu_stack_webhook.policy.facts import OFFLINE, ClusterFacts, DocumentFacts
from gpu_stack_webhook.server import cluster, gunicorn_conf
from gpu_stack_webhook.server.app import AppConfig, create_app
from gpu_stack_webhook.server.review_routes import WsgiApp
from gpu_stack_webhook.settings import load_settings
from gpu_stack_webhook.tls.serving import check_pair

PROG = "gpu-stack-webhook"
WEBHOOK_NAMES = {"mutate": "mutate.gpu-stack.io", "validate": "validate.gpu-stack.io"}
YAML_SUFFIXES = (".yaml", ".yml")
EXIT_OK, EXIT_DENIED, EXIT_INPUT = 0, 1, 2


def _fail(message: str) -> int:
    print(f"{PROG}: {message}", file=sys.stderr)
    return EXIT_INPUT


def _load_policy(path: str | None, config: PolicyConfig | None = None, facts: ClusterFacts = OFFLINE) -> Policy:
    """The policy file at `path` (None: built-in defaults; `config`: as already read from it), compiled: a
    rule ID in `rules.disabled` that does not exist is found when the Policy is built (engine.py). Raises
    ConfigError naming the key."""
    config = config if config is not None else load_config(path)
    try:
        return Policy(config, facts=facts)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}" if path else str(exc)) from None


# --- serve --------------------------------------------------------------------------------------------


def serve(args: argparse.Namespace) -> int:
    try:
        settings = load_settings()
        config_path = args.config or settings.policy_path
        config = load_config(config_path)
        # the setup logs as gunicorn will: JSON lines
        if args.tls_mode != "files" or args.cluster_lookups or args.policy_source != "file" or \
                args.runtime_classes == "live":
            logging.config.dictConfig(gunicorn_conf.logging_config(args.log_level.upper()))
        connection = cluster.connect(args)
        # Built once, here: the app serves this Policy (AppConfig.built) until the policy file changes.
        policy = _load_policy(config_path, config, connection.facts)
        # self-managed TLS: Secret, caBundle and files, before binding
        prepared = cluster.prepare(args, connection, settings.pod_namespace)
        check_pair(prepared.certfile, prepared.keyfile)
        options = gunicorn_conf.ServeOptions.from_settings(
            settings, bind=args.bind, certfile=prepared.certfile, keyfile=prepared.keyfile, workers=args.workers,
            threads=args.threads, log_level=args.log_level,
        )
    except (ConfigError, ValueError) as exc:
        return _fail(str(exc))

    gunicorn_conf.lean_log_records()  # no caller lookup per log line (gunicorn_conf.py)
    # /metrics aggregates what every gunicorn worker writes to this directory.
    settings = settings.model_copy(update={"prometheus_multiproc_dir": gunicorn_conf.prepare_metrics_dir()})
    try:
        app_config = AppConfig(policy=policy.config, policy_path=config_path, facts=connection.facts,
                               settings=settings, live=connection.live, built=policy,
                               live_interval=args.policy_source_interval.total_seconds())
        if prepared.readiness is not None:  # self-managed TLS: ready once served and caBundle in place
            app_config = dataclasses.replace(app_config, readiness=prepared.readiness)

        class WebhookServer(BaseApplication):  # type: ignore[misc,unused-ignore]
            def load_config(self) -> None:
                for name, value in {**gunicorn_conf.settings(options), **prepared.gunicorn_settings}.items():
                    self.cfg.set(name, value)

            def load(self) -> WsgiApp:
                # The review routes' dispatch itself (Flask's __call__ only hands every request to it): one
                # interpreted call less per review; everything else still goes on to the Flask app.
                return create_app(app_config).wsgi_app

        WebhookServer(prog=PROG).run()
    finally:
        gunicorn_conf.remove_metrics_dir()
    return EXIT_OK


# --- check --------------------------------------------------------------------------------------------


@dataclass
class CheckResult:
    source: str
    ref: str
    outcome: str  # allowed | patched | denied | skipped
    detail: str = ""
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    patch: list[dict[str, Any]] = field(default_factory=list)
    # What the webhook sent back, pass by pass (mutate, then validate unless mutate denied).
    replies: list[Reply] = field(default_factory=list, repr=False)

    def lines(self) -> Iterator[str]:
        yield f"{self.ref} ({self.source}): {self.outcome}" + (f" ({self.detail})" if self.detail else "")
        yield from (f"Warning: {w}" for w in self.warnings)
        yield from self.errors
        if self.patch:
            yield "JSONPatch:"
            yield from (f"  {json.dumps(op, separators=(',', ':'))}" for op in self.patch)


def _ref(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    assert isinstance(meta, Mapping)
    name = meta.get("name") or (f"{meta['generateName']}*" if meta.get("generateName") else "<unnamed>")
    return f"{str(obj.get('kind')).lower()}/{name}"


def check_object(policy: Policy, obj: Mapping[str, Any], source: str, namespace: str,
                 uid: str | None = None) -> CheckResult:
    """Both passes as the API server runs them; `uid` (default: random) for the reviews sent."""
    result = CheckResult(source=source, ref=_ref(obj), outcome="allowed")

    def send(endpoint: Endpoint, target: Any) -> dict[str, Any]:
        review = admission_review(target, namespace=namespace, dry_run=True, uid=uid)
        reply = answer_document(endpoint, review, policy)
        result.replies.append(reply)
        name = WEBHOOK_NAMES[endpoint.value]
        if reply.status != 200:  # the API server's failurePolicy: Fail
            result.outcome = "denied"
            result.errors.append(f'Error from server (InternalError): error when creating "{source}": Internal '
                                 f'error occurred: failed calling webhook "{name}": HTTP {reply.status} {reply.error}')
            return {"allowed": False}
        response: dict[str, Any] = orjson.loads(reply.body)["response"]
        result.warnings.extend(response.get("warnings", []))
        if not response["allowed"]:
            status = response.get("status") or {}
            result.outcome = "denied"
            result.errors.append(
                f'Error from server ({status.get("reason", "Forbidden")}): error when creating "{source}": '
                f'admission webhook "{name}" denied the request: '
                f'{status.get("message", "")}'
            )
        return response

    # as `kubectl create -n NAMESPACE`: an object that names its own namespace keeps it
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    assert isinstance(meta, Mapping)
    namespace = str(meta.get("namespace") or namespace)
    response = send(Endpoint.MUTATE, obj)
    if not response["allowed"]:
        return result
    target: Any = obj
    if "patch" in response:
        result.patch = json.loads(base64.b64decode(response["patch"]))
        target = jsonpatch.apply_patch(obj, result.patch)
        result.outcome = "patched"
    if not send(Endpoint.VALIDATE, target)["allowed"]:
        return result
    mutated, validated = (reply.decision for reply in result.replies)
    if mutated and validated and mutated.skipped and validated.skipped:
        result.outcome, result.detail = "skipped", validated.skipped
    return result


def check_object_cel(config: PolicyConfig, obj: Mapping[str, Any], source: str, namespace: str) -> CheckResult:
    """The chart's CEL admission policies instead of the webhook (cel/check.py)."""
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    assert isinstance(meta, Mapping)
    outcome = evaluate_object(config, obj, source, str(meta.get("namespace") or namespace))
    return CheckResult(source=source, ref=_ref(obj), outcome=outcome.outcome, detail=outcome.detail,
                       errors=outcome.errors, patch=outcome.patch)


def _yaml_files(path_arg: str) -> Iterator[Path]:
    path = Path(path_arg)
    if path.is_dir():
        yield from sorted(p for p in path.rglob("*") if p.suffix in YAML_SUFFIXES and p.is_file())
    else:
        yield path


def _objects(docs: Sequence[Any]) -> Iterator[tuple[int, Any]]:
    """Every object of the documents, `kind: *List` expanded; (document number, object)."""
    for number, doc in enumerate(docs, 1):
        if doc is None:
            continue
        kind = doc.get("kind") if isinstance(doc, Mapping) else None
        if isinstance(kind, str) and kind.endswith("List") and isinstance(doc.get("items"), list):
            for item in doc["items"]:
                yield number, item
        else:
            yield number, doc


def _read(source: str, stdin: IO[str]) -> list[Any]:
    text = stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    return list(yaml.safe_load_all(text))


def check(args: argparse.Namespace) -> int:
    try:
        policy = _load_policy(args.config or load_settings().policy_path)
    except (ConfigError, ValueError) as exc:
        return _fail(str(exc))
    unreadable = denied = False
    seen = 0
    for path_arg in args.filename:
        files = list(_yaml_files(path_arg)) if path_arg != "-" else [Path("-")]
        if not files:
            print(f"{PROG}: {path_arg}: no *.yaml or *.yml files", file=sys.stderr)
        for file in files:
            source = "STDIN" if str(file) == "-" else str(file)
            try:
                docs = _read(str(file), sys.stdin)
            except (OSError, UnicodeDecodeError) as exc:
                unreadable = True
                print(f"{PROG}: {source}: cannot read: {getattr(exc, 'strerror', None) or exc}", file=sys.stderr)
                continue
            except yaml.YAMLError as exc:
                unreadable = True
                print(f"{PROG}: {source}: not valid YAML: {exc}", file=sys.stderr)
                continue
            file_policy = policy
            claims = DocumentFacts((obj for _, obj in _objects(docs)), args.namespace)
            if claims.objects:  # a pod's claims are read from the other documents of the input
                file_policy = Policy(policy.config, facts=claims)
            for number, obj in _objects(docs):
                if not (isinstance(obj, Mapping) and obj.get("kind") and obj.get("apiVersion")):
                    unreadable = True
                    print(f"{PROG}: {source}: document {number} is not a Kubernetes object "
                          "(no apiVersion and kind)", file=sys.stderr)
                    continue
                seen += 1
                result = (check_object_cel(policy.config, obj, source, args.namespace) if args.engine == "cel"
                          else check_object(file_policy, obj, source, args.namespace))
                denied = denied or result.outcome == "denied"
                print("\n".join(result.lines()))
    if not seen and not unreadable:
        print(f"{PROG}: no objects found", file=sys.stderr)
    if unreadable:
        return EXIT_INPUT
    return EXIT_DENIED if denied else EXIT_OK


# --- entry point --------------------------------------------------------------------------------------


def _positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return number


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="gpu-stack admission webhook.")
    commands = parser.add_subparsers(dest="command", required=True)

    srv = commands.add_parser("serve", help="serve /mutate and /validate over TLS (gunicorn)")
    srv.add_argument("--config", help="policy file (default: $GPU_STACK_WEBHOOK_CONFIG, else built-in defaults)")
    srv.add_argument("--cert", help="TLS certificate chain (PEM); required unless --tls-mode self-managed")
    srv.add_argument("--key", help="TLS private key (PEM); required unless --tls-mode self-managed")
    srv.add_argument("--bind", default="0.0.0.0:8443", help="HOST:PORT to listen on (default %(default)s)")
    srv.add_argument("--workers", type=_positive, help="worker processes (default $GPU_STACK_WEBHOOK_WORKERS or 2)")
    srv.add_argument("--threads", type=_positive, help="threads per worker (default $GPU_STACK_WEBHOOK_THREADS or 4)")
    srv.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    cluster.add_arguments(srv)
    srv.set_defaults(func=serve)

    chk = commands.add_parser("check", help="evaluate manifests offline as if they were created")
    chk.add_argument("-f", "--filename", action="append", required=True,
                     help="YAML file or directory (recursive *.yaml, *.yml), or - for stdin; repeatable")
    chk.add_argument("--config", help="policy file (default: $GPU_STACK_WEBHOOK_CONFIG, else built-in defaults)")
    chk.add_argument("-n", "--namespace", default="default",
                     help="namespace for objects that name none (default %(default)s)")
    chk.add_argument("--engine", choices=["webhook", "cel"], default="webhook",
                     help="webhook: the webhook's mutating and validating passes (default); cel: the chart's "
                          "CEL admission policies (webhook.validation.mode/mutation.mode cel), as the API "
                          "server evaluates them")
    chk.set_defaults(func=check)

    ins = commands.add_parser("inspect", help="GPU nodes, their sharing mode and who holds what (also: "
                              "kubectl gpu-stack inspect)")
    inspect_command.add_arguments(ins)
    ins.set_defaults(func=inspect_command.run)
    return parser


# What a shell reports for a process killed by SIGPIPE (128 + 13): `check ... | head` stops reading.
EXIT_BROKEN_PIPE = 141


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        status: int = args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away: no traceback, and nothing more to write (Python would try again at
        # exit and complain), so point stdout at /dev/null.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    return status


if __name__ == "__main__":
    sys.exit(main())
