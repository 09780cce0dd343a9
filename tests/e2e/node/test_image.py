"""The image `make image` built from webhook/Dockerfile (`make e2e-image`: buildah, the stand-in base), read from
the very archive the node imported: what it holds, and that the node runs it as the chart says.

The archive is a docker-archive tarball (manifest.json, the image config, one tar per layer); the file tree is
the layers applied in order, whiteouts (`.wh.` entries) removing what earlier layers added.
"""

from __future__ import annotations

import json
import tarfile
from functools import cache
from pathlib import PurePosixPath

from gpu_stack_dev.e2e.node_install import IMAGE, IMAGE_ARCHIVE

from tests.require import skip_or_fail

SITE = "opt/venv/lib/python3.11/site-packages"
COMPILERS = ("usr/bin/gcc", "usr/bin/cc", "usr/bin/x86_64-linux-gnu-gcc-12", "usr/bin/c++", "usr/bin/clang")


@cache
def image() -> tuple[dict, frozenset[str], int]:
    """(config, the files of the image's tree, the sum of its layers' sizes) of IMAGE_ARCHIVE."""
    if not IMAGE_ARCHIVE.is_file():
        skip_or_fail(f"{IMAGE_ARCHIVE} is not there: `make e2e-image` builds it")
    with tarfile.open(IMAGE_ARCHIVE) as archive:
        [manifest] = json.load(archive.extractfile("manifest.json"))  # type: ignore[arg-type]
        config = json.load(archive.extractfile(manifest["Config"]))  # type: ignore[arg-type]
        files: set[str] = set()
        size = 0
        for layer in manifest["Layers"]:
            member = archive.getmember(layer)
            size += member.size
            with tarfile.open(fileobj=archive.extractfile(member)) as tar:
                for entry in tar:
                    path = PurePosixPath(entry.name.removeprefix("./"))
                    if path.name.startswith(".wh."):
                        gone = str(path.parent / path.name.removeprefix(".wh."))
                        files = {f for f in files if f != gone and not f.startswith(f"{gone}/")}
                        if path.name == ".wh..wh..opq":
                            files = {f for f in files if not f.startswith(f"{path.parent}/")}
                    else:
                        files.add(str(path))
    return config, frozenset(files), size


def test_the_archive_is_the_image_make_image_built() -> None:
    with tarfile.open(IMAGE_ARCHIVE) as archive:
        [manifest] = json.load(archive.extractfile("manifest.json"))  # type: ignore[arg-type]
    assert manifest["RepoTags"] == [IMAGE]
    config, _, size = image()
    assert config["config"]["Entrypoint"] == ["gpu-stack-webhook"]
    print(f"{IMAGE}: {size / 1e6:.0f} MB in {len(manifest['Layers'])} layers (uncompressed)")


def test_it_runs_as_uid_65532() -> None:
    config, _, _ = image()
    assert config["config"]["User"] == "65532:65532"


def test_the_review_path_is_compiled() -> None:
    _, files, _ = image()
    compiled = [f for f in files if f.startswith(f"{SITE}/gpu_stack_webhook/policy/engine.") and f.endswith(".so")]
    assert compiled, "policy/engine is not a compiled extension"


def test_no_compiler_and_no_package_caches() -> None:
    _, files, _ = image()
    assert [c for c in COMPILERS if c in files] == []
    assert [f for f in files if f.startswith(("root/.cache/pip", "tmp/pip-"))] == []
    assert [f for f in files if f.startswith("var/cache/apt/archives/") and f.endswith(".deb")] == []
    assert [f for f in files if f.startswith("var/lib/apt/lists/") and not f.endswith(("lock", "partial"))] == []
    assert [f for f in files if f.startswith(("opt/build-tools", "src/", "wheels/"))] == []
