"""Building blocks of the end-to-end fixtures (tests/e2e/conftest.py documents the fixtures themselves).

- `E2ECluster`: a kubeconfig plus real kubectl / Helm 4 / Helm 3 binaries run against it.
- `Releases`: installs the chart into fresh namespaces and removes whatever a test left behind.
- `LiveWebhook`: `gpu-stack-webhook serve` on loopback over TLS, with a release's webhook
  configurations re-pointed at it (`clientConfig.url` + `caBundle`).
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml
from gpu_stack_webhook.tls.certs import PkiFiles, write_loopback_pki

from gpu_stack_dev import controlplane
from gpu_stack_dev.paths import CHART, EXAMPLES, ROOT

WEBHOOK_KINDS = ("mutatingwebhookconfiguration", "validatingwebhookconfiguration")
# The webhook image every release here names unless a test says otherwise: the chart refuses an install
# without one (templates/validate.yaml), and no pod ever runs on the throwaway control plane (no kubelet),
# so a name no registry answers (.invalid, RFC 2606) is enough. On an existing cluster its pods stay in
# ErrImagePull; the e2e tests call `gpu-stack-webhook serve` on loopback (LiveWebhook) instead.
FAKE_WEBHOOK_IMAGE = "registry.invalid/gpu-stack-webhook"
# The policy-only overlays (docs/gpu-operator.md) give the webhook a Role in the GPU Operator's or the device
# plugin's namespace, which must exist: an install of one without that value set gets a fresh namespace.
POLICY_ONLY_NAMESPACE = {"policy-only-gpu-operator.yaml": "webhook.policySource.gpuOperator.namespace",
                         "policy-only-device-plugin.yaml": "webhook.policySource.devicePlugin.namespace"}


def overlays() -> list[str]:
    """"default" plus every file in Chart-values-examples/ (file name)."""
    return ["default", *sorted(p.name for p in EXAMPLES.glob("*.y*ml"))]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def _ensure_helm(major: int) -> str:
    out = subprocess.run([str(ROOT / "hack" / "ensure-helm.sh"), str(major)], check=True, capture_output=True,
                         text=True)
    return out.stdout.strip().splitlines()[-1]


@dataclass
class E2ECluster:
    kind: str  # "envtest" or "existing"
    kubeconfig: Path
    kubectl_bin: str
    helm4_bin: str
    helm3_bin: str
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_controlplane(cls, cluster: controlplane.Cluster, home: Path) -> E2ECluster:
        home.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig),
               # Helm's cache/config/data (repositories, registry logins) stay out of the user's home.
               "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
               "HELM_DATA_HOME": str(home / "data")}
        return cls(kind=cluster.kind, kubeconfig=cluster.kubeconfig, kubectl_bin=cluster.kubectl,
                   helm4_bin=cluster.helm or _ensure_helm(4), helm3_bin=_ensure_helm(3), env=env)

    def _run(self, binary: str, args: Sequence[str], input: str | None, check: bool,
             timeout: float) -> subprocess.CompletedProcess[str]:
        started = time.monotonic()
        proc = subprocess.run([binary, *map(str, args)], input=input, capture_output=True, text=True,
                              env=self.env, timeout=timeout, check=False)
        # pytest shows this captured trail when a test fails
        command = f"{Path(binary).name} {' '.join(map(str, args))}"
        print(f"[{time.monotonic() - started:5.1f}s rc={proc.returncode}] {command}")
        if check and proc.returncode != 0:
            raise AssertionError(f"{Path(binary).name} {' '.join(map(str, args))} exited {proc.returncode}\n"
                                 f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
        return proc

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return self._run(self.kubectl_bin, args, input, check, timeout)

    def helm(self, *args: str, input: str | None = None, check: bool = True,
             timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Helm 4."""
        return self._run(self.helm4_bin, args, input, check, timeout)

    def helm3(self, *args: str, input: str | None = None, check: bool = True,
              timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return self._run(self.helm3_bin, args, input, check, timeout)

    def get_json(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    @cached_property
    def kubernetes(self) -> Any:
        """A `kubernetes.client.ApiClient` for the admin kubeconfig."""
        from kubernetes import config  # noqa: PLC0415  (slow import, only when used)

        return config.new_client_from_config(config_file=str(self.kubeconfig))  # type: ignore[no-untyped-call]

    def wait_default_serviceaccount(self, namespace: str, timeout: float = 60) -> None:
        """Pods need the namespace's "default" ServiceAccount, which the controller manager creates."""
        deadline = time.monotonic() + timeout
        while self.kubectl("get", "serviceaccount", "default", "-n", namespace, check=False).returncode:
            if time.monotonic() > deadline:
                raise AssertionError(f"no ServiceAccount default in {namespace} after {timeout}s")
            time.sleep(0.3)

    def create_namespace(self, name: str | None = None, labels: Mapping[str, str] | None = None) -> str:
        name = name or unique("e2e")
        self.kubectl("create", "namespace", name)
        if labels:
            self.kubectl("label", "namespace", name, *(f"{k}={v}" for k, v in labels.items()))
        self.wait_default_serviceaccount(name)
        return name


@dataclass(frozen=True)
class Release:
    name: str
    namespace: str
    helm_major: int = 4
    webhook_image: str | None = None  # webhook.image.repository passed on install and on every upgrade
    # --set-json values passed on install and on every upgrade (the policy-only overlays' namespace)
    values: tuple[tuple[str, Any], ...] = ()

    @property
    def fullname(self) -> str:
        return self.name if "gpu-stack" in self.name else f"{self.name}-gpu-stack"

    @property
    def selector(self) -> str:
        return f"app.kubernetes.io/instance={self.name}"


def values_args(overlay: str | None = None, values: Iterable[str] = (),
                set_json: Mapping[str, Any] | None = None) -> list[str]:
    args: list[str] = []
    if overlay and overlay != "default":
        args += ["-f", str(EXAMPLES / overlay)]
    for path in values:
        args += ["-f", str(path)]
    for key, value in (set_json or {}).items():
        args += ["--set-json", f"{key}={json.dumps(value)}"]
    return args


class Releases:
    """Installs the chart; at the end uninstalls what is still installed and deletes the namespaces."""

    def __init__(self, cluster: E2ECluster) -> None:
        self.cluster = cluster
        self.installed: list[Release] = []
        self.namespaces: list[str] = []

    def helm_for(self, major: int) -> Callable[..., subprocess.CompletedProcess[str]]:
        return self.cluster.helm if major == 4 else self.cluster.helm3

    @staticmethod
    def _with_image(release: Release, set_json: Mapping[str, Any] | None) -> dict[str, Any]:
        """The release's webhook image first: a webhook.image.repository in `set_json` wins (values files
        and `extra` do not: --set-json outranks them; pass webhook_image=None to leave it out)."""
        image = {"webhook.image.repository": release.webhook_image} if release.webhook_image else {}
        return {**image, **dict(release.values), **(set_json or {})}

    def install(self, overlay: str | None = None, *, name: str = "gpu-stack", namespace: str | None = None,
                helm_major: int = 4, values: Iterable[str] = (), set_json: Mapping[str, Any] | None = None,
                extra: Sequence[str] = (), check: bool = True, webhook_image: str | None = FAKE_WEBHOOK_IMAGE,
                timeout: float = 300) -> tuple[Release, subprocess.CompletedProcess[str]]:
        """`timeout`: seconds before helm itself is killed (keep it above a `--timeout` in `extra`, so that helm's
        own message says what it waited for)."""
        remembered: tuple[tuple[str, Any], ...] = ()
        key = POLICY_ONLY_NAMESPACE.get(overlay or "")
        if key and key not in (set_json or {}):
            remembered = ((key, self.cluster.create_namespace()),)
            self.namespaces.append(remembered[0][1])
        release = Release(name, namespace or unique("gpu-stack"), helm_major, webhook_image, remembered)
        self.namespaces.append(release.namespace)
        # Recorded before helm runs: a failed install leaves a release record and cluster-scoped objects
        # (ClusterRoles, policies) that only `helm uninstall` removes, not the namespace's deletion.
        self.installed.append(release)
        proc = self.helm_for(helm_major)(
            "install", release.name, str(CHART), "-n", release.namespace, "--create-namespace",
            *values_args(overlay, values, self._with_image(release, set_json)), *extra, check=check, timeout=timeout)
        return release, proc

    def upgrade(self, release: Release, overlay: str | None = None, *, chart: Path = CHART,
                values: Iterable[str] = (), set_json: Mapping[str, Any] | None = None, extra: Sequence[str] = (),
                check: bool = True) -> subprocess.CompletedProcess[str]:
        """`helm upgrade` with values resets the others to the chart's defaults: the image is passed again."""
        return self.helm_for(release.helm_major)(
            "upgrade", release.name, str(chart), "-n", release.namespace,
            *values_args(overlay, values, self._with_image(release, set_json)), *extra, check=check)

    def uninstall(self, release: Release, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = self.helm_for(release.helm_major)("uninstall", release.name, "-n", release.namespace, "--wait",
                                                 "--timeout", "60s", check=check)
        with contextlib.suppress(ValueError):
            self.installed.remove(release)
        return proc

    def cleanup(self) -> None:
        for release in list(self.installed):
            self.uninstall(release, check=False)
        for namespace in self.namespaces:
            self.cluster.kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=false", check=False)


class LiveWebhook:
    """`gpu-stack-webhook serve` over TLS on 127.0.0.1 that a release's webhook configurations call."""

    STARTUP_SECONDS = 60

    def __init__(self, cluster: E2ECluster, workdir: Path) -> None:
        self.cluster = cluster
        self.workdir = workdir
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.pki: PkiFiles | None = None
        self.log_path = workdir / "webhook.log"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def start(self, release: Release | None = None, *, policy: Mapping[str, Any] | None = None,
              lookups: bool = False, extra_args: Sequence[str] = (), probe_namespace: str | None = None) -> LiveWebhook:
        """Serve the release's own policy (its ConfigMap) unless `policy` is given; with a release,
        re-point its webhook configurations here and (probe_namespace) wait until the API server calls us."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.pki = write_loopback_pki(self.workdir / "pki")
        config = self.workdir / "policy.yaml"
        if policy is not None:
            config.write_text(yaml.safe_dump(dict(policy)))
        elif release is not None:
            config.write_text(self.cluster.kubectl(
                "get", "configmap", f"{release.fullname}-webhook-policy", "-n", release.namespace,
                "-o", "jsonpath={.data.policy\\.yaml}").stdout)
        else:
            config.write_text("{}\n")
        args = ["--config", str(config), "--cert", str(self.pki.cert), "--key", str(self.pki.key), *extra_args]
        if lookups:
            args += ["--kubeconfig", str(self.cluster.kubeconfig), "--cluster-lookups"]
        self._serve(args)
        if release is not None:
            self.repoint(release)
            if probe_namespace:
                self.wait_called(probe_namespace)
        return self

    @staticmethod
    def command() -> list[str]:
        script = Path(sys.executable).with_name("gpu-stack-webhook")
        return [str(script)] if script.exists() else [shutil.which("gpu-stack-webhook") or "gpu-stack-webhook"]

    def serve_env(self) -> dict[str, str]:
        env = {k: v for k, v in self.cluster.env.items() if k not in ("PROMETHEUS_MULTIPROC_DIR",
                                                                       "GPU_STACK_WEBHOOK_CONFIG")}
        return env | {"GPU_STACK_WEBHOOK_WORKERS": "1", "GPU_STACK_WEBHOOK_THREADS": "4"}

    def _serve(self, args: list[str]) -> None:
        for _attempt in range(3):  # another process may take the free port before gunicorn binds it
            self.port = controlplane.free_port()
            with self.log_path.open("ab") as log:
                self.process = subprocess.Popen([*self.command(), "serve", *args, "--bind", f"127.0.0.1:{self.port}"],
                                                stdout=log, stderr=subprocess.STDOUT, env=self.serve_env(),
                                                cwd=self.workdir, start_new_session=True)
            if self._wait_healthy():
                return
            if "already in use" not in self.log():
                break
        raise AssertionError(f"gpu-stack-webhook serve did not start:\n{self.log()}")

    def _wait_healthy(self) -> bool:
        assert self.process is not None and self.pki is not None
        context = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        deadline = time.monotonic() + self.STARTUP_SECONDS
        while time.monotonic() < deadline and self.process.poll() is None:
            with contextlib.suppress(OSError, http.client.HTTPException):
                conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=context, timeout=5)
                conn.request("GET", "/healthz")
                if conn.getresponse().status == 200:
                    conn.close()
                    return True
            time.sleep(0.2)
        return False

    def repoint(self, release: Release) -> None:
        """Every webhook of the release's configurations -> clientConfig.url on loopback + our CA."""
        assert self.pki is not None
        ca = base64.b64encode(self.pki.ca_cert.read_bytes()).decode()
        for kind in WEBHOOK_KINDS:
            for obj in self.cluster.get_json(kind, "-l", release.selector)["items"]:
                patch = [{"op": "replace", "path": f"/webhooks/{i}/clientConfig",
                          "value": {"url": f"https://127.0.0.1:{self.port}{hook['clientConfig']['service']['path']}",
                                    "caBundle": ca}}
                         for i, hook in enumerate(obj["webhooks"]) if "service" in hook["clientConfig"]]
                if patch:
                    self.cluster.kubectl("patch", kind, obj["metadata"]["name"], "--type=json", "-p", json.dumps(patch))

    def wait_called(self, namespace: str, timeout: float = 30) -> None:
        """Until the API server sends us reviews: a dry-run GPU pod setting NVIDIA_VISIBLE_DEVICES is denied."""
        probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "live-webhook-probe"},
                 "spec": {"containers": [{"name": "c", "image": "busybox",
                                          "resources": {"limits": {"nvidia.com/gpu": 1}},
                                          "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]}}
        deadline = time.monotonic() + timeout
        while True:
            proc = self.cluster.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-",
                                        input=json.dumps(probe), check=False)
            if "denied the request" in proc.stderr:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"the API server does not call the live webhook: {proc.stderr}\n{self.log()}")
            time.sleep(0.3)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
