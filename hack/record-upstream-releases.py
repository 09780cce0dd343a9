#!/usr/bin/env python3
"""Record what upstream published for the chart's image pins into tests/fixtures/upstream-releases.json.

    python hack/record-upstream-releases.py GIT_DIR_OF_EACH_PROJECT... > tests/fixtures/upstream-releases.json

Each argument is `<key>=<git dir>` of a clone (or mirror) of the project's GitHub repository, for every
key of PROJECTS below. Read from git objects only, nothing from the network: every tag of each project,
its newest commit (how recent the tag list is), and from NVIDIA/gpu-operator at RELEASE the image
entries of deployments/gpu-operator/values.yaml and the node-feature-discovery chart dependency of
Chart.yaml; from kubernetes-sigs/node-feature-discovery the chart's appVersion and image repository at
that dependency's tag. tests/chart/test_upstream_versions.py checks values.yaml against the result.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import yaml

RELEASE = "v26.7.0"  # the GPU Operator release whose components the chart pins
PROJECTS = {
    "gpu-operator": "https://github.com/NVIDIA/gpu-operator",
    "k8s-device-plugin": "https://github.com/NVIDIA/k8s-device-plugin",
    "nvidia-container-toolkit": "https://github.com/NVIDIA/nvidia-container-toolkit",
    "mig-parted": "https://github.com/NVIDIA/mig-parted",
    "dcgm-exporter": "https://github.com/NVIDIA/dcgm-exporter",
    "node-feature-discovery": "https://github.com/kubernetes-sigs/node-feature-discovery",
}
# values.yaml sections of NVIDIA/gpu-operator's chart whose image the chart pins, by our values section.
OPERATOR_SECTIONS = {"devicePlugin": "devicePlugin", "toolkit": "toolkit", "migManager": "migManager",
                     "dcgmExporter": "dcgmExporter"}
NFD_CHART = "deployment/helm/node-feature-discovery"


def git(git_dir: str, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", git_dir, *args], check=True, capture_output=True,
                          text=True).stdout


def project(key: str, git_dir: str) -> dict[str, Any]:
    head, date = git(git_dir, "log", "-1", "--format=%H %cI", "HEAD").split()
    tags = sorted(git(git_dir, "tag", "--list").split())
    return {"repository": PROJECTS[key], "head": head, "head_date": date, "tags": tags}


def operator_release(git_dir: str) -> dict[str, Any]:
    commit, date = git(git_dir, "log", "-1", "--format=%H %cI", f"{RELEASE}^{{commit}}").split()
    values = yaml.safe_load(git(git_dir, "show", f"{RELEASE}:deployments/gpu-operator/values.yaml"))
    chart = yaml.safe_load(git(git_dir, "show", f"{RELEASE}:deployments/gpu-operator/Chart.yaml"))
    images = {ours: {k: values[theirs][k] for k in ("repository", "image", "version")}
              for ours, theirs in OPERATOR_SECTIONS.items()}
    (nfd,) = [d for d in chart["dependencies"] if d["name"] == "node-feature-discovery"]
    return {"release": RELEASE, "commit": commit, "date": date,
            "source": "deployments/gpu-operator/values.yaml and Chart.yaml at the tag",
            "images": images, "nfd_chart": {k: nfd[k] for k in ("name", "version", "repository")}}


def nfd_chart(git_dir: str, version: str) -> dict[str, Any]:
    tag = f"v{version}"
    chart = yaml.safe_load(git(git_dir, "show", f"{tag}:{NFD_CHART}/Chart.yaml"))
    values = yaml.safe_load(git(git_dir, "show", f"{tag}:{NFD_CHART}/values.yaml"))
    return {"tag": tag, "source": f"{NFD_CHART}/Chart.yaml and values.yaml at the tag",
            "appVersion": chart["appVersion"], "image_repository": values["image"]["repository"],
            "image_tag": values["image"]["tag"]}


def main(argv: list[str]) -> int:
    dirs = dict(arg.split("=", 1) for arg in argv)
    missing = sorted(set(PROJECTS) - set(dirs))
    if missing:
        print(f"usage: {sys.argv[0]} KEY=GIT_DIR ... (missing: {', '.join(missing)})", file=sys.stderr)
        return 2
    operator = operator_release(dirs["gpu-operator"])
    record = {
        "recorded_by": "hack/record-upstream-releases.py, from git clones of each repository (no registry queried)",
        "gpu_operator": operator,
        "nfd_chart": nfd_chart(dirs["node-feature-discovery"], operator["nfd_chart"]["version"]),
        "projects": {key: project(key, dirs[key]) for key in PROJECTS},
    }
    json.dump(record, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
