"""`gpu-stack-webhook inspect` and `kubectl gpu-stack inspect` without a cluster: arguments and the
errors a user sees when there is no cluster to ask."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

BIN = Path(sys.executable).parent


def run(tool: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / tool), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "NO_COLOR": "1", **(env or {})}, check=False)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kubeconfig(tmp_path: Path, server: str) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))
    return path


def test_kubectl_plugin_is_installed_under_the_name_kubectl_looks_for() -> None:
    # kubectl turns `kubectl gpu-stack inspect` into `kubectl-gpu_stack inspect` (dashes -> underscores).
    result = run("kubectl-gpu_stack", "inspect", "--help")
    assert result.returncode == 0
    assert result.stdout.startswith("usage: kubectl gpu-stack inspect [-h] [-o {table,wide,json,yaml}]")
    assert "--node NAME" in result.stdout and "-l SELECTOR, --selector SELECTOR" in result.stdout


def test_webhook_cli_has_the_same_command() -> None:
    plugin = run("kubectl-gpu_stack", "inspect", "--help").stdout
    ours = run("gpu-stack-webhook", "inspect", "--help").stdout
    assert ours.replace("gpu-stack-webhook inspect", "kubectl gpu-stack inspect") == plugin


def test_no_kubeconfig_and_not_in_a_cluster(tmp_path: Path) -> None:
    env = {"KUBECONFIG": str(tmp_path / "absent"), "HOME": str(tmp_path), "KUBERNETES_SERVICE_HOST": ""}
    result = run("kubectl-gpu_stack", "inspect", env=env)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.startswith("error: no cluster access: ")
    assert result.stderr.endswith("(set KUBECONFIG or pass --kubeconfig)\n")


def test_unreachable_server(tmp_path: Path) -> None:
    server = f"http://127.0.0.1:{closed_port()}"
    result = run("gpu-stack-webhook", "inspect", "--kubeconfig", str(kubeconfig(tmp_path, server)))
    assert result.returncode == 1
    assert result.stderr.startswith(f"error: cannot reach the Kubernetes API server at {server}: ")
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("entry", [
    "from gpu_stack_webhook.cli.main import main; code = main(['inspect', *sys.argv[1:]])",
    "from gpu_stack_webhook.gpuinspect.command import plugin_main; code = plugin_main(['inspect', *sys.argv[1:]])",
])
def test_inspect_loads_no_flask(tmp_path: Path, entry: str) -> None:
    """Both commands run inspect (to the request the server does not answer) without loading Flask:
    `gpu-stack-webhook` shares its module with `serve`, which builds its Flask app only when it serves."""
    server = f"http://127.0.0.1:{closed_port()}"
    script = f"import sys\n{entry}\nprint(code, 'flask' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", script, "--kubeconfig", str(kubeconfig(tmp_path, server))],
                            capture_output=True, text=True, timeout=60, env={**os.environ, "NO_COLOR": "1"},
                            check=False)
    assert result.stderr.startswith(f"error: cannot reach the Kubernetes API server at {server}: ")
    assert result.stdout == "1 False\n"


def test_unknown_context(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path, "http://127.0.0.1:1")
    result = run("gpu-stack-webhook", "inspect", "--kubeconfig", str(path), "--context", "nope")
    assert result.returncode == 1
    assert result.stderr.startswith("error: cannot use kubeconfig: ")


@pytest.mark.parametrize(("args", "message"), [
    (["-o", "xml"], "argument -o/--output: invalid choice: 'xml'"),
    (["--chunk-size", "0"], "argument --chunk-size: must be a positive integer, got 0"),
])
def test_bad_arguments_exit_2(args: list[str], message: str) -> None:
    result = run("kubectl-gpu_stack", "inspect", *args)
    assert result.returncode == 2
    assert message in result.stderr


@pytest.mark.parametrize(("body", "token"), [
    (b'{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"9","continue":"eyJ2IjoibWV0YS5rOHMuaW8vdjEifQ"},'
     b'"items":[{"metadata":{"name":"a","annotations":{"continue":"not this"}}}]}', "eyJ2IjoibWV0YS5rOHMuaW8vdjEifQ"),
    (b'{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"9"},'
     b'"items":[{"metadata":{"name":"a","annotations":{"continue":"not this"}}}]}', None),
    (b'{"kind":"NodeList","metadata":{"continue":"a\\"b"},"items":[]}', None),  # escaped: parse the page instead
])
def test_continue_token_is_read_from_list_metadata_only(body: bytes, token: str | None) -> None:
    from gpu_stack_webhook.gpuinspect.fetch import _continue_token  # noqa: PLC0415

    assert _continue_token(body) == token
