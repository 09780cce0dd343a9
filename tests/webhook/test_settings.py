"""The environment, read in one place (settings.py): defaults, every variable, errors naming the variable,
and the table in docs/operations.md that lists them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from gpu_stack_webhook.cli.main import main
from gpu_stack_webhook.server.app import AppConfig
from gpu_stack_webhook.settings import (
    TerminalSettings,
    WebhookSettings,
    load_settings,
    load_terminal_settings,
    variables,
)

from .recordlib import REPO_ROOT

NAMES = [name for name, _, _ in variables(WebhookSettings) + variables(TerminalSettings)]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in NAMES:
        monkeypatch.delenv(name, raising=False)


def test_unset_means_the_defaults() -> None:
    assert load_settings() == WebhookSettings.model_construct(
        policy_path=None, workers=2, threads=4, reload_seconds=10.0, request_timeout=15.0,
        prometheus_multiproc_dir=None, pod_namespace=None,
    )
    assert load_terminal_settings() == TerminalSettings.model_construct(no_color="", term="")


@pytest.mark.parametrize("blank", ["", "   "])
def test_a_blank_value_means_the_default(monkeypatch: pytest.MonkeyPatch, blank: str) -> None:
    for name in NAMES:
        monkeypatch.setenv(name, blank)
    settings = load_settings()
    assert (settings.workers, settings.threads, settings.reload_seconds, settings.request_timeout) == (2, 4, 10.0, 15.0)
    assert settings.policy_path is None if blank == "" else settings.policy_path == blank


def test_every_variable_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    values = {
        "GPU_STACK_WEBHOOK_CONFIG": "/etc/gpu-stack/policy/policy.yaml",
        "GPU_STACK_WEBHOOK_WORKERS": "3",
        "GPU_STACK_WEBHOOK_THREADS": " 8 ",
        "GPU_STACK_WEBHOOK_RELOAD_SECONDS": "0",
        "GPU_STACK_WEBHOOK_REQUEST_TIMEOUT": "2.5",
        "PROMETHEUS_MULTIPROC_DIR": "/tmp/metrics",
        "POD_NAMESPACE": "gpu-stack",
        "NO_COLOR": "1",
        "TERM": "dumb",
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    assert load_settings() == WebhookSettings.model_construct(
        policy_path="/etc/gpu-stack/policy/policy.yaml", workers=3, threads=8, reload_seconds=0.0,
        request_timeout=2.5, prometheus_multiproc_dir="/tmp/metrics", pod_namespace="gpu-stack",
    )
    assert load_terminal_settings() == TerminalSettings.model_construct(no_color="1", term="dumb")
    assert sorted(values) == sorted(NAMES)


# (variable, value, the whole message) -- the texts envvars.env_number gave before settings.py
BAD = [
    ("GPU_STACK_WEBHOOK_WORKERS", "0", "$GPU_STACK_WEBHOOK_WORKERS must be an integer >= 1, got '0'"),
    ("GPU_STACK_WEBHOOK_WORKERS", "-1", "$GPU_STACK_WEBHOOK_WORKERS must be an integer >= 1, got '-1'"),
    ("GPU_STACK_WEBHOOK_WORKERS", "two", "$GPU_STACK_WEBHOOK_WORKERS must be an integer, got 'two'"),
    ("GPU_STACK_WEBHOOK_THREADS", "1.5", "$GPU_STACK_WEBHOOK_THREADS must be an integer, got '1.5'"),
    ("GPU_STACK_WEBHOOK_RELOAD_SECONDS", "-1", "$GPU_STACK_WEBHOOK_RELOAD_SECONDS must be a number >= 0.0, got '-1'"),
    ("GPU_STACK_WEBHOOK_RELOAD_SECONDS", "soon", "$GPU_STACK_WEBHOOK_RELOAD_SECONDS must be a number, got 'soon'"),
    ("GPU_STACK_WEBHOOK_RELOAD_SECONDS", "nan", "$GPU_STACK_WEBHOOK_RELOAD_SECONDS must be a finite number, got 'nan'"),
    ("GPU_STACK_WEBHOOK_REQUEST_TIMEOUT", "0", "$GPU_STACK_WEBHOOK_REQUEST_TIMEOUT must be a number > 0.0, got '0'"),
]


@pytest.mark.parametrize(("name", "value", "message"), BAD)
def test_a_bad_value_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, message: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as caught:
        load_settings()
    assert str(caught.value) == message


def test_every_bad_value_is_named_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_STACK_WEBHOOK_WORKERS", "0")
    monkeypatch.setenv("GPU_STACK_WEBHOOK_THREADS", "x")
    with pytest.raises(ValueError, match=r"WORKERS must be .*; \$GPU_STACK_WEBHOOK_THREADS must be"):
        load_settings()


def test_a_bad_webhook_variable_does_not_stop_inspect_colour(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_STACK_WEBHOOK_WORKERS", "many")
    monkeypatch.setenv("NO_COLOR", "1")
    assert load_terminal_settings().no_color == "1"


def test_the_policy_path_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `check` without --config and the app's loader read $GPU_STACK_WEBHOOK_CONFIG (the chart sets it)
    policy = tmp_path / "policy.yaml"
    policy.write_text("exemptNamespaces: [ops]\n", encoding="utf-8")
    pod = tmp_path / "pod.yaml"
    pod.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ops"},
                                   "spec": {"containers": [{"name": "c", "image": "i", "securityContext": {
                                       "privileged": True}, "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}),
                   encoding="utf-8")
    monkeypatch.setenv("GPU_STACK_WEBHOOK_CONFIG", str(policy))
    assert AppConfig.load().policy.exempt_namespaces == ("ops",)
    assert AppConfig.load().policy_path == str(policy)
    assert main(["check", "-f", str(pod)]) == 0  # exempt by the file's exemptNamespaces
    assert "skipped" in capsys.readouterr().out
    monkeypatch.delenv("GPU_STACK_WEBHOOK_CONFIG")
    assert main(["check", "-f", str(pod)]) == 1  # the defaults judge namespace ops
    capsys.readouterr()


def test_a_bad_variable_stops_check_naming_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPU_STACK_WEBHOOK_RELOAD_SECONDS", "-5")
    pod = tmp_path / "pod.yaml"
    pod.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: []}\n", encoding="utf-8")
    assert main(["check", "-f", str(pod)]) == 2
    assert "$GPU_STACK_WEBHOOK_RELOAD_SECONDS must be a number >= 0.0, got '-5'" in capsys.readouterr().err


def test_the_chart_sets_only_variables_settings_py_reads() -> None:
    deployment = (REPO_ROOT / "charts/gpu-stack/templates/webhook/deployment.yaml").read_text(encoding="utf-8")
    chart_names = set(re.findall(r"- name: (GPU_STACK_WEBHOOK_[A-Z_]+)", deployment))
    assert "GPU_STACK_WEBHOOK_CONFIG" in chart_names
    assert chart_names <= set(NAMES)
