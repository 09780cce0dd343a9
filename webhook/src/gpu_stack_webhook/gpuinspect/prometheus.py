"""Asking a Prometheus for GPU usage: its HTTP API (prometheus.io/docs/prometheus/latest/querying/api/:
GET /api/v1/query_range and /api/v1/query, JSON `{"status": "success", "data": {"resultType", "result"}}`).

Two ways to reach it, one `Transport` each:
- `ProxyTransport` (the default path): through the kubeconfig's API server, its Service proxy
  `/api/v1/namespaces/NS/services/NAME:PORT/proxy/...`, with the user's own credentials (RBAC: `get` on
  `services/proxy` for that Service).
- `UrlTransport` (`--prometheus URL`): straight to the URL, with an optional bearer token and CA bundle.

No client library: the two endpoints are plain GETs, and the packages on PyPI that wrap them bring pandas or
an async stack with them. Every failure is a `PrometheusError` whose `kind` the command turns into an exit
status: "unreachable" (no connection, a timeout, an error status, an answer that is not Prometheus's) or
"refused" (401 or 403)."""

from __future__ import annotations

import json
import socket
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

DEFAULT_TIMEOUT = 30.0  # seconds per query


class PrometheusError(Exception):
    """`kind`: unreachable | refused. The message is printed as it is."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class Transport(Protocol):
    where: str  # what the user is told the Prometheus is

    def get(self, path: str, params: Sequence[tuple[str, str]]) -> bytes: ...


@dataclass(frozen=True)
class Series:
    labels: Mapping[str, str]
    # [unix seconds, "value"] pairs as the API sends them, oldest first (converted where they are summarised)
    values: Sequence[Sequence[Any]]


def _status_error(where: str, status: int, detail: str, hint: str) -> PrometheusError:
    detail = detail.strip().replace("\n", " ")[:300] or "no details"
    if status in (401, 403):
        phrase = "401 Unauthorized" if status == 401 else "403 Forbidden"
        return PrometheusError("refused", f"Prometheus at {where} refused the request ({phrase}): {detail}{hint}")
    return PrometheusError("unreachable", f"Prometheus at {where} answered HTTP {status}: {detail}")


class UrlTransport:
    def __init__(self, url: str, token: str | None = None, ca_file: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            raise ValueError(f"--prometheus must be an http:// or https:// URL, got {url!r}")
        self.base = url.rstrip("/")
        self.where = self.base
        self.token = token
        self.timeout = timeout
        self.context = ssl.create_default_context(cafile=ca_file) if ca_file else None

    def get(self, path: str, params: Sequence[tuple[str, str]]) -> bytes:
        request = urllib.request.Request(  # noqa: S310 - http(s) only, checked in __init__
            f"{self.base}{path}?{urllib.parse.urlencode(params)}")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout,  # noqa: S310 - http(s) only
                                        context=self.context) as response:
                return bytes(response.read())
        except urllib.error.HTTPError as exc:
            body = exc.read().decode("utf-8", "replace")
            raise _status_error(self.where, exc.code, _error_text(body),
                                "; check --prometheus-token" if exc.code in (401, 403) else "") from None
        except TimeoutError:
            raise PrometheusError("unreachable", f"Prometheus at {self.where} did not answer within "
                                                 f"{self.timeout:g} s (--prometheus-timeout)") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, (TimeoutError, socket.timeout)):
                raise PrometheusError("unreachable", f"Prometheus at {self.where} did not answer within "
                                                     f"{self.timeout:g} s (--prometheus-timeout)") from None
            raise PrometheusError("unreachable", f"cannot reach Prometheus at {self.where}: {reason}") from None


class ProxyTransport:
    """GETs through the API server's Service proxy, with the kubeconfig's credentials and CA."""

    def __init__(self, api: Any, namespace: str, name: str, port: str, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.api = api
        self.path = f"/api/v1/namespaces/{namespace}/services/{name}:{port}/proxy"
        self.where = f"service {namespace}/{name}:{port} (through the API server's proxy)"
        self.service = f"{namespace}/{name}"
        self.timeout = timeout

    def get(self, path: str, params: Sequence[tuple[str, str]]) -> bytes:
        from kubernetes.client.exceptions import ApiException  # noqa: PLC0415 - start-up time
        from urllib3.exceptions import HTTPError  # noqa: PLC0415
        from urllib3.exceptions import TimeoutError as Urllib3Timeout  # noqa: PLC0415

        try:
            method, url, headers, _, _ = self.api.param_serialize(
                "GET", f"{self.path}{path}", query_params=list(params), header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"])
            response = self.api.call_api(method, url, header_params=headers, _request_timeout=(5.0, self.timeout))
            body, status = bytes(response.read()), int(response.status)
        except ApiException as exc:  # the client's own: a TLS failure
            raise PrometheusError("unreachable", f"cannot reach Prometheus at {self.where}: {exc.reason}") from None
        except Urllib3Timeout:
            raise PrometheusError("unreachable", f"Prometheus at {self.where} did not answer within "
                                                 f"{self.timeout:g} s (--prometheus-timeout)") from None
        except (HTTPError, OSError) as exc:
            raise PrometheusError("unreachable", f"cannot reach Prometheus at {self.where}: "
                                                 f"{type(exc).__name__}: {exc}") from None
        if 200 <= status < 300:
            return body
        text = _error_text(body.decode("utf-8", "replace"))
        if status in (401, 403):
            hint = f"; proxying needs `get` on services/proxy for {self.service}" if status == 403 else ""
            raise _status_error(self.where, status, text, hint)
        if status in (502, 503, 404):  # no endpoints, the pod refuses the connection, no such Service
            raise PrometheusError("unreachable", f"cannot reach Prometheus at {self.where}: HTTP {status}: "
                                                 f"{text.strip()[:300]}")
        raise _status_error(self.where, status, text, "")


def _error_text(body: str) -> str:
    """Prometheus's and the API server's JSON errors carry `error` / `message`; else the body as it is."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return body
    if isinstance(parsed, dict):
        return str(parsed.get("error") or parsed.get("message") or body)
    return body


def _data(raw: bytes, where: str) -> Any:
    try:
        answer = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise PrometheusError("unreachable", f"{where} did not answer as a Prometheus does (not JSON: "
                                             f"{raw[:80]!r})") from None
    if not isinstance(answer, dict) or answer.get("status") != "success" or "data" not in answer:
        error = answer.get("error") if isinstance(answer, dict) else None
        raise PrometheusError("unreachable", f"Prometheus at {where} failed the query: {error or raw[:120]!r}")
    return answer["data"]


class Client:
    """Counts its queries (the benchmark and `-v` report them)."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.where = transport.where
        self.queries = 0

    def range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        """One /api/v1/query_range; a matrix, each series' values as (seconds, float)."""
        self.queries += 1
        raw = self.transport.get("/api/v1/query_range", [("query", expr), ("start", f"{start:.3f}"),
                                                         ("end", f"{end:.3f}"), ("step", f"{step:g}")])
        data = _data(raw, self.where)
        del raw
        return [Series(labels=item.get("metric") or {}, values=item.get("values") or [])
                for item in data.get("result") or []]

    def now(self) -> float:
        """Prometheus's own clock: the instant query `time()` evaluated at its present."""
        self.queries += 1
        data = _data(self.transport.get("/api/v1/query", [("query", "time()")]), self.where)
        result = data.get("result")
        if data.get("resultType") != "scalar" or not isinstance(result, list) or len(result) != 2:
            raise PrometheusError("unreachable", f"Prometheus at {self.where} answered time() with {result!r}")
        return float(result[1])
