"""Faults against a real `gpu-stack-webhook serve` (gunicorn gthread over TLS, tls_helpers.running_server):

- kill -9 of one worker under load: errors under 0.1 % (no client retries; a reset on the killed
  worker's connections counts as an error) and the worker is replaced;
- the policy ConfigMap changed at runtime (Kubernetes' atomic `..data` symlink swap): a valid new
  policy changes behaviour, a broken one keeps the last good policy and logs why, naming the key;
- slow clients (slow loris: headers a byte at a time) on more connections than threads x workers do
  not stop a normal request from being answered (slowclients.py);
- plain HTTP gets no HTTP answer (TLS 1.1 and older are refused: test_http_server.py).

Every load loop is bounded in count and in time.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from .podlib import container, make_pod, review
from .tls_helpers import Server, client_context, running_server

PRIVILEGED_GPU_POD = make_pod([container("main", gpu=1, privileged=True)])
PLAIN_POD = make_pod([container("main", gpu=1)])


def worker_pids(server: Server) -> set[int]:
    """The gunicorn workers: children of the master (the `serve` process)."""
    children: set[int] = set()
    master = server.process.pid
    for task in Path(f"/proc/{master}/task").iterdir():
        with contextlib.suppress(OSError):
            children |= {int(p) for p in (task / "children").read_text().split()}
    return children


def wait_for(predicate: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {seconds}s waiting for {what}")


# --------------------------------------------------------------------------------------------------
# kill -9 of a worker under load
# --------------------------------------------------------------------------------------------------

LOAD_THREADS = 4
LOAD_REQUESTS = 8000  # in total; the budget at 0.1 % is 8 errors
LOAD_SECONDS = 120  # hard bound on the loop, whatever the machine


def test_kill_9_of_a_worker_under_load_loses_under_0_1_percent(tmp_path: Path) -> None:
    body = json.dumps(review(PLAIN_POD)).encode()
    with running_server(tmp_path) as server:
        # /healthz answers as soon as one worker is up; gunicorn forks the second right after
        wait_for(lambda: len(worker_pids(server)) == 2, 30, "both gunicorn workers")
        before = worker_pids(server)
        context = client_context(server.pki)
        lock = threading.Lock()
        counts = {"sent": 0, "ok": 0, "errors": 0}
        errors: list[str] = []
        deadline = time.monotonic() + LOAD_SECONDS

        def load() -> None:
            conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=10)
            while time.monotonic() < deadline:
                with lock:
                    if counts["sent"] >= LOAD_REQUESTS:
                        break
                    counts["sent"] += 1
                try:
                    conn.request("POST", "/validate", body=body, headers={"Content-Type": "application/json"})
                    reply = conn.getresponse()
                    data = reply.read()
                    ok = reply.status == 200 and json.loads(data)["response"]["allowed"] is True
                except (OSError, http.client.HTTPException, ValueError) as exc:
                    ok, data = False, repr(exc).encode()
                with lock:
                    counts["ok" if ok else "errors"] += 1
                if not ok:  # no retry: the request is lost; the next one goes on a new connection
                    errors.append(data[:200].decode(errors="replace"))
                    conn.close()
                    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=10)
            conn.close()

        threads = [threading.Thread(target=load, daemon=True) for _ in range(LOAD_THREADS)]
        for t in threads:
            t.start()
        wait_for(lambda: counts["sent"] >= LOAD_REQUESTS // 4, 60, "a quarter of the load")
        victim = min(before)
        os.kill(victim, signal.SIGKILL)
        for t in threads:
            t.join(LOAD_SECONDS + 30)
        assert not any(t.is_alive() for t in threads)
        total = counts["ok"] + counts["errors"]
        rate = counts["errors"] / total
        print(f"\nkill -9 of worker {victim} under load: {total} requests, {counts['errors']} errors "
              f"({rate:.3%}): {errors}")
        assert total == LOAD_REQUESTS
        assert rate < 0.001, f"{counts['errors']} errors of {total}: {errors}"
        wait_for(lambda: len(worker_pids(server)) == 2 and victim not in worker_pids(server), 30,
                 "gunicorn to replace the killed worker")
        assert worker_pids(server) - before, "a new worker pid"
        client = server.client()
        assert client.post_json("/validate", review(PLAIN_POD)).status == 200
        client.close()


# --------------------------------------------------------------------------------------------------
# Policy ConfigMap changed at runtime
# --------------------------------------------------------------------------------------------------


def swap_configmap(config_path: Path, content: dict[str, Any] | str, generation: int) -> None:
    """What the kubelet does for a ConfigMap volume: a new timestamped directory, `..data` re-pointed
    by an atomic rename of a symlink, `policy.yaml -> ..data/policy.yaml` never changing."""
    root = config_path.parent / "cm"
    data_dir = root / f"..2026_01_01_00_00_{generation:02d}.000000000"
    data_dir.mkdir(parents=True)
    text = content if isinstance(content, str) else yaml.safe_dump(content)
    (data_dir / "policy.yaml").write_text(text, encoding="utf-8")
    tmp_link = root / "..data_tmp"
    tmp_link.symlink_to(data_dir.name)
    os.replace(tmp_link, root / "..data")
    if not config_path.is_symlink():
        link = config_path.parent / "policy.yaml.link"
        link.symlink_to(Path("cm") / "..data" / "policy.yaml")
        os.replace(link, config_path)


def allowed_by_every_worker(server: Server, pod: dict[str, Any], tries: int = 12) -> set[bool]:
    """The verdicts of `tries` requests on fresh connections (so both workers answer some)."""
    verdicts = set()
    for _ in range(tries):
        client = server.client()
        reply = client.post_json("/validate", review(pod))
        client.close()
        assert reply.status == 200, reply.body
        verdicts.add(reply.json["response"]["allowed"])
    return verdicts


def test_policy_reload_applies_a_good_configmap_and_keeps_the_last_good_one(tmp_path: Path) -> None:
    env = {"GPU_STACK_WEBHOOK_RELOAD_SECONDS": "0.2"}
    with running_server(tmp_path, {}, env=env) as server:
        config_path = server.workdir / "policy.yaml"
        assert allowed_by_every_worker(server, PRIVILEGED_GPU_POD) == {False}  # GPU003 denies

        swap_configmap(config_path, {"rules": {"disabled": ["GPU003"]}}, 1)
        wait_for(lambda: allowed_by_every_worker(server, PRIVILEGED_GPU_POD) == {True}, 20,
                 "both workers to load the policy with GPU003 disabled")
        assert sum("policy reloaded" in str(r.get("message")) for r in server.log_records()) >= 2

        broken = {"rules": {"disabled": ["GPU003"]}, "sharing": {"configs": {"default": {
            "version": "v1", "flags": {"migStrategy": "sideways"}}}}}
        swap_configmap(config_path, broken, 2)

        def failure_logged() -> list[dict[str, Any]]:
            return [r for r in server.log_records() if r.get("event") == "policy-reload-failed"]

        # The check runs on the request path: requests make both workers look at the file.
        wait_for(lambda: allowed_by_every_worker(server, PLAIN_POD) and len(failure_logged()) >= 2, 20,
                 "both workers to log the broken policy")
        for record in failure_logged():
            assert record["level"] == "ERROR"
            assert "sharing.configs.default.flags.migStrategy" in record["error"], record
            assert record["policy"] == str(config_path)
        assert allowed_by_every_worker(server, PRIVILEGED_GPU_POD) == {True}, "the last good policy stays"
        assert allowed_by_every_worker(server, make_pod([container("main", gpu="0.5")])) == {False}
        assert server.process.poll() is None

        swap_configmap(config_path, "{}", 3)  # fixed again: back to the defaults
        wait_for(lambda: allowed_by_every_worker(server, PRIVILEGED_GPU_POD) == {False}, 20,
                 "the fixed policy to be loaded")


# --------------------------------------------------------------------------------------------------
# Slow clients
# --------------------------------------------------------------------------------------------------

SLOW_CONNECTIONS = 6  # threads x workers is 2 x 1 in this test


def test_slow_loris_clients_cannot_hold_every_thread(tmp_path: Path) -> None:
    env = {"GPU_STACK_WEBHOOK_WORKERS": "1", "GPU_STACK_WEBHOOK_REQUEST_TIMEOUT": "2"}
    with running_server(tmp_path, env=env) as server:
        context = client_context(server.pki)
        stop = threading.Event()
        cut: list[float] = []
        started = time.monotonic()

        def slow_client() -> None:
            with socket.create_connection(("127.0.0.1", server.port), timeout=30) as raw, \
                    context.wrap_socket(raw, server_hostname="localhost") as tls:
                tls.sendall(b"POST /validate HTTP/1.1\r\nHost: localhost\r\n")
                tls.settimeout(0.5)
                for _ in range(60):  # at most 30 s of one header byte every 0.5 s
                    if stop.is_set():
                        return
                    try:
                        tls.sendall(b"X")
                        if tls.recv(1) == b"":
                            break
                    except TimeoutError:
                        continue
                    except OSError:
                        break
                cut.append(time.monotonic() - started)

        slow = [threading.Thread(target=slow_client, daemon=True) for _ in range(SLOW_CONNECTIONS)]
        for t in slow:
            t.start()
        time.sleep(1.0)  # every thread of the worker is now reading a slow request
        try:
            asked = time.monotonic()
            conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=20)
            conn.request("POST", "/validate", body=json.dumps(review(PLAIN_POD)),
                         headers={"Content-Type": "application/json"})
            reply = conn.getresponse()
            waited = time.monotonic() - asked
            assert reply.status == 200 and json.loads(reply.read())["response"]["allowed"] is True
            conn.close()
        finally:
            stop.set()
            for t in slow:
                t.join(40)
        print(f"\nnormal request answered after {waited:.1f}s behind {SLOW_CONNECTIONS} slow clients; "
              f"slow connections cut after {sorted(round(c, 1) for c in cut)}s")
        assert waited < 15
        assert len(cut) >= 2, "the server closed the slow connections"
        assert any(r.get("event") == "request-timeout" for r in server.log_records())


# --------------------------------------------------------------------------------------------------
# No plaintext listener (the TLS floor: test_http_server.py)
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with running_server(tmp_path_factory.mktemp("faults")) as srv:
        yield srv


def test_plain_http_gets_no_http_answer(server: Server) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
        raw.sendall(b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 2\r\n\r\n{}")
        try:
            data = raw.recv(1024)
        except (ConnectionResetError, TimeoutError):
            data = b""
    assert not data.startswith(b"HTTP/"), data
