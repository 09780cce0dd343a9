"""`gpu-stack-webhook serve` refuses to start, before binding, when its inputs are wrong."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from gpu_stack_webhook.cli import main as cli_main
from gpu_stack_webhook.cli.main import build_parser

from .tls_helpers import Pki, cli_command, free_port, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def serve(tmp_path: Path, pki: Pki, *extra: str, config: str | None = None) -> subprocess.CompletedProcess[str]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(config if config is not None else "{}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PROMETHEUS_MULTIPROC_DIR", "GPU_STACK_WEBHOOK_CONFIG")}
    env["TMPDIR"] = str(tmp_path)
    return subprocess.run(
        [*cli_command(), "serve", "--config", str(policy), "--cert", str(pki.cert), "--key", str(pki.key),
         "--bind", f"127.0.0.1:{free_port()}", *extra],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )


def never_served(result: subprocess.CompletedProcess[str]) -> bool:
    output = result.stdout + result.stderr
    return "Listening at" not in output and "Booting worker" not in output and "Traceback" not in output


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ("maxRequestBytes: 10\n", "maxRequestBytes"),
        ("bogusKey: 1\n", "bogusKey"),
        ("sharing:\n  configs:\n    default:\n      flags:\n        migStrategy: sometimes\n",
         "sharing.configs.default.flags.migStrategy"),
        ("rules:\n  disabled: [GPU404]\n", "rules"),
        ("- not\n- a mapping\n", "must be a mapping"),
    ],
)
def test_a_bad_policy_stops_serve_before_it_listens(tmp_path: Path, pki: Pki, config: str, key: str) -> None:
    result = serve(tmp_path, pki, config=config)
    assert result.returncode == 2
    assert key in result.stderr
    assert never_served(result)
    assert not list(tmp_path.glob("gpu-stack-metrics-*"))


def test_an_unreadable_policy_file_stops_serve(tmp_path: Path, pki: Pki) -> None:
    policy = tmp_path / "missing.yaml"
    result = subprocess.run(
        [*cli_command(), "serve", "--config", str(policy), "--cert", str(pki.cert), "--key", str(pki.key),
         "--bind", f"127.0.0.1:{free_port()}"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 2
    assert "missing.yaml: cannot read policy config" in result.stderr
    assert never_served(result)


def test_a_key_that_does_not_match_the_certificate_stops_serve(tmp_path: Path, pki: Pki) -> None:
    other = make_pki(tmp_path / "other")
    result = serve(tmp_path, pki, "--key", str(other.key))
    assert result.returncode == 2
    assert "cannot be used" in result.stderr
    assert never_served(result)


def test_a_missing_certificate_stops_serve(tmp_path: Path, pki: Pki) -> None:
    result = serve(tmp_path, pki, "--cert", str(tmp_path / "nope.crt"))
    assert result.returncode == 2
    assert "nope.crt" in result.stderr
    assert never_served(result)


def test_a_bad_worker_count_from_the_environment_stops_serve(
    tmp_path: Path, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPU_STACK_WEBHOOK_WORKERS", "many")
    result = serve(tmp_path, pki)
    assert result.returncode == 2
    assert "GPU_STACK_WEBHOOK_WORKERS" in result.stderr
    assert never_served(result)


def test_serve_flags_are_those_the_chart_passes() -> None:
    args = build_parser().parse_args(
        ["serve", "--config", "/etc/gpu-stack/policy/policy.yaml", "--cert", "/etc/gpu-stack/tls/tls.crt",
         "--key", "/etc/gpu-stack/tls/tls.key", "--bind", "0.0.0.0:8443"]
    )
    assert (args.config, args.cert, args.key, args.bind) == (
        "/etc/gpu-stack/policy/policy.yaml", "/etc/gpu-stack/tls/tls.crt", "/etc/gpu-stack/tls/tls.key", "0.0.0.0:8443"
    )
    assert args.workers is None and args.threads is None  # environment, then defaults


@pytest.mark.parametrize("flag", ["--workers", "--threads"])
def test_worker_and_thread_counts_must_be_positive(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["serve", "--cert", "c", "--key", "k", flag, "0"])
    assert exit_info.value.code == 2
    assert "positive" in capsys.readouterr().err


def test_serve_builds_the_policy_once_and_serves_that_one(tmp_path: Path, pki: Pki,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[Any] = []
    load_policy = cli_main._load_policy

    def recorded(*args: Any, **kwargs: Any) -> Any:
        built.append(load_policy(*args, **kwargs))
        return built[-1]

    served: list[Any] = []
    monkeypatch.setattr(cli_main, "_load_policy", recorded)
    # Instead of gunicorn's arbiter: what its master loads once (preload_app) before forking the workers.
    monkeypatch.setattr(cli_main.BaseApplication, "run", lambda self: served.append(self.load()))
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    monkeypatch.delenv("GPU_STACK_WEBHOOK_CONFIG", raising=False)
    policy = tmp_path / "policy.yaml"
    policy.write_text("rules:\n  disabled: [GPU002]\n")
    args = build_parser().parse_args(["serve", "--config", str(policy), "--cert", str(pki.cert), "--key", str(pki.key)])
    assert cli_main.serve(args) == 0
    [review_routes] = served
    assert len(built) == 1
    assert review_routes.policy() is built[0]
