"""The served path's layers (gpu_stack_dev.bench.layers): which layer a py-spy native stack is counted in, and
that waiting threads are not counted (no timing here)."""

from __future__ import annotations

from gpu_stack_dev.bench import layers

HANDLE = ("Thread.run (threading.py:982);_worker (concurrent/futures/thread.py:83);"
          "ThreadWorker.handle (gunicorn/workers/gthread.py:553);"
          "ThreadWorker.handle_request (gunicorn/workers/gthread.py:771)")
ROUTES = (f"{HANDLE};CPyPy_review_routes___ReviewRoutes_____call__ (__native_x.c:1);"
          "CPyDef_review_routes___ReviewRoutes_____call__ (__native_x.c:2)")
ANSWER = (f"{ROUTES};CPyDef_review_routes___ReviewRoutes___reply (__native_x.c:3);"
          "CPyDef_pipeline___answer (__native_x.c:4)")

SIGNATURE = "file_signature (gpu_stack_webhook/filewatch.py:23)"

RAW = "\n".join([
    # the rules
    f"{ANSWER};CPyDef_pipeline___answer_document (x.c:5);CPyDef_decide___review (x.c:6);PyDict_GetItemRef (py) 7",
    # orjson.loads under answer; and orjson whose compiled callers py-spy lost: the parse either way
    f"{ANSWER};0x7f00 (orjson/orjson.cpython-311-x86_64-linux-gnu.so) 3",
    f"{HANDLE};0x7f01 (orjson/orjson.cpython-311-x86_64-linux-gnu.so) 2",
    # orjson.dumps of the answer
    f"{ANSWER};CPyDef_pipeline___answer_document (x.c:5);0x7f02 (orjson/orjson.cpython-311-x86_64-linux-gnu.so) 1",
    f"{ROUTES};CPyDef_metrics___Metrics___record (x.c:7) 2",
    f"{ROUTES};CPyDef_decision_log___log_reply (x.c:8);Logger._log (logging/__init__.py:1600) 4",
    f"{ROUTES};Response.start_response (gunicorn/http/wsgi.py:300) 1",
    # TLS under gunicorn's response write; gunicorn's own parser
    f"{HANDLE};Response.write (gunicorn/http/wsgi.py:475);SSLSocket.sendall (ssl.py:1230);SSL_write (libssl) 5",
    f"{HANDLE};Parser.__next__ (gunicorn/http/parser.py:119) 6",
    # the policy file's reload check is the policy source; the certificate's, at a handshake, is TLS
    f"{ROUTES};CPyDef_reloader___ReloadingPolicy___maybe_reload (x.c:9);{SIGNATURE} 1",
    "ThreadWorker.run (gunicorn/workers/gthread.py:427);PollingThreadWorker.accept (server/worker.py:90);"
    f"server_context.<locals>.sni (gpu_stack_webhook/tls/serving.py:60);{SIGNATURE} 1",
    # the allow-all's app
    f"{HANDLE};app (gpu_stack_dev/bench/baseline_app.py:40);0x7f03 (orjson/orjson.cpython-311-x86_64-linux-gnu.so) 9",
    # waiting: for the GIL, on the thread pool's queue, in the poller: not CPU
    f"{ANSWER};CPyDef_decide___review (x.c:6);take_gil (libpython);pthread_cond_timedwait (libc.so.6) 50",
    "Thread.run (threading.py:982);_worker (concurrent/futures/thread.py:81);_queue_SimpleQueue_get (q.c:1);"
    "pthread_cond_timedwait (libc.so.6);0x7f04 (libc.so.6) 50",
    "ThreadWorker.run (gunicorn/workers/gthread.py:427);EpollSelector.select (selectors.py:468);epoll_wait (libc) 50",
    "not a stack line",
])


def test_each_busy_sample_counts_in_the_layer_of_its_deepest_named_frame_and_waiting_threads_do_not() -> None:
    busy, shares = layers.shares([RAW])
    assert busy == 7 + 3 + 2 + 1 + 2 + 4 + 1 + 5 + 6 + 1 + 1 + 9
    counts = {layer: round(share * busy) for layer, share in shares.items()}
    assert counts == {
        layers.POLICY: 7,
        layers.BODY: 3 + 2,
        layers.RESPONSE: 1,
        layers.METRICS: 2,
        layers.DECISION_LOG: 4,
        layers.WSGI: 1,
        layers.TLS: 5 + 1,
        layers.GUNICORN: 6,
        layers.SOURCE: 1,
        layers.ALLOW_ALL: 9,
    }
    assert list(shares) == [layer for layer in layers.ORDER if layer in shares]  # the table's order


def test_the_report_gives_each_layer_its_share_and_its_microseconds_per_review() -> None:
    from gpu_stack_dev.bench import report_http, run_bench, wrk  # noqa: PLC0415

    def summary(cpu_us: float) -> wrk.Summary:
        run = wrk.Run(target="t", requests=1000, seconds=1.0, errors=0, latency_us={}, late=0, worst_late_ms=0.0,
                      cpu_s=cpu_us / 1000, connections=0)
        return wrk.Summary("t", [run])

    results = {
        "plan": run_bench.Plan().__dict__,
        "saturation": {"baseline": summary(200), "validate": summary(250)},
        "saturation_same": {"validate": summary(300)},
        "layers": {"mix/baseline": {"busy": 10, "shares": {layers.TLS: 0.5, layers.ALLOW_ALL: 0.5}},
                   "mix/validate": {"busy": 20, "shares": {layers.TLS: 0.4, layers.POLICY: 0.6}},
                   "one/validate": {"busy": 30, "shares": {layers.POLICY: 1.0}},
                   "one/mutate": {"skipped": "py-spy failed (1)"}},
    }
    lines = report_http.layers_section(results)
    assert (f"| {layers.TLS} | 50.0 / 100 | 40.0 / 100 | - |") in lines
    assert (f"| {layers.POLICY} | - | 60.0 / 150 | 100.0 / 300 |") in lines
    assert "| CPU per review (µs), busy samples | 200, 10 | 250, 20 | 300, 30 |" in lines
    assert "* one/mutate: skipped (py-spy failed (1))" in lines
