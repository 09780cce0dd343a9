"""Tests on a real node: the chart's pods run (kubelet v1.36.2, containerd + gVisor, CNI bridge, kube-proxy).

`make e2e` runs them as root inside network and mount namespaces of their own (hack/netns.py) after building
the webhook image with `make image` (the Makefile's e2e-image). Elsewhere (not root, an existing cluster)
every test here is skipped with the reason, unless GPU_STACK_REQUIRE_REAL=1 (set by `make e2e` where a
node can run, and by .ci/run): then a test that cannot start its node fails (tests/require.py `skip_or_fail`).

Fixtures (package scope: one plane and one node for this directory, stopped when its tests are done):
- `real_node`: the running hack/node.Node (`.name`, `.kubelet_root`, `.ctr(...)`, `.log_tail(name)`,
  `.load_image(path)`), on a control plane of its own (`.cluster`), with a private registry beside it.
- `node_registry`: that registry (gpu_stack_dev.registry: TLS, htpasswd; containerd trusts its CA), one per run
  of the node tests: the agents' images are pushed to it once (gpu_stack_dev.e2e.agent_images.load), releases
  too (test_registry.py).
- `cluster`: an E2ECluster for that plane (overrides tests/e2e/conftest.py's): `releases` installs into it.
- `webhook_image`: (repository, tag) of the image `make image` built, imported into the node.
- `installed` (module scope: a release's cluster-scoped objects exclude a second release, so a module that
  installs others does not use it): the chart installed once, `--wait`, with
  Chart-values-examples/per-node-configs.yaml (the overlay the docs' kubectl examples come from) and what
  this machine needs (install.INSTALL_SET); shared by the module's tests that only look at it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest
from gpu_stack_dev import netns, node
from gpu_stack_dev.e2e import agent_images
from gpu_stack_dev.e2e.e2elib import E2ECluster, Release, Releases, controlplane
from gpu_stack_dev.e2e.node_install import IMAGE_ARCHIVE, TEST_NAMESPACE, image_parts, install_values
from gpu_stack_dev.registry import DEBIAN_PACKAGES, TOOLS, Registry

from tests.require import skip_or_fail

from .podlogs import explain_pods


@pytest.fixture(scope="package")
def real_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[node.Node]:
    if os.environ.get("GPU_STACK_E2E_CLUSTER") == "existing":
        skip_or_fail("a real node is started only beside a throwaway control plane, not on an existing cluster")
    if not netns.inside():
        skip_or_fail("a real node runs only inside namespaces of its own: run as root through `make e2e` "
                    f"({netns.can_isolate() or 'hack/netns.py run -- pytest ...'})")
    assets = controlplane.resolve_assets(prepare=True)
    if assets is None:
        pytest.fail("no envtest assets (hack/envtest-assets.sh)")
    missing = node.missing_prerequisites(assets)
    if missing:
        pytest.fail(f"a real node needs {', '.join(missing)} (hack/ensure-node.sh, hack/envtest-assets.sh)")
    if not IMAGE_ARCHIVE.is_file():
        pytest.fail(f"{IMAGE_ARCHIVE} is missing: `make e2e-image` builds it with `make image`")
    absent = [tool for tool in TOOLS if not shutil.which(tool)]
    if absent:
        pytest.fail(f"the node's registry needs {', '.join(absent)} (Debian: {' '.join(DEBIAN_PACKAGES)}; "
                    "hack/ensure-node.sh)")
    with (controlplane.ControlPlane(assets, node_ip=node.NODE_IP) as plane, node.Node(plane) as real,
          Registry(tmp_path_factory.mktemp("node-registry"), host_ip=real.ip) as registry):
        agent_images.serve_from(real, registry)
        real.load_image(IMAGE_ARCHIVE)
        yield real


@pytest.fixture(scope="package")
def node_registry(real_node: node.Node) -> Registry:
    return agent_images.served(real_node).registry


@pytest.fixture(scope="package")
def cluster(real_node: node.Node, tmp_path_factory: pytest.TempPathFactory) -> E2ECluster:
    return E2ECluster.from_controlplane(real_node.cluster, tmp_path_factory.mktemp("helm-home-node"))


@pytest.fixture(scope="package")
def webhook_image(real_node: node.Node) -> tuple[str, str]:
    return image_parts()


def install_and_wait(releases: Releases, overlay: str | None = None, *, name: str = "gpu-stack",
                     namespace: str | None = None, timeout: str = "4m", **extra: object) -> Release:
    """`helm install --wait` of the chart with INSTALL_SET and the image; a failure shows what the pods say."""
    seconds = int(timeout[:-1]) * {"s": 1, "m": 60}[timeout[-1]]
    release, proc = releases.install(overlay, name=name, namespace=namespace, set_json=install_values(**extra),
                                     extra=["--wait", "--timeout", timeout], webhook_image=None, check=False,
                                     timeout=seconds + 60)  # helm's own failure message, with what it waited for
    if proc.returncode:
        pytest.fail(f"helm install --wait failed:\n{proc.stderr}\n{explain_pods(releases.cluster, release.namespace)}")
    return release


@pytest.fixture(scope="module")
def installed(cluster: E2ECluster) -> Iterator[Release]:
    """One release shared by the tests that only look at it: Chart-values-examples/per-node-configs.yaml (the
    overlay README's kubectl examples come from), INSTALL_SET and the image, `helm install --wait`."""
    helper = Releases(cluster)
    cluster.create_namespace(TEST_NAMESPACE)
    try:
        yield install_and_wait(helper, "per-node-configs.yaml", namespace="gpu-stack")
    finally:
        helper.cleanup()
