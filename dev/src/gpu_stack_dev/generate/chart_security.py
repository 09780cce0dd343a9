"""The chart's declared security-scanner exceptions: which checkov checks may be skipped at all, the
`checkov.io/skipN: CKV_K8S_<id>=<reason>` annotations the chart renders, and the README table listing them
(`make generate`).

The table is the union over the defaults, every overlay in Chart-values-examples/ and a render with a helm
test namespace (the webhook denial test). `make lint` (hack/chart-scan.py) runs checkov itself; the chart
tests (tests/chart/test_security.py) check every annotation against ALLOWED. Needs helm (hack/ensure-helm.sh).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator, Mapping
from typing import Any

import yaml

from gpu_stack_dev.generate.paths import CHART, EXAMPLES, TEMPLATE_API_VERSIONS, helm, with_section

SECTION = "security-table"
RELEASE, NAMESPACE = "gpu-stack", "gpu-stack"
SKIP_KEY = re.compile(r"^checkov\.io/skip[0-9]+$")
SKIP_VALUE = re.compile(r"^(CKV2?_K8S_[0-9]+)=(.+)$")

# The only checks an object may skip, each with the inherent kind of exception it stands for.
ALLOWED: dict[str, str] = {
    "CKV_K8S_16": "privileged GPU/runtime agent",
    "CKV_K8S_17": "host PID namespace for a GPU/runtime agent",
    "CKV_K8S_18": "host IPC namespace for a GPU/runtime agent",
    "CKV_K8S_19": "host network namespace for a GPU/runtime agent",
    "CKV_K8S_20": "privilege escalation (privileged GPU/runtime agent)",
    "CKV_K8S_23": "root (privileged GPU/runtime agent)",
    "CKV_K8S_40": "root UID (privileged GPU/runtime agent)",
    "CKV_K8S_28": "capabilities (privileged GPU/runtime agent)",
    "CKV_K8S_37": "capabilities (privileged GPU/runtime agent)",
    "CKV_K8S_39": "capabilities (privileged GPU/runtime agent)",
    "CKV_K8S_22": "host driver injected into (or, driver container, exported from) the root filesystem",
    "CKV_K8S_38": "ServiceAccount token for a pod that calls the API",
    "CKV_K8S_11": "no CPU limit",
    "CKV_K8S_15": "image pull policy (a value)",
    "CKV_K8S_43": "image digest (a value)",
    "CKV2_K8S_6": "NetworkPolicy for a host-network agent",
    "CKV_K8S_8": "liveness probe on a one-shot test pod",
    "CKV_K8S_9": "readiness probe on a one-shot test pod",
    "CKV_K8S_155": "the webhook's rights on its own webhook configurations",
}

WORKLOAD_KINDS = ("Deployment", "DaemonSet", "StatefulSet", "Job", "CronJob", "Pod")


def scenarios() -> dict[str, list[str]]:
    """name -> extra `helm template` arguments: the defaults, every overlay, the helm tests' namespace (the
    webhook denial test) and the optional driver container."""
    out: dict[str, list[str]] = {"defaults": []}
    for overlay in sorted(EXAMPLES.glob("*.yaml")):
        out[overlay.stem] = ["-f", str(overlay)]
    out["helm-tests-namespace"] = ["--set", "webhook.helmTests.namespace=gpu-check"]
    out["driver-container"] = ["--set", "driver.enabled=true"]
    return out


def render(binary: str, args: list[str]) -> str:
    cmd = [binary, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *TEMPLATE_API_VERSIONS, *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def objects(manifest: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(manifest) if d]


def skips(obj: Mapping[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(annotation key, check id, reason) of every checkov skip annotation on the object; a malformed value
    yields ("key", "", raw value)."""
    for key, value in ((obj.get("metadata") or {}).get("annotations") or {}).items():
        if not SKIP_KEY.match(key):
            continue
        match = SKIP_VALUE.match(str(value))
        yield (key, match.group(1), match.group(2)) if match else (key, "", str(value))


def label(obj: Mapping[str, Any]) -> str:
    name = obj["metadata"]["name"].removeprefix(f"{RELEASE}-")
    return f"{obj['kind']}/{name}"


def table(binary: str) -> str:
    rows: dict[tuple[str, str], str] = {}
    for args in scenarios().values():
        for obj in objects(render(binary, args)):
            for _, check, reason in skips(obj):
                rows[(label(obj), check)] = reason
    lines = ["Every check an object of the chart skips, with the reason it carries (union over the defaults, "
             "every overlay, a helm test namespace and the driver container; release `gpu-stack`).", "",
             "| Object | Check | Kind of exception | Reason (the annotation's text) |", "|---|---|---|---|"]
    order = {check: i for i, check in enumerate(ALLOWED)}
    for (name, check), reason in sorted(rows.items(), key=lambda r: (r[0][0], order.get(r[0][1], 99), r[0][1])):
        lines.append(f"| `{name}` | {check} | {ALLOWED.get(check, 'NOT ALLOWED')} | {reason} |")
    return "\n".join(lines)


def readme(text: str) -> str:
    """The chart README `text` with its exceptions table made from the rendered chart."""
    return with_section(text, SECTION, "\n" + table(helm()) + "\n\n")
