"""End-to-end fixtures: the chart and the webhook against a real Kubernetes API server.

Run with `make e2e` (every test here is marked `e2e`; `make test` does not collect tests/e2e). The
cluster is a throwaway control plane from hack/controlplane.py (etcd + kube-apiserver +
kube-controller-manager + kube-scheduler v1.36 from `KUBEBUILDER_ASSETS`, see hack/envtest-assets.sh), or,
with `GPU_STACK_E2E_CLUSTER=existing`, the cluster of `KUBECONFIG` (kind, a real GPU cluster). Without
either the session errors with a message saying what to provide. The throwaway plane has no kubelet and
no Nodes until a test publishes them (gpu_stack_dev.e2e.fleet): the scheduler binds pods to those Nodes, nothing
runs them; without Nodes pods stay Pending. Admission, controllers, GC and scheduling are real.

Fixtures:

- `cluster` (session): an `E2ECluster` (gpu_stack_dev.e2e.e2elib) with
  - `kind` ("envtest" | "existing") and `kubeconfig` (admin kubeconfig path),
  - `kubectl(*args, input=None, check=True)` -> `subprocess.CompletedProcess[str]` (real kubectl;
    check=True raises with stdout/stderr on a non-zero exit), `get_json(*args)`,
  - `helm(*args, check=True)` (Helm 4) and `helm3(*args, check=True)` (Helm 3),
  - `kubernetes`: a `kubernetes.client.ApiClient` for the same kubeconfig,
  - `create_namespace(name=None, labels=None)` (waits for its default ServiceAccount).
- `releases` (function): a `Releases` helper: `install(overlay=None, name="gpu-stack",
  helm_major=4, set_json=..., values=..., check=True, webhook_image=FAKE_WEBHOOK_IMAGE)` ->
  `(Release, CompletedProcess)` into a fresh namespace, `upgrade(release, ..., chart=CHART)`,
  `uninstall(release)`; at teardown it uninstalls what is still installed and deletes the namespaces it
  made. Install and upgrade pass `webhook.image.repository` (a fake name: no pod runs here) unless
  `webhook_image=None`. `Release` has `name`, `namespace`, `fullname`, `selector`, `webhook_image`.
- `live_webhook` (function): a factory; `live_webhook(release, policy=None, lookups=False,
  extra_args=(), probe_namespace=None)` runs `gpu-stack-webhook serve` on 127.0.0.1 over TLS with a
  loopback PKI (certs.write_loopback_pki), serving the release's own policy ConfigMap, and re-points the
  release's Mutating/ValidatingWebhookConfigurations to `clientConfig.url: https://127.0.0.1:PORT/...`
  with that caBundle; with `probe_namespace` it waits until the API server calls it. Returns a
  `LiveWebhook` (`port`, `pki`, `log()`); stopped at teardown.
- `gpu_operator` (module): the real GPU Operator v26.7.0 controller running as its own ServiceAccount in a
  fresh namespace (`GpuOperator`, gpu_stack_dev.e2e.gpu_operator: `prepare_node()`,
  `apply_cluster_policy(spec_overrides)`, `switch_to_nri()`, `wait_runtime_classes`, `wait_daemonsets`,
  `wait_pods_created`, `failed_creates`); removed with all it made at the end of the module. Without the
  build (../shared/gpu-operator) it skips, and fails with GPU_STACK_REQUIRE_REAL=1; on an existing cluster it skips.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from gpu_stack_dev.e2e.e2elib import E2ECluster, LiveWebhook, Release, Releases, controlplane, unique
from gpu_stack_dev.e2e.gpu_operator import GpuOperator, source_dir

from tests.require import skip_or_fail


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.e2e)
    # Cases that another module already covers on the session's plane are not generated for it (rather than
    # skipped): test_kubernetes_minors.py's overlay installs on 1.36 are test_install.py's.
    session_plane = [item for item in items if item.get_closest_marker("older_minors_only")
                     and getattr(item, "callspec", None) is not None and item.callspec.params.get("minor") == "1.36"]
    if session_plane:
        config.hook.pytest_deselected(items=session_plane)
        items[:] = [item for item in items if item not in session_plane]


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2ECluster]:
    try:
        plane = controlplane.connect(prepare=os.environ.get("GPU_STACK_E2E_PREPARE") == "1")
        with plane as running:
            yield E2ECluster.from_controlplane(running, tmp_path_factory.mktemp("helm-home"))
    except controlplane.ControlPlaneError as exc:
        pytest.exit(f"e2e: {exc}", returncode=2)
    # A run leaves nothing behind: every process of the plane stopped, its temp dir removed.
    alive = [pid for pid in running.pids if _alive(pid)]
    assert alive == [], f"control-plane processes still running: {alive}"
    assert running.workdir is None or not running.workdir.exists(), f"{running.workdir} left behind"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def releases(cluster: E2ECluster) -> Iterator[Releases]:
    helper = Releases(cluster)
    try:
        yield helper
    finally:
        helper.cleanup()


@pytest.fixture
def live_webhook(cluster: E2ECluster, tmp_path: Path) -> Iterator[Callable[..., LiveWebhook]]:
    started: list[LiveWebhook] = []

    def start(release: Release | None = None, **kwargs: Any) -> LiveWebhook:
        hook = LiveWebhook(cluster, tmp_path / f"webhook-{len(started)}")
        started.append(hook)
        return hook.start(release, **kwargs)

    try:
        yield start
    finally:
        for hook in started:
            hook.stop()


@pytest.fixture(scope="module")
def gpu_operator(cluster: E2ECluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GpuOperator]:
    if cluster.kind != "envtest":
        pytest.skip("runs the GPU Operator beside a throwaway plane only (an existing cluster may have its own)")
    if source_dir() is None:
        skip_or_fail("no GPU Operator build (../shared/gpu-operator or GPU_STACK_GPU_OPERATOR_SRC)")
    with GpuOperator(cluster, tmp_path_factory.mktemp("gpu-operator"), namespace=unique("nv-operator")) as running:
        yield running
