"""The Prometheus client of `inspect --usage`: what the user reads when Prometheus cannot be asked. A real
HTTP server on the loopback answers as the case wants (401, 403, 500, not JSON, too slow), or nothing
listens; the clock query and a range query are parsed as the HTTP API documents them."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest
from gpu_stack_webhook.gpuinspect.prometheus import Client, PrometheusError, UrlTransport

Answer = Callable[[BaseHTTPRequestHandler], None]


def _send(status: int, body: bytes) -> Answer:
    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)
    return answer


@pytest.fixture
def server() -> Iterator[Callable[[Answer], str]]:
    servers: list[ThreadingHTTPServer] = []

    def start(answer: Answer) -> str:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                answer(self)

            def log_message(self, *args: object) -> None:
                pass

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        httpd.daemon_threads = True
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return f"http://127.0.0.1:{httpd.server_port}"

    yield start
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


def _error(url: str, timeout: float = 5.0, token: str | None = None) -> PrometheusError:
    with pytest.raises(PrometheusError) as caught:
        Client(UrlTransport(url, token=token, timeout=timeout)).now()
    return caught.value


def test_nothing_listening_is_unreachable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    error = _error(f"http://127.0.0.1:{port}")
    assert error.kind == "unreachable"
    assert str(error).startswith(f"cannot reach Prometheus at http://127.0.0.1:{port}: ")
    assert "Connection refused" in str(error)


@pytest.mark.parametrize(("status", "phrase"), [(401, "401 Unauthorized"), (403, "403 Forbidden")])
def test_refused_credentials(server: Callable[[Answer], str], status: int, phrase: str) -> None:
    url = server(_send(status, b"no token"))
    error = _error(url, token="t")
    assert (error.kind, str(error)) == (
        "refused", f"Prometheus at {url} refused the request ({phrase}): no token; check --prometheus-token")


def test_too_slow_is_a_timeout(server: Callable[[Answer], str]) -> None:
    url = server(lambda handler: time.sleep(3))
    error = _error(url, timeout=0.5)
    assert (error.kind, str(error)) == (
        "unreachable", f"Prometheus at {url} did not answer within 0.5 s (--prometheus-timeout)")


def test_an_error_status_carries_prometheus_s_error(server: Callable[[Answer], str]) -> None:
    url = server(_send(422, json.dumps({"status": "error", "errorType": "execution",
                                        "error": "query timed out in expression evaluation"}).encode()))
    error = _error(url)
    assert (error.kind, str(error)) == (
        "unreachable", f"Prometheus at {url} answered HTTP 422: query timed out in expression evaluation")


def test_something_that_is_not_prometheus(server: Callable[[Answer], str]) -> None:
    url = server(_send(200, b"<html>Grafana</html>"))
    error = _error(url)
    assert error.kind == "unreachable"
    assert str(error) == f"{url} did not answer as a Prometheus does (not JSON: b'<html>Grafana</html>')"


def test_clock_and_range_query(server: Callable[[Answer], str]) -> None:
    asked: list[dict[str, list[str]]] = []

    def answer(handler: BaseHTTPRequestHandler) -> None:
        parsed = urlparse(handler.path)
        asked.append({"path": [parsed.path], **parse_qs(parsed.query)})
        if parsed.path == "/api/v1/query":
            body = {"status": "success", "data": {"resultType": "scalar", "result": [1700000000.5, "1700000000.5"]}}
        else:
            body = {"status": "success", "data": {"resultType": "matrix", "result": [
                {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "pod": "p"}, "values": [[100, "3"], [160, "4.5"]]}]}}
        _send(200, json.dumps(body).encode())(handler)

    client = Client(UrlTransport(server(answer)))
    assert client.now() == 1700000000.5
    (series,) = client.range("DCGM_FI_DEV_GPU_UTIL", 100.0, 160.0, 60.0)
    assert (series.labels["pod"], list(series.values)) == ("p", [[100, "3"], [160, "4.5"]])
    assert client.queries == 2
    assert asked[1] == {"path": ["/api/v1/query_range"], "query": ["DCGM_FI_DEV_GPU_UTIL"], "start": ["100.000"],
                        "end": ["160.000"], "step": ["60"]}
