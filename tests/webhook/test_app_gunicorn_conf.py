"""The gunicorn settings `serve` runs with (gunicorn_conf), checked without starting a server."""

from __future__ import annotations

import os
import ssl
import types
from pathlib import Path

import pytest
from gpu_stack_webhook.server import gunicorn_conf
from gpu_stack_webhook.server.gunicorn_conf import ServeOptions, settings
from gunicorn.config import Config


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
    assert config.reuse_port is True  # one listening socket per worker: the kernel spreads connections
    assert config.worker_class.__name__ == "PollingThreadWorker"
    assert config.control_socket_disable is True


def test_workers_and_threads_come_from_flags_then_environment_then_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPU_STACK_WEBHOOK_WORKERS", raising=False)
    monkeypatch.delenv("GPU_STACK_WEBHOOK_THREADS", raising=False)
    base = {"bind": "b", "certfile": "c", "keyfile": "k"}
    default = ServeOptions.with_env_defaults(**base)
    assert (default.workers, default.threads) == (2, 4)
    monkeypatch.setenv("GPU_STACK_WEBHOOK_WORKERS", "3")
    monkeypatch.setenv("GPU_STACK_WEBHOOK_THREADS", "8")
    from_env = ServeOptions.with_env_defaults(**base)
    assert (from_env.workers, from_env.threads) == (3, 8)
    from_flags = ServeOptions.with_env_defaults(**base, workers=1, threads=2)
    assert (from_flags.workers, from_flags.threads) == (1, 2)


@pytest.mark.parametrize("raw", ["0", "-1", "two"])
def test_a_bad_worker_count_in_the_environment_is_refused(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("GPU_STACK_WEBHOOK_WORKERS", raw)
    with pytest.raises(ValueError, match="GPU_STACK_WEBHOOK_WORKERS"):
        ServeOptions.with_env_defaults(bind="b", certfile="c", keyfile="k")


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


def test_child_exit_marks_the_worker_dead(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "gauge_liveall_4242.db").write_bytes(b"")
    (tmp_path / "counter_4242.db").write_bytes(b"")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    gunicorn_conf.child_exit(None, types.SimpleNamespace(pid=4242))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["counter_4242.db"]
