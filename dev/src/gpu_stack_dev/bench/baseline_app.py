"""The allow-all baseline of `make bench`: the cost of serving an AdmissionReview at all.

A bare WSGI app that reads the body, parses the JSON, and answers `allowed: true` with the uid, served
by gunicorn with exactly the settings of `gpu-stack-webhook serve` (gunicorn_conf.settings: gthread
workers and threads, TLS hook, keep-alive, limits, JSON logging, preload, Prometheus directory), so the
only difference from the webhook is the policy work (and the Flask layer around it).

    python bench/baseline_app.py --cert tls.crt --key tls.key --bind 127.0.0.1:9443 [--workers N --threads N]
        [--mutate-answer '{"patchType": "JSONPatch", "patch": "...", "warnings": [...]}']

--mutate-answer: fields added to every /mutate response (the same answer for every request), so the
API server's own cost of applying a mutation can be measured apart from the webhook's
(bench/apiserver_load.py).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from typing import Any

import orjson
from gpu_stack_webhook.server import gunicorn_conf
from gpu_stack_webhook.settings import load_settings
from gunicorn.app.base import BaseApplication

API_VERSION = "admission.k8s.io/v1"
HEALTHY = b'{"status":"ok"}'
MUTATE_ANSWER: dict[str, Any] = {}


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    if environ["REQUEST_METHOD"] == "GET":
        out = HEALTHY
    else:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = orjson.loads(environ["wsgi.input"].read(length))
        uid = body["request"]["uid"]
        extra = MUTATE_ANSWER if environ.get("PATH_INFO") == "/mutate" else {}
        out = orjson.dumps(
            {"apiVersion": API_VERSION, "kind": "AdmissionReview",
             "response": {"uid": uid, "allowed": True, **extra}}
        )
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(out)))])
    return [out]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--bind", required=True)
    parser.add_argument("--workers", type=int)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--stock-gthread", action="store_true",
                        help="gunicorn's own gthread worker and one shared listening socket (the serving model "
                             "worker.PollingThreadWorker replaces), for before/after comparisons")
    parser.add_argument("--mutate-answer", type=orjson.loads, default={},
                        help="JSON object of fields added to every /mutate response (patch, warnings, ...)")
    args = parser.parse_args(argv)
    MUTATE_ANSWER.update(args.mutate_answer)
    options = gunicorn_conf.ServeOptions.from_settings(
        load_settings(), bind=args.bind, certfile=args.cert, keyfile=args.key, workers=args.workers,
        threads=args.threads,
    )
    gunicorn_conf.prepare_metrics_dir()
    settings = {**gunicorn_conf.settings(options), "proc_name": "gpu-stack-baseline"}
    if args.stock_gthread:
        settings |= {"worker_class": "gthread", "reuse_port": False}

    class BaselineServer(BaseApplication):  # type: ignore[misc]
        def load_config(self) -> None:
            for name, value in settings.items():
                self.cfg.set(name, value)

        def load(self) -> Callable[..., Any]:
            return app

    try:
        BaselineServer(prog="gpu-stack-baseline").run()
    finally:
        gunicorn_conf.remove_metrics_dir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
