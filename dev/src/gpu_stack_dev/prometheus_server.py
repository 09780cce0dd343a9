"""A real Prometheus (Debian's `prometheus` package, hack/ensure-promtool.sh) scraping a stand-in exporter on
the loopback, for the `inspect --usage` e2e test and benchmark: `Exporter` serves a text the caller builds
(gpu_stack_dev.dcgm_fixture), `PrometheusServer` scrapes it every second into a throwaway TSDB."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType

from gpu_stack_dev.paths import ROOT


class Exporter:
    """GET /metrics answers `text()` (Prometheus's text format), on 127.0.0.1 at a free port."""

    def __init__(self, text: Callable[[], str]) -> None:
        body_of = text

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = body_of().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.target = f"127.0.0.1:{self.httpd.server_port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def prometheus_binary() -> str:
    found = subprocess.run([str(ROOT / "hack" / "ensure-promtool.sh"), "prometheus"], check=True,
                           capture_output=True, text=True).stdout.strip().splitlines()
    return found[-1]


class PrometheusServer:
    """`prometheus` scraping `targets` (job dcgm-exporter) every `interval`; stopped and its TSDB removed on
    exit."""

    def __init__(self, targets: list[str], interval: str = "1s", host: str = "127.0.0.1") -> None:
        self.targets, self.interval, self.host = targets, interval, host
        self.port = free_port(host)
        self.url = f"http://{host}:{self.port}"
        self.workdir = Path(tempfile.mkdtemp(prefix="gpu-stack-prometheus-"))
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> PrometheusServer:
        config = {"global": {"scrape_interval": self.interval, "scrape_timeout": self.interval},
                  "scrape_configs": [{"job_name": "dcgm-exporter", "static_configs": [{"targets": self.targets}]}]}
        (self.workdir / "prometheus.yml").write_text(json.dumps(config))
        log = (self.workdir / "prometheus.log").open("wb")
        self.process = subprocess.Popen(
            [prometheus_binary(), f"--config.file={self.workdir / 'prometheus.yml'}",
             f"--storage.tsdb.path={self.workdir / 'data'}", f"--web.listen-address={self.host}:{self.port}",
             "--storage.tsdb.retention.time=2h", "--web.enable-lifecycle"], stdout=log, stderr=log)
        log.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited: {(self.workdir / 'prometheus.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:  # noqa: S310 - ours
                    if response.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        self.__exit__(None, None, None)
        raise RuntimeError("prometheus did not become ready within 60 s")

    def query(self, expr: str) -> list[dict[str, object]]:
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
        with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 - the Prometheus this started
            return list(json.load(response)["data"]["result"])

    def wait_for_history(self, metric: str, seconds: float, series: int = 1, timeout: float = 300) -> float:
        """Until `series` series of `metric` have samples over the last `seconds` (one per scrape interval, the
        oldest at least `seconds` old); returns the wait."""
        started = time.monotonic()
        every = float(self.interval.rstrip("s"))
        expr = (f"count(count_over_time({metric}[{int(seconds + 2 * every)}s]) >= "
                f"{max(int(seconds / every), 1)})")
        while time.monotonic() - started < timeout:
            found = self.query(expr)
            if found and float(str(found[0]["value"][1])) >= series:  # type: ignore[index]
                return time.monotonic() - started
            time.sleep(1)
        raise RuntimeError(f"{metric}: fewer than {series} series with {seconds} s of samples after {timeout} s")

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)
