#!/usr/bin/env python3
"""`make demo`: the webhook judging the manifests of hack/demo/manifests, on a real API server when there is one.

With a control plane at hand (GPU_STACK_E2E_CLUSTER=existing + KUBECONFIG, KUBEBUILDER_ASSETS,
.tools/envtest, or ../shared/envtest prepared by hack/envtest-assets.sh: see hack/controlplane.py),
gpu_stack_dev.demo_live installs the chart and runs real kubectl against it. Without one, the offline demo:

1. Renders charts/gpu-stack with real Helm for the defaults and every Chart-values-examples/ overlay.
2. Takes the webhook policy ConfigMap from the per-node-configs render (exclusive, time-slicing,
   MPS and MIG configs side by side), so the webhook judges with exactly what the chart deploys.
3. Makes a throwaway CA and an ECDSA serving certificate, starts `gpu-stack-webhook serve`
   (gunicorn, TLS) on 127.0.0.1, and sends every manifest under hack/demo/manifests/ as the
   kube-apiserver would: AdmissionReview to /mutate, apply the patch, then /validate.
4. Prints what kubectl would show for each, and stops the server.
"""

from __future__ import annotations

import base64
import collections
import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import jsonpatch
import yaml
from gpu_stack_dev import controlplane
from gpu_stack_webhook.admission.requests import admission_review
from gpu_stack_webhook.tls.certs import write_loopback_pki

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "gpu-stack"
OVERLAYS = ROOT / "Chart-values-examples"
MANIFESTS = ROOT / "hack" / "demo" / "manifests"
POLICY_OVERLAY = "per-node-configs.yaml"
NAMESPACE = "gpu-demo"
WEBHOOKS = {"mutate": "mutate.gpu-stack.io", "validate": "validate.gpu-stack.io"}


def heading(text: str) -> None:
    print(f"\n\033[1m== {text}\033[0m" if sys.stdout.isatty() else f"\n== {text}")


def helm_binary() -> str:
    return subprocess.run([str(ROOT / "hack" / "ensure-helm.sh"), "3"], check=True, capture_output=True,
                          text=True).stdout.strip()


def render_chart(helm: str, overlay: Path | None) -> list[dict[str, Any]]:
    cmd = [helm, "template", "gpu-stack", str(CHART), "--namespace", "gpu-stack"]
    if overlay:
        cmd += ["-f", str(overlay)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def render_all(workdir: Path) -> Path:
    heading("Chart rendered for the defaults and every overlay (helm template)")
    helm = helm_binary()
    policy_file = workdir / "policy.yaml"
    for overlay in [None, *sorted(OVERLAYS.glob("*.yaml"))]:
        name = overlay.name if overlay else "(defaults)"
        objects = render_chart(helm, overlay)
        kinds = collections.Counter(o["kind"] for o in objects)
        configs = sorted(
            next((o["data"] for o in objects if o["kind"] == "ConfigMap"
                  and o["metadata"]["name"].endswith("-device-plugin-configs")), {})
        )
        summary = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
        print(f"{name:40} {len(objects):3} objects; sharing configs: {', '.join(configs) or '-'}")
        print(f"{'':40} {summary}")
        if overlay and overlay.name == POLICY_OVERLAY:
            policy = next(o for o in objects if o["kind"] == "ConfigMap"
                          and o["metadata"]["name"].endswith("-webhook-policy"))
            policy_file.write_text(policy["data"]["policy.yaml"])
    if not policy_file.exists():
        sys.exit(f"demo: {POLICY_OVERLAY} did not render a webhook policy ConfigMap")
    return policy_file


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Webhook:
    """`gpu-stack-webhook serve` in a subprocess, over TLS on 127.0.0.1."""

    def __init__(self, workdir: Path, policy: Path) -> None:
        pki = write_loopback_pki(workdir)
        self.port = free_port()
        self.context = ssl.create_default_context(cafile=str(pki.ca_cert))
        executable = Path(sys.executable).with_name("gpu-stack-webhook")
        self.process = subprocess.Popen(
            [str(executable), "serve", "--config", str(policy), "--cert", str(pki.cert),
             "--key", str(pki.key), "--bind", f"127.0.0.1:{self.port}"],
            stdout=subprocess.DEVNULL, stderr=(workdir / "webhook.log").open("w"), start_new_session=True,
        )
        self.log = workdir / "webhook.log"
        self.connection = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.context, timeout=10)

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                sys.exit(f"demo: the webhook exited with {self.process.returncode}:\n{self.log.read_text()}")
            try:
                status, _ = self.request("GET", "/readyz")
                if status == 200:
                    return
            except OSError:
                self.connection.close()
            time.sleep(0.2)
        sys.exit("demo: the webhook did not become ready")

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        payload = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if payload else {}
        self.connection.request(method, path, body=payload, headers=headers)
        response = self.connection.getresponse()
        data = response.read()
        return response.status, (json.loads(data) if data and path.startswith(("/mutate", "/validate")) else data)

    def review(self, endpoint: str, obj: dict[str, Any]) -> dict[str, Any]:
        status, body = self.request("POST", f"/{endpoint}", admission_review(obj, namespace=NAMESPACE))
        if status != 200:
            raise RuntimeError(f"/{endpoint} answered HTTP {status}: {body}")
        return dict(body["response"])

    def stop(self) -> None:
        self.connection.close()
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def kubectl_like(webhook: Webhook, obj: dict[str, Any], source: str) -> str:
    """Play the apiserver: mutate, apply the patch, validate; return what kubectl would print."""
    resource = f"{obj['kind'].lower()}/{obj['metadata'].get('name', '')}"
    lines: list[str] = []
    for endpoint in ("mutate", "validate"):
        response = webhook.review(endpoint, obj)
        lines += [f"Warning: {w}" for w in response.get("warnings", [])]
        if not response["allowed"]:
            status = response.get("status", {})
            lines.append(f'Error from server ({status.get("reason", "")}): error when creating "{source}": '
                         f'admission webhook "{WEBHOOKS[endpoint]}" denied the request: {status.get("message")}')
            return "\n".join(lines)
        if endpoint == "mutate" and "patch" in response:
            patch = json.loads(base64.b64decode(response["patch"]))
            obj = jsonpatch.apply_patch(obj, patch)
            lines += [f"  (patched by {WEBHOOKS['mutate']}: {op['op']} {op['path']} = {json.dumps(op['value'])})"
                      for op in patch]
    lines.append(f"{resource} created")
    return "\n".join(lines)


def main() -> int:
    try:
        live = os.environ.get("GPU_STACK_E2E_CLUSTER") == "existing" or controlplane.resolve_assets(prepare=True)
    except (controlplane.ControlPlaneError, subprocess.CalledProcessError) as exc:
        live, reason = None, str(exc).splitlines()[0]
    else:
        reason = "no KUBEBUILDER_ASSETS, no ../shared/envtest, no GPU_STACK_E2E_CLUSTER=existing"
    if live:
        from gpu_stack_dev import demo_live  # noqa: PLC0415  (imports the e2e helpers, only needed here)

        with controlplane.connect() as plane:
            print(f"gpu-stack demo on {demo_live.describe(plane)}", flush=True)
            return demo_live.run(plane)
    print(f"gpu-stack demo offline (no control plane: {reason}): the webhook over TLS, reviews sent as the "
          "API server would")
    return offline()


def offline() -> int:
    with tempfile.TemporaryDirectory(prefix="gpu-stack-demo-") as tmp:
        workdir = Path(tmp)
        policy = render_all(workdir)
        heading(f"Webhook live over TLS (gunicorn) with the policy rendered from {POLICY_OVERLAY}")
        webhook = Webhook(workdir, policy)
        decisions = collections.Counter()
        try:
            webhook.wait_ready()
            print(f"serving on https://127.0.0.1:{webhook.port} (mutate + validate), namespace {NAMESPACE}")
            for manifest in sorted(MANIFESTS.glob("*.yaml")):
                comment = [ln[2:] for ln in manifest.read_text().splitlines() if ln.startswith("# ")]
                for obj in (d for d in yaml.safe_load_all(manifest.read_text()) if d):
                    heading(f"kubectl apply -f {manifest.name}")
                    print("\n".join(f"  # {ln}" for ln in comment))
                    output = kubectl_like(webhook, obj, manifest.name)
                    print(output)
                    decisions["denied" if "denied the request" in output else "admitted"] += 1
            status, metrics = webhook.request("GET", "/metrics")
            reviews = [ln for ln in metrics.decode().splitlines()
                       if ln.startswith("gpu_stack_admission_reviews_total{")]
            heading("What the webhook counted (/metrics)")
            print("\n".join(reviews) if status == 200 else f"/metrics answered {status}")
        finally:
            webhook.stop()
        heading(f"{sum(decisions.values())} manifests: {decisions['admitted']} admitted, "
                f"{decisions['denied']} denied; webhook stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
