"""The servers a bench run measures (the webhook and the allow-all baseline, each a gunicorn started here), the chart's
policy they serve, and wrk."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpu_stack_dev.bench.procfs import children, cpu_ticks, pss_kb, status_kb, worker_connections
from gpu_stack_dev.paths import ROOT as REPO_ROOT

VENV_BIN = Path(sys.executable).parent

def chart_policy(values: Path | None = None) -> str:
    """The policy the chart serves (`helm template`, ConfigMap <release>-webhook-policy) with its default
    values plus `values`: what `helm install gpu-stack charts/gpu-stack [-f values]` runs, e.g. with
    injectRuntimeClassName: nvidia."""
    helm = subprocess.run([str(REPO_ROOT / "hack" / "ensure-helm.sh"), "3"], capture_output=True, text=True,
                          check=True).stdout.strip().splitlines()[-1]
    rendered = subprocess.run([helm, "template", "gpu-stack", str(REPO_ROOT / "charts" / "gpu-stack"),
                               *(["-f", str(values)] if values else [])],
                              capture_output=True, text=True, check=True).stdout
    for doc in yaml.safe_load_all(rendered):
        if doc and doc.get("kind") == "ConfigMap" and doc["metadata"]["name"].endswith("-webhook-policy"):
            return str(doc["data"]["policy.yaml"])
    raise RuntimeError("the chart rendered no webhook policy ConfigMap")

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])

@dataclass
class Server:
    name: str
    argv: list[str]
    port: int
    ca_file: Path
    log: Path
    expected_workers: int = 1
    proc: subprocess.Popen[bytes] | None = None
    # Seconds to wait for /healthz (a server under valgrind starts about ten times slower).
    start_timeout: float = 60

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=log, cwd=REPO_ROOT)
        context = ssl.create_default_context(cafile=str(self.ca_file))
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; log: {self.log}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=2) as raw, \
                        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                    tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                    if tls.recv(64).startswith(b"HTTP/1.1 200") and len(self.workers()) >= self.expected_workers:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} did not answer /healthz within {self.start_timeout:g} s; log: {self.log}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def workers(self) -> list[int]:
        return children(self.pid)

    def connections(self) -> dict[int, int]:
        """Established client connections per worker pid (see worker_connections)."""
        return worker_connections(self.pid, self.workers(), self.port)

    def cpu_ticks(self) -> int:
        return cpu_ticks(self.pid) + sum(cpu_ticks(w) for w in self.workers())

    def memory(self) -> dict[str, Any]:
        workers = self.workers()
        return {
            "master_rss_kb": status_kb(self.pid, "VmRSS"),
            "master_pss_kb": pss_kb(self.pid),
            "workers": [{"pid": w, "rss_kb": status_kb(w, "VmRSS"), "pss_kb": pss_kb(w)} for w in workers],
        }

def ensure_tool(binary: str, package: str, what: str) -> str:
    """The path of `binary`, installed from Debian's `package` with apt-get when missing and root; else exit
    saying what to install."""
    found = shutil.which(binary)
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        print(f"{binary} not found: installing it with apt-get (Debian package `{package}`)", flush=True)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        if subprocess.run(["apt-get", "install", "-y", "-qq", package], env=env, check=False,
                          stdout=subprocess.DEVNULL).returncode != 0:
            subprocess.run(["apt-get", "update", "-qq"], env=env, check=True, stdout=subprocess.DEVNULL)
            subprocess.run(["apt-get", "install", "-y", "-qq", package], env=env, check=True,
                           stdout=subprocess.DEVNULL)
        found = shutil.which(binary)
        if found:
            return found
    sys.exit(f"make bench needs {binary} ({what}): install it with `sudo apt-get install {package}` (Debian/Ubuntu) "
             "or your package manager, then run `make bench` again.")


def ensure_wrk() -> str:
    return ensure_tool("wrk", "wrk", "the HTTP load generator, https://github.com/wg/wrk")
