"""Where a served review's CPU goes, layer by layer, from py-spy's native stacks of the gunicorn workers.

`py-spy record --native -f raw` samples every thread of a worker, Python and C frames alike: the review path
is compiled by mypyc (webhook/setup.py), so its functions are C symbols (`CPyDef_<module>___<function>`), and
TLS (OpenSSL under `_ssl`) and orjson run outside the interpreter. A sample is CPU when its thread is not
waiting: stacks that end in a wait (the GIL, a lock, a queue, epoll, sleep) are idle and dropped. Each busy
sample goes to the layer of the deepest frame of its stack that names one (`LAYERS`, first match from the
leaf up); a stack that names none is gunicorn (its HTTP parser, response writer, poller and thread pool).

Multiplied by the CPU per review measured from /proc in the same run, a layer's share is its microseconds
per review; the layers a bare allow-all also has (TLS, gunicorn, reading and parsing the body, building the
answer) are what serving costs at all, the rest is what the webhook adds.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

TLS = "TLS (OpenSSL, ssl module)"
GUNICORN = "gunicorn (HTTP parse, response write, poller, threads)"
WSGI = "WSGI dispatch (review_routes, Flask)"
BODY = "body read + JSON parse + envelope"
POLICY = "policy (decide: the rules)"
RESPONSE = "response build (AdmissionReview, orjson.dumps)"
SOURCE = "policy source (reload check, live reads)"
METRICS = "metrics"
DECISION_LOG = "decision log"
ALLOW_ALL = "allow-all app (read, parse, answer)"
RATE_HZ = 250

ORDER = (TLS, GUNICORN, WSGI, BODY, POLICY, RESPONSE, SOURCE, METRICS, DECISION_LOG, ALLOW_ALL)
# The layers a bare allow-all has too (its app is its body read, parse and answer).
SERVING = (TLS, GUNICORN)

# A frame names a layer when it matches; the deepest such frame of a stack wins.
LAYERS: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(p), layer) for p, layer in (
    # gpu_stack_webhook/tls/: the server context's check for a renewed certificate, at each handshake.
    (r"_ssl__|SSL_|ssl3_|tls1?\d*_|EVP_|libssl|libcrypto|SSLSocket\.|ssl\.py|aesni|gcm_|ossl_|gpu_stack_webhook/tls/",
     TLS),
    (r"decide___review|CPyDef_engine___|CPyDef_decide___", POLICY),
    (r"review___parse_review|review_routes___read_body|review_routes___content_length", BODY),
    (r"pipeline___answer_document|pipeline___response_of|review___build_response|_LastPatch", RESPONSE),
    (r"pipeline___answer\b|CPyDef_pipeline___answer$|pipeline___is_json", BODY),
    (r"metrics___|metric_values___|prometheus_client", METRICS),
    (r"decision_log___|logging/|pythonjsonlogger|logging\.py", DECISION_LOG),
    (r"reloader___|live_policy|LivePolicy|kube/live", SOURCE),
    (r"review_routes___|flask/|werkzeug/", WSGI),
    (r"^app \(.*baseline_app\.py", ALLOW_ALL),
))
# orjson's frames: the layer of whoever called it (parse, answer, log line).
ORJSON = re.compile(r"\(orjson/")
# A stack whose leaf part is one of these is a thread waiting, not running.
IDLE = re.compile(r"pthread_cond_(timed)?wait|clock_nanosleep|epoll_wait|_queue_SimpleQueue_get|"
                  r"PyThread_acquire_lock|sem_(timed)?wait|__futex|select_epoll_poll|time_sleep|take_gil")
FRAME_NAME = re.compile(r"^(?P<func>.+?) \((?P<file>[^()]*)\)$")


def _frames(stack: str) -> list[str]:
    return [f.strip() for f in stack.split(";") if f.strip()]


def layer_of(frames: list[str]) -> str:
    in_orjson = False
    for frame in reversed(frames):
        if ORJSON.search(frame):
            in_orjson = True
            continue
        for pattern, layer in LAYERS:
            if pattern.search(frame):
                return layer
        if in_orjson:
            # py-spy loses the compiled callers of orjson's frames (no unwind info through them), so orjson
            # right under gunicorn is the webhook's own call: its parse (orjson.loads, about ten times the
            # cost of the dumps of the small answer).
            return BODY
    return GUNICORN


def is_idle(frames: list[str]) -> bool:
    return any(IDLE.search(f) for f in frames[-6:])


def shares(raw_texts: Iterable[str]) -> tuple[int, dict[str, float]]:
    """(busy samples, {layer: share of busy samples}) over py-spy raw outputs (one per worker)."""
    counts: Counter[str] = Counter()
    for text in raw_texts:
        for line in text.splitlines():
            stack, _, count_text = line.rpartition(" ")
            if not stack or not count_text.isdigit():
                continue
            frames = _frames(stack)
            if not frames or is_idle(frames):
                continue
            counts[layer_of(frames)] += int(count_text)
    busy = sum(counts.values())
    return busy, ({layer: counts[layer] / busy for layer in ORDER if counts[layer]} if busy else {})


def record(server: Any, wrk: Any, manifest: Path, seconds: int, connections: int, workdir: Path,
           name: str) -> dict[str, Any]:
    """`py-spy record --native` on every worker of `server` while wrk saturates it with `manifest`:
    {"busy": samples, "shares": {layer: share}}, or {"skipped": why}."""
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if not spy:
        return {"skipped": "py-spy is not installed (pip install -r requirements.lock)"}
    recorders = []
    for worker in server.workers():
        raw = workdir / f"layers-{name}-{worker}.raw"
        recorders.append((raw, subprocess.Popen(
            [spy, "record", "--native", "-p", str(worker), "-d", str(seconds), "-r", str(RATE_HZ), "-f", "raw",
             "-o", str(raw)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)))
    time.sleep(0.5)
    try:
        wrk.run(f"layers-{name}", server, manifest, seconds + 1, connections)
    except RuntimeError as exc:
        for _, rec in recorders:
            rec.kill()
            rec.wait()
        return {"skipped": f"wrk failed: {exc}"}
    texts = []
    for raw, rec in recorders:
        output = rec.communicate(timeout=60)[0].decode(errors="replace")
        if rec.returncode != 0 or not raw.is_file():
            return {"skipped": f"py-spy failed ({rec.returncode}): {output.strip()[-300:]}"}
        texts.append(raw.read_text(encoding="utf-8", errors="replace"))
    busy, layer_shares = shares(texts)
    return {"busy": busy, "shares": layer_shares}
