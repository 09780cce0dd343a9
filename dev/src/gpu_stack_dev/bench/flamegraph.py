"""py-spy flame graphs of the webhook's workers under load, for BENCHMARKS.md (bench/flamegraphs/*.svg).

`record()` attaches `py-spy record --gil --native --subprocesses` to the gunicorn master (so every worker is
sampled, only the thread holding the GIL, i.e. Python CPU time; --native shows the review path mypyc compiled
as its C functions, `CPyDef_<module>___<function>`) while wrk saturates one endpoint, and writes py-spy's own
SVG. TLS encryption and socket writes run without the GIL, so they are not in these graphs: the layer table
(layers.py) counts them. py-spy is a dev dependency (requirements.lock).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RATE_HZ = 200


def py_spy() -> str | None:
    return shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")


def record(server: Any, wrk: Any, manifest: Path, seconds: int, connections: int, svg: Path) -> str | None:
    """Record `seconds` of the server under wrk into `svg`; None when done, else why it was skipped."""
    spy = py_spy()
    if not spy:
        return "py-spy is not installed (pip install -r requirements-dev.txt)"
    svg.parent.mkdir(parents=True, exist_ok=True)
    recorder = subprocess.Popen(
        [spy, "record", "--gil", "--native", "--subprocesses", "-p", str(server.pid), "-d", str(seconds),
         "-r", str(RATE_HZ), "-f", "flamegraph", "-o", str(svg)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    time.sleep(0.5)
    try:
        wrk.run("flamegraph", server, manifest, seconds + 1, connections)
    except RuntimeError as exc:
        recorder.kill()
        recorder.wait()
        return f"wrk failed: {exc}"
    output = recorder.communicate(timeout=60)[0].decode(errors="replace")
    if recorder.returncode != 0 or not svg.is_file():
        return f"py-spy failed ({recorder.returncode}): {output.strip()[-300:]}"
    return None
