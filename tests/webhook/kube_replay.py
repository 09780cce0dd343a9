"""A local HTTPS server that replays recorded kube-apiserver exchanges (shared fixtures, api/*.json).

`replaying(pki, names)` serves the given recorded exchanges on 127.0.0.1 (free port, TLS with the test
PKI). A request is answered by the first not-yet-used exchange with the same method, path and query;
so a scenario such as "replace -> 409, re-read -> 200, replace -> 200" is the ordered list of its files.
A request nothing matches gets a 599 and is listed in `unmatched`, so a test fails loudly instead of
the adapter seeing a made-up answer. Every request is kept (`requests`) with its Content-Type and body.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from .recordlib import recorded
from .tls_helpers import Pki, serving_https


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, str]
    content_type: str | None
    body: Any


@dataclass
class Replay:
    port: int
    exchanges: list[dict[str, Any]]
    used: list[bool] = field(default_factory=list)
    requests: list[Seen] = field(default_factory=list)
    unmatched: list[Seen] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def host(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def answer(self, seen: Seen) -> tuple[int, str, bytes]:
        with self.lock:
            self.requests.append(seen)
            for i, ex in enumerate(self.exchanges):
                if self.used[i]:
                    continue
                if (ex["method"], ex["path"], dict(ex.get("query") or {})) == (seen.method, seen.path, seen.query):
                    self.used[i] = True
                    content_type = (ex.get("response_headers") or {}).get("Content-Type") or "application/json"
                    return int(ex["status"]), content_type, json.dumps(ex["response_body"]).encode()
            self.unmatched.append(seen)
        return 599, "text/plain", b"no recorded exchange for this request"

    def all_used(self) -> bool:
        return all(self.used)


def _handler(replay: Replay) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            parts = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            seen = Seen(self.command, parts.path, dict(parse_qsl(parts.query)), self.headers.get("Content-Type"), body)
            status, content_type, payload = replay.answer(seen)
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

        def log_message(self, *args: Any) -> None:
            return None

    return Handler


@contextlib.contextmanager
def replaying(pki: Pki, names: Sequence[str]) -> Iterator[Replay]:
    """Serve the recorded exchanges `names` (file names under api/, in order). Skips when absent."""
    exchanges = [recorded(f"api/{n}") for n in names]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    replay = Replay(port=server.server_address[1], exchanges=exchanges, used=[False] * len(exchanges))
    server.RequestHandlerClass = _handler(replay)
    with serving_https(server, pki):
        yield replay
