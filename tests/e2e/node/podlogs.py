"""What a user would look at when pods do not come up: their status, events and own log lines."""

from __future__ import annotations

import json

from gpu_stack_dev.e2e.e2elib import E2ECluster


def explain_pods(cluster: E2ECluster, namespace: str, selector: str = "", lines: int = 30) -> str:
    """Every pod of `namespace` (matching `selector`) that is not Ready: phase, container states, the pod's
    events and the last `lines` of each container's log (and of its previous run, after a restart)."""
    args = ["get", "pods", "-n", namespace, "-o", "json", *(["-l", selector] if selector else [])]
    proc = cluster.kubectl(*args, check=False)
    if proc.returncode:
        return f"(kubectl get pods failed: {proc.stderr.strip()})"
    out = []
    for pod in json.loads(proc.stdout)["items"]:
        name = pod["metadata"]["name"]
        conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
        if conditions.get("Ready") == "True":
            continue
        out.append(f"=== pod {namespace}/{name}: {pod['status'].get('phase')} {conditions}")
        for status in pod["status"].get("containerStatuses", []) + pod["status"].get("initContainerStatuses", []):
            out.append(f"container {status['name']}: restarts {status.get('restartCount', 0)}, "
                       f"state {json.dumps(status.get('state', {}))}, last {json.dumps(status.get('lastState', {}))}")
            for previous in (False, True):
                log = cluster.kubectl("logs", "-n", namespace, name, "-c", status["name"], f"--tail={lines}",
                                      *(["--previous"] if previous else []), check=False)
                if log.stdout.strip():
                    out.append(f"--- {'previous ' if previous else ''}log of {status['name']}:\n{log.stdout.rstrip()}")
        events = cluster.kubectl("get", "events", "-n", namespace, "--field-selector",
                                 f"involvedObject.name={name}", "-o",
                                 "custom-columns=REASON:.reason,MESSAGE:.message", "--no-headers", check=False)
        out.append(f"--- events:\n{events.stdout.rstrip()}")
    return "\n".join(out) or f"(every pod in {namespace} is Ready)"
