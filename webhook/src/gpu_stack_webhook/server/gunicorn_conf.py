"""Production gunicorn settings for `gpu-stack-webhook serve`, built in code (no config file to mount).

* gthread workers with the TLS handshake and the wait for a request on the poller (worker.py),
  one listening socket per worker (reuse_port: the kernel spreads connections over the workers) where the
  runtime allows a second SO_REUSEPORT bind, else one listening socket shared by the workers (listeners.py)
  (default 2 x 4 threads; $GPU_STACK_WEBHOOK_WORKERS / $GPU_STACK_WEBHOOK_THREADS or
  --workers / --threads): the policy is CPU-light, threads cover concurrent apiserver connections.
* keep-alive 100 s: longer than the apiserver's idle timeout for webhook connections (Go's 90 s
  IdleConnTimeout), so the client, not the server, closes idle connections and never races a close.
* timeout 30 s (the apiserver gives up after timeoutSeconds <= 30), graceful_timeout 25 s (inside
  the pod's default 30 s terminationGracePeriodSeconds).
* TLS from certfile/keyfile with TLS 1.2 as the minimum, set in the `ssl_context` hook (gunicorn >= 21;
  `ssl_version` is deprecated and ignored by gunicorn 27).
* preload_app: the app (and the policy) is built in the master before any socket is bound or worker
  forked; `serve` also validates the policy before starting gunicorn at all.
* access log off (one JSON decision line per review instead); gunicorn's own log as JSON lines, all written
  by python-json-logger's OrjsonFormatter with a shortcut for the decision lines (json_logging.py).
* Prometheus multiprocess mode: a fresh PROMETHEUS_MULTIPROC_DIR created in the master, increments
  buffered per worker (metric_values.py) and flushed in worker_exit, dead workers marked in child_exit,
  the directory removed on exit.
"""

from __future__ import annotations

import logging
import os
import shutil
import ssl
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gunicorn import glogging
from prometheus_client import multiprocess
from prometheus_client import values as prometheus_values

from gpu_stack_webhook.server import listeners, metric_values, slowclients
from gpu_stack_webhook.settings import DEFAULT_REQUEST_TIMEOUT, DEFAULT_THREADS, DEFAULT_WORKERS, WebhookSettings
from gpu_stack_webhook.tls import serving as tls_serving

# prometheus_client's variable: where multiprocess values live (it reads it when a value opens its file).
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
WORKER_CLASS = "gpu_stack_webhook.server.worker.PollingThreadWorker"
KEEPALIVE_SECONDS = 100
TIMEOUT_SECONDS = 30
GRACEFUL_TIMEOUT_SECONDS = 25
# An AdmissionReview is one POST with a handful of headers.
LIMIT_REQUEST_LINE = 4094
LIMIT_REQUEST_FIELDS = 50
LIMIT_REQUEST_FIELD_SIZE = 8190

# (pid of the master that created it, path): worker processes unwind through the same frames when
# they exit (SystemExit), and must not remove the directory the master and its other workers use.
_owned_metrics_dir: list[tuple[int, str]] = []


@dataclass(frozen=True)
class ServeOptions:
    bind: str
    certfile: str
    keyfile: str
    workers: int = DEFAULT_WORKERS
    threads: int = DEFAULT_THREADS
    log_level: str = "info"
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT  # slowclients.py

    @classmethod
    def from_settings(
        cls, settings: WebhookSettings, *, bind: str, certfile: str, keyfile: str, workers: int | None = None,
        threads: int | None = None, log_level: str = "info",
    ) -> ServeOptions:
        """Flags win over the environment (`settings`), which has the defaults."""
        return cls(
            bind=bind,
            certfile=certfile,
            keyfile=keyfile,
            workers=workers if workers is not None else settings.workers,
            threads=threads if threads is not None else settings.threads,
            log_level=log_level,
            request_timeout=settings.request_timeout,
        )


def ssl_context(conf: Any, default_ssl_context_factory: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
    """gunicorn hook: the server's context (tls/serving.py: TLS 1.2 as the floor, a renewed certificate
    picked up on the next handshake)."""
    certfile, keyfile = getattr(conf, "certfile", None), getattr(conf, "keyfile", None)
    return tls_serving.server_context(default_ssl_context_factory, certfile if isinstance(certfile, str) else None,
                                      keyfile if isinstance(keyfile, str) else None)


def prepare_metrics_dir() -> str:
    """Create an empty multiprocess metrics directory for this master, export it and switch
    prometheus_client to file-backed values. prometheus_client picks its value class from the variable
    when first imported; its metrics look `values.ValueClass` up each time they create a value, so
    setting it again here (as prometheus_client's own tests switch modes) makes every metric created
    from now on, in this master and its forked workers, write to the directory: through values that
    buffer increments in memory and flush them once a second, at /metrics and at worker exit
    (metric_values.py)."""
    path = tempfile.mkdtemp(prefix="gpu-stack-metrics-")
    os.environ[MULTIPROC_ENV] = path
    prometheus_values.ValueClass = metric_values.buffered_value_class()
    _owned_metrics_dir.append((os.getpid(), path))
    return path


def remove_metrics_dir() -> None:
    """Remove the directory this process created, and go back to in-memory values (a no-op in forked
    workers)."""
    for owner, path in list(_owned_metrics_dir):
        if owner == os.getpid():
            shutil.rmtree(path, ignore_errors=True)
            _owned_metrics_dir.remove((owner, path))
            os.environ.pop(MULTIPROC_ENV, None)
            prometheus_values.ValueClass = prometheus_values.get_value_class()  # type: ignore[no-untyped-call,unused-ignore]


def child_exit(server: Any, worker: Any) -> None:
    """gunicorn hook (master): forget the live-gauge files of a dead worker; counters keep counting."""
    for owner, path in _owned_metrics_dir:
        if owner == os.getpid():
            multiprocess.mark_process_dead(worker.pid, path)  # type: ignore[no-untyped-call,unused-ignore]


def worker_exit(server: Any, worker: Any) -> None:
    """gunicorn hook (the exiting worker): write the increments not flushed yet to its metrics file."""
    metric_values.flush_all()


def on_exit(server: Any) -> None:
    remove_metrics_dir()


class Logger(glogging.Logger):  # type: ignore[misc,unused-ignore]
    """gunicorn's logger with the access log switched off: every review gets a decision line instead."""

    def access(self, resp: Any, req: Any, environ: Any, request_time: Any) -> None:
        return None



def lean_log_records() -> None:
    """Log records without what no line of ours prints: the caller's file, line and function (found by
    walking the stack for every record: `Logger.findCaller`), the thread and process names. The JSON lines
    carry time, level, logger, message and the `extra` fields only (logging_config), so nothing changes in
    them; a decision line (server/decision_log.py) costs about a tenth less. These are the switches the
    logging HOWTO names for this ("Optimization": `logging._srcfile = None`, `logThreads`, `logProcesses`,
    `logMultiprocessing`); `serve` sets them once, before gunicorn starts."""
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False


def logging_config(level: str = "INFO") -> dict[str, Any]:
    """dictConfig for JSON lines on stderr: our loggers and gunicorn's error log (access log is off)."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "json": {
                "()": "gpu_stack_webhook.server.json_logging.JsonLineFormatter",
                "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s",
                "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
            }
        },
        "handlers": {
            "stderr": {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}
        },
        "root": {"level": level, "handlers": ["stderr"]},
        "loggers": {
            "gunicorn.error": {"level": level, "handlers": [], "propagate": True},
            "gunicorn.access": {"level": "WARNING", "handlers": [], "propagate": False},
        },
    }


def settings(options: ServeOptions) -> dict[str, Any]:
    """The gunicorn settings (names as in gunicorn's config)."""
    return {
        "bind": [options.bind],
        # gthread with the TLS handshake and the wait for a request on its poller (worker.py).
        "worker_class": WORKER_CLASS,
        # One listening socket per worker (SO_REUSEPORT): the kernel spreads new connections over the
        # workers, instead of whichever worker wakes first taking a whole burst of them. Where the runtime
        # refuses that (gVisor), the workers share the master's socket rather than crash-loop (listeners.py).
        "reuse_port": listeners.reuse_port_works(options.bind),
        "workers": options.workers,
        "threads": options.threads,
        "keepalive": KEEPALIVE_SECONDS,
        "timeout": TIMEOUT_SECONDS,
        "graceful_timeout": GRACEFUL_TIMEOUT_SECONDS,
        "certfile": options.certfile,
        "keyfile": options.keyfile,
        "ssl_context": ssl_context,
        "limit_request_line": LIMIT_REQUEST_LINE,
        "limit_request_fields": LIMIT_REQUEST_FIELDS,
        "limit_request_field_size": LIMIT_REQUEST_FIELD_SIZE,
        "preload_app": True,
        "accesslog": None,
        "logger_class": Logger,
        "logconfig_dict": logging_config(options.log_level.upper()),
        "loglevel": options.log_level,
        "child_exit": child_exit,
        "worker_exit": worker_exit,
        # A per-request deadline so slow clients cannot pin every gthread thread (slowclients.py).
        "post_worker_init": slowclients.deadlines_hook(options.request_timeout),
        "on_exit": on_exit,
        "proc_name": "gpu-stack-webhook",
        # The gunicornc control socket would need a writable $HOME; nothing here uses it.
        "control_socket_disable": True,
    }
