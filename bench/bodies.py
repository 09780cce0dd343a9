"""The request mix `make bench` replays: AdmissionReview bodies built from the recorded apiserver traffic.

Every body starts from a request a real kube-apiserver v1.36 sent (tests/fixtures/apiserver-v1.36,
copied from ../shared/fixtures) and is scaled up from it, so headers, managedFields, the ServiceAccount volume
and the defaulted fields are what the webhook really sees:

* `gpu-pod`: the recorded 1-container GPU pod (`pod-gpu-limit-only-*`), unchanged.
* `pod-10x50env`: the same pod with 10 containers of 50 env vars each (GPU in the first).
* `mps-pod`: the recorded pod with the `gpu-stack.io/mps: "true"` annotation: /mutate patches it.
* `deployment`: the recorded Deployment CREATE (`deployment-create-*`): the pod template is judged.
* `denied-pod`: the recorded pod with NVIDIA_VISIBLE_DEVICES (`pod-env-nvidia-visible-*`): /validate denies.

`scaled_pod(n)` gives the 1/10/50/200-container pods of the size sweep. `gpu_pod_3c(endpoint)` is the pod of
issue 14's targets: the recorded GPU pod with 3 containers of 20 env vars each; on /mutate it carries the
MPS annotation, so the answer has a patch. Bodies are compact JSON, as
the apiserver sends them (the recordings are pretty-printed only for storage).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "apiserver-v1.36" / "admission-requests"
ENDPOINTS = ("validate", "mutate")
MPS_ANNOTATION = "gpu-stack.io/mps"
GPU = "nvidia.com/gpu"


@dataclass(frozen=True)
class Body:
    name: str
    path: str  # /validate or /mutate
    review: dict[str, Any]
    # What the webhook must answer: allowed (True/False) and whether /mutate sends a JSONPatch.
    allowed: bool
    patched: bool = False

    @property
    def data(self) -> bytes:
        return json.dumps(self.review, separators=(",", ":")).encode()

    @property
    def uid(self) -> str:
        return str(self.review["request"]["uid"])


def recorded(name: str) -> dict[str, Any]:
    path = FIXTURES / name
    if not path.is_file():
        raise FileNotFoundError(
            f"recorded AdmissionReview {path} is missing: copy it from ../shared/fixtures/apiserver-v1.36 "
            f"into {FIXTURES.parent} (tests/fixtures/README.md)"
        )
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def _with_uid(review: dict[str, Any], uid: str) -> dict[str, Any]:
    review["request"]["uid"] = uid
    return review


def _container(base: Mapping[str, Any], index: int, env: int, gpu: bool) -> dict[str, Any]:
    c = copy.deepcopy(dict(base))
    c["name"] = "main" if index == 0 else f"sidecar-{index}"
    c["env"] = [{"name": f"APP_SETTING_{index}_{i}", "value": f"value-{index}-{i}"} for i in range(env)]
    if not gpu:
        c["resources"] = {"limits": {"cpu": "500m", "memory": "256Mi"},
                          "requests": {"cpu": "100m", "memory": "128Mi"}}
    return c


def scaled_pod(endpoint: str, containers: int, env: int = 50, uid: str | None = None) -> dict[str, Any]:
    """The recorded 1-container GPU pod with `containers` containers of `env` env vars each (GPU in the first)."""
    review = recorded(f"pod-gpu-limit-only-{endpoint}.json")
    obj = review["request"]["object"]
    base = obj["spec"]["containers"][0]
    obj["spec"]["containers"] = [_container(base, i, env, gpu=i == 0) for i in range(containers)]
    obj["metadata"]["name"] = review["request"]["name"] = f"gpu-pod-{containers}c"
    return _with_uid(review, uid or f"bench-{endpoint}-pod-{containers}c")


def gpu_pod_3c(endpoint: str) -> Body:
    """Issue 14's pod: 3 containers x 20 env vars (GPU in the first); /validate allows it, /mutate patches it."""
    assert endpoint in ENDPOINTS, endpoint
    review = scaled_pod(endpoint, 3, env=20, uid=f"bench-{endpoint}-gpu-pod-3c")
    mutating = endpoint == "mutate"
    if mutating:
        review["request"]["object"]["metadata"].setdefault("annotations", {})[MPS_ANNOTATION] = "true"
    return Body("gpu-pod-3c", f"/{endpoint}", review, allowed=True, patched=mutating)


def mix(endpoint: str) -> list[Body]:
    """The rotating mix for one endpoint (`validate` or `mutate`)."""
    assert endpoint in ENDPOINTS, endpoint
    path = f"/{endpoint}"
    gpu = _with_uid(recorded(f"pod-gpu-limit-only-{endpoint}.json"), f"bench-{endpoint}-gpu-pod")
    big = scaled_pod(endpoint, 10, 50, uid=f"bench-{endpoint}-pod-10x50env")
    mps = _with_uid(recorded(f"pod-gpu-limit-only-{endpoint}.json"), f"bench-{endpoint}-mps-pod")
    mps_obj = mps["request"]["object"]
    mps_obj["metadata"].setdefault("annotations", {})[MPS_ANNOTATION] = "true"
    mps_obj["metadata"]["name"] = mps["request"]["name"] = "gpu-mps-pod"
    deployment = _with_uid(recorded(f"deployment-create-{endpoint}.json"), f"bench-{endpoint}-deployment")
    denied = _with_uid(recorded(f"pod-env-nvidia-visible-{endpoint}.json"), f"bench-{endpoint}-denied-pod")
    validating = endpoint == "validate"
    return [
        Body("gpu-pod", path, gpu, allowed=True),
        Body("pod-10x50env", path, big, allowed=True),
        # /mutate patches it (hostIPC, MPS toleration, node selector); /validate allows it.
        Body("mps-pod", path, mps, allowed=True, patched=not validating),
        Body("deployment", path, deployment, allowed=True),
        Body("denied-pod", path, denied, allowed=not validating),
    ]


def write_manifest(bodies: list[Body], directory: Path, name: str) -> Path:
    """Write each body to a file and a manifest of `path<TAB>file` lines for bench/mix.lua."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, body in enumerate(bodies):
        file = directory / f"{name}-{i}-{body.name}.json"
        file.write_bytes(body.data)
        lines.append(f"{body.path}\t{file}")
    manifest = directory / f"{name}.manifest"
    manifest.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return manifest
