"""The gunicorn settings `serve` runs with (gunicorn_conf), checked without starting a server."""

from __future__ import annotations

import os
import ssl
import types
from pathlib import Path

import pytest
from gpu_stack_webhook.server import gunicorn_conf, metric_values
from gpu_stack_webhook.server.gunicorn_conf import ServeOptions, settings
from gpu_stack_webhook.settings import load_settings
from gunicorn.config import Config
from prometheus_client import CollectorRegistry, Counter
from prometheus_client import values as prometheus_values
from prometheus_client.multiprocess import MultiProcessCollector


def options(**kw: object) -> ServeOptions:
    return ServeOptions(bind="127.0.0.1:8443", certfile="tls.crt", keyfile="tls.key", **kw)  # type: ignore[arg-type]


def test_every_setting_is_a_valid_gunicorn_setting() -> None:
    config = Config()
    for name, value in settings(options()).items():
        config.set(name, value)  # raises on an unknown name or an invalid value
    assert config.worker_class_str == "gpu_stack_webhook.server.worker.PollingThreadWorker"
    assert config.preload_app is True
    assert config.accesslog is None
    assert config.keepalive == gunicorn_conf.KEEPALIVE_SECONDS
    assert config.keepalive > 90  # the apiserver (Go net/http) drops idle connections after 90 s
    assert config.timeout == 30
    assert config.graceful_timeout < 30  # inside the default terminationGracePeriodSeconds
    assert config.limit_request_fields == 50
    assert config.is_ssl
    assert config.reuse_port is True  # one listening socket per worker where the kernel allows it
    assert config.worker_class.__name__ == "PollingThreadWorker"
    assert config.control_socket_disable is True


def test_workers_and_threads_come_from_flags_then_environment_then_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GPU_STACK_WEBHOOK_WORKERS", "GPU_STACK_WEBHOOK_THREADS", "GPU_STACK_WEBHOOK_REQUEST_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    base = {"bind": "b", "certfile": "c", "keyfile": "k"}
    default = ServeOptions.from_settings(load_settings(), **base)
    assert (default.workers, default.threads, default.request_timeout) == (2, 4, 15.0)
    monkeypatch.setenv("GPU_STACK_WEBHOOK_WORKERS", "3")
    monkeypatch.setenv("GPU_STACK_WEBHOOK_THREADS", "8")
    monkeypatch.setenv("GPU_STACK_WEBHOOK_REQUEST_TIMEOUT", "2.5")
    from_env = ServeOptions.from_settings(load_settings(), **base)
    assert (from_env.workers, from_env.threads, from_env.request_timeout) == (3, 8, 2.5)
    from_flags = ServeOptions.from_settings(load_settings(), **base, workers=1, threads=2)
    assert (from_flags.workers, from_flags.threads) == (1, 2)


def test_the_request_deadline_reaches_every_worker() -> None:
    # the hook gunicorn calls in each worker guards its requests with the configured deadline
    hook = settings(options(request_timeout=2.5))["post_worker_init"]
    worker = types.SimpleNamespace(tpool=object(), alive=False, handle=lambda conn: conn)
    hook(worker)
    assert worker.request_deadlines.timeout == 2.5
    assert worker.handle("conn") == "conn"


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (ssl.TLSVersion.MINIMUM_SUPPORTED, ssl.TLSVersion.TLSv1_2),
        (ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_2),
        (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_2),
        (ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_3),
    ],
)
def test_the_ssl_context_hook_sets_tls_1_2_as_the_floor(given: ssl.TLSVersion, expected: ssl.TLSVersion) -> None:
    def factory() -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        with pytest.warns(DeprecationWarning) if given == ssl.TLSVersion.TLSv1 else _nothing():
            context.minimum_version = given
        return context

    assert gunicorn_conf.ssl_context(None, factory).minimum_version == expected


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def test_the_metrics_dir_is_removed_only_by_the_process_that_made_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(gunicorn_conf.tempfile, "tempdir", None)
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    path = gunicorn_conf.prepare_metrics_dir()
    try:
        assert Path(path).parent == tmp_path
        assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == path
        real_pid = os.getpid()
        monkeypatch.setattr(gunicorn_conf.os, "getpid", lambda: real_pid + 1)  # as in a forked worker
        gunicorn_conf.remove_metrics_dir()
        assert Path(path).is_dir()
        monkeypatch.setattr(gunicorn_conf.os, "getpid", lambda: real_pid)
        gunicorn_conf.on_exit(None)
        assert not Path(path).exists()
    finally:
        monkeypatch.undo()
        gunicorn_conf.remove_metrics_dir()


def test_metrics_made_after_the_metrics_dir_is_prepared_are_written_there(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # prometheus_client was imported long before `serve` prepares the directory (as in `serve` itself,
    # which imports the app at module top): the metrics the app makes afterwards still live in files
    # that /metrics aggregates over the workers, and removing the directory goes back to memory.
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(gunicorn_conf.tempfile, "tempdir", None)
    path = gunicorn_conf.prepare_metrics_dir()
    try:
        Counter("probe", "A counter made after prepare_metrics_dir.", registry=CollectorRegistry()).inc(3)
        metric_values.flush_all()  # increments reach the file at the next flush (metric_values.py)
        assert [p.name for p in Path(path).glob("counter_*.db")] == [f"counter_{os.getpid()}.db"]
        aggregated = CollectorRegistry()
        MultiProcessCollector(aggregated, path=path)
        assert aggregated.get_sample_value("probe_total") == 3.0
    finally:
        gunicorn_conf.remove_metrics_dir()
    assert prometheus_values.ValueClass is prometheus_values.MutexValue
    assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ


def test_child_exit_marks_the_worker_dead(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "gauge_liveall_4242.db").write_bytes(b"")
    (tmp_path / "counter_4242.db").write_bytes(b"")
    monkeypatch.setattr(gunicorn_conf, "_owned_metrics_dir", [(os.getpid(), str(tmp_path))])
    gunicorn_conf.child_exit(None, types.SimpleNamespace(pid=4242))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["counter_4242.db"]
