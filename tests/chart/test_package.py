"""The packaged chart (`helm package`) carries the overlays under examples/, and an overlay taken from the
package installs the same objects as the repository's `-f Chart-values-examples/X.yaml`."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest
from gpu_stack_dev.chartlib import CHART, EXAMPLES, HELM_MAJORS, overlays, render, run_helm
from gpu_stack_dev.paths import TEMPLATE_API_VERSIONS


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("package")
    packaged = run_helm(4, ["package", str(CHART), "--destination", str(out)])
    assert packaged.ok, packaged.stderr
    (tgz,) = out.glob("gpu-stack-*.tgz")
    with tarfile.open(tgz) as archive:
        archive.extractall(out / "unpacked", filter="data")
    return out / "unpacked" / "gpu-stack"


def test_every_overlay_is_in_the_package(package: Path) -> None:
    assert sorted(p.name for p in (package / "examples").glob("*.yaml")) == sorted(
        p.name for p in EXAMPLES.glob("*.yaml"))


@pytest.mark.parametrize("helm", HELM_MAJORS)
@pytest.mark.parametrize("overlay", [o for o in overlays() if o != "default"])
def test_an_overlay_from_the_package_renders_like_the_documented_path(package: Path, helm: int, overlay: str) -> None:
    from_package = run_helm(helm, ["template", "t", str(package), "--namespace", "gpu-stack", *TEMPLATE_API_VERSIONS,
                                   "-f", str(package / "examples" / overlay)])
    assert from_package.ok, from_package.stderr
    assert from_package.objects() == render(helm, overlay).objects()
