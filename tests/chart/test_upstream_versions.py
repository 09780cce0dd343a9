"""Every component image default is what NVIDIA's GPU Operator v26.7.0 ships, checked against what upstream
published, not against a restatement of values.yaml.

tests/fixtures/upstream-releases.json is recorded from git clones of the upstream repositories by
hack/record-upstream-releases.py (see tests/fixtures/README.md): from NVIDIA/gpu-operator at tag v26.7.0
the image entries of deployments/gpu-operator/values.yaml and its node-feature-discovery chart
dependency; from kubernetes-sigs/node-feature-discovery that chart's appVersion and image repository; and
every tag of each component's own repository, with the repository's newest commit (how recent the list is).
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

import pytest
from gpu_stack_dev.chartlib import CHART, ROOT, load_values

UPSTREAM: dict[str, Any] = json.loads((ROOT / "tests/fixtures/upstream-releases.json").read_text(encoding="utf-8"))
OPERATOR = UPSTREAM["gpu_operator"]
GPU_OPERATOR = f"GPU Operator {OPERATOR['release']}"
# values section -> the repository whose tags name its image's releases
PROJECT = {
    "devicePlugin": "k8s-device-plugin",
    "toolkit": "nvidia-container-toolkit",
    "migManager": "mig-parted",  # k8s-mig-manager is built from NVIDIA/mig-parted
    "dcgmExporter": "dcgm-exporter",
    "nfd": "node-feature-discovery",
}
SECTIONS = sorted(PROJECT)
# Tags upstream published after the recorded copy of its repository was made: the pin is then checked
# against the GPU Operator release only. Each entry must stay true (test_tags_not_yet_recorded_...).
NOT_YET_RECORDED = {"dcgm-exporter": "4.6.0-4.8.3"}


def operator_image(section: str) -> tuple[str, str]:
    """(repository, tag) that GPU Operator's release ships for our values section."""
    if section == "nfd":
        chart = UPSTREAM["nfd_chart"]
        assert chart["tag"] == f"v{OPERATOR['nfd_chart']['version']}"
        assert chart["image_tag"] is None, "the NFD chart's image tag defaults to its appVersion"
        return chart["image_repository"], chart["appVersion"]
    image = OPERATOR["images"][section]
    return f"{image['repository']}/{image['image']}", image["version"]


def git_tag(section: str, image_tag: str) -> str:
    return image_tag.removesuffix("-distroless") if section == "dcgmExporter" else image_tag


@pytest.mark.parametrize("section", SECTIONS)
def test_image_default_is_what_the_gpu_operator_release_ships(section: str) -> None:
    image = load_values()[section]["image"]
    assert (image["repository"], image["tag"]) == operator_image(section)


@pytest.mark.parametrize("section", SECTIONS)
def test_image_tag_is_a_release_its_project_tagged(section: str) -> None:
    project = UPSTREAM["projects"][PROJECT[section]]
    tag = git_tag(section, load_values()[section]["image"]["tag"])
    if NOT_YET_RECORDED.get(PROJECT[section]) == tag:
        assert tag not in project["tags"]
        return
    assert tag in project["tags"], f"{tag} is no tag of {project['repository']}"


def test_tags_not_yet_recorded_are_newer_than_the_recorded_repository() -> None:
    """An exception above holds only while the recorded tag list predates the GPU Operator release that
    cites the tag; once the fixture is recorded again with the tag in it, the exception must go."""
    released = datetime.fromisoformat(OPERATOR["date"])
    for name, tag in NOT_YET_RECORDED.items():
        project = UPSTREAM["projects"][name]
        assert tag not in project["tags"], f"{name} {tag} is recorded now: drop it from NOT_YET_RECORDED"
        assert datetime.fromisoformat(project["head_date"]) < released, name


def test_the_operator_release_is_a_tag_of_its_repository() -> None:
    assert OPERATOR["release"] in UPSTREAM["projects"]["gpu-operator"]["tags"]


@pytest.mark.parametrize("section", SECTIONS)
def test_tag_comment_names_the_upstream_release(section: str) -> None:
    text = (CHART / "values.yaml").read_text(encoding="utf-8")
    block = re.search(rf"^{section}:\n(.*?)^\S", text, re.S | re.M)
    assert block, section
    comment = re.search(r"# -- (.*)\n\s+tag:", block.group(1))
    assert comment, f"{section}.image.tag has no comment"
    assert GPU_OPERATOR in comment.group(1)
    version = operator_image(section)[1]
    assert version in comment.group(1) or version.lstrip("v") in comment.group(1)
