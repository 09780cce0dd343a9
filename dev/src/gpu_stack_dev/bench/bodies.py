"""The request bodies `make bench` replays: AdmissionReviews built from the recorded apiserver traffic.

The headline and the targets run on `pod_mix(endpoint)`: MIX_BODIES pod CREATE reviews from
len(SHAPES) >= 50 distinct pod shapes, in the shares of KIND_SHARE (see there for why), each body with its
own uid and pod name, in a fixed shuffled order. Every body starts from the review a real
kube-apiserver v1.36 sent for a pod its ReplicaSet controller created (`pod-by-replicaset-*`): /mutate
gets the pod with `generateName` and no name (the name is generated after the mutating webhooks, as
there), /validate the generated name and the object's uid. The request uid (and on /validate the pod
name and uid) end in SERIAL_MARK: bench/mix.lua writes a serial number there on every send, so no two
requests of a run carry the same uid or name, as from an API server.

The 3-container GPU pod and the recorded cases. Every body starts from a request a real kube-apiserver v1.36 sent
(tests/fixtures/apiserver-v1.36, copied from ../shared/fixtures) and is scaled up from it, so headers,
managedFields, the ServiceAccount volume and the defaulted fields are what the webhook really sees:

* `gpu-pod`: the recorded 1-container GPU pod (`pod-gpu-limit-only-*`), unchanged.
* `pod-10x50env`: the same pod with 10 containers of 50 env vars each (GPU in the first).
* `mps-pod`: the recorded pod with the `gpu-stack.io/mps: "true"` annotation: /mutate patches it.
* `deployment`: the recorded Deployment CREATE (`deployment-create-*`): the pod template is judged.
* `denied-pod`: the recorded pod with NVIDIA_VISIBLE_DEVICES (`pod-env-nvidia-visible-*`): /validate denies.

`scaled_pod(n)` gives the 1/10/50/200-container pods of the size sweep. `gpu_pod_3c(endpoint)` is the
identical body the targets' rounds show beside the mix: the recorded GPU pod with 3 containers of 20 env
vars each; on /mutate it carries the MPS annotation, so the answer has a patch. Bodies are compact JSON, as
the apiserver sends them (the recordings are pretty-printed only for storage).
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_stack_dev.paths import ROOT as REPO_ROOT

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "apiserver-v1.36" / "admission-requests"
ENDPOINTS = ("validate", "mutate")
MPS_ANNOTATION = "gpu-stack.io/mps"
GPU = "nvidia.com/gpu"
# The policy the mix is judged with: the chart rendered with this values file (exclusive, time-sliced,
# MPS and MIG nodes side by side), the one example layout where every kind of pod in the mix is admissible.
MIX_VALUES = REPO_ROOT / "Chart-values-examples" / "per-node-configs.yaml"
CONFIG_LABEL = "nvidia.com/device-plugin.config"
SERIAL_MARK = "serialnumber"  # 12 characters, replaced by a 12-digit serial per send (bench/mix.lua)
MIX_BODIES = 3000
# The share of each kind of pod in the mix. Most pods of a cluster have no GPU (the API server bench's
# mixed creates are 90% without); this mix is GPU-heavier on purpose: a GPU pod costs the webhook more than a plain
# one (more rules find something, /mutate patches it), so more of them make the ratio targets harder,
# and once the webhook configurations carry matchConditions the webhook is sent mostly the GPU pods.
KIND_SHARE = {"none": 0.70, "gpu": 0.20, "mps": 0.05, "mig": 0.05}
# How many distinct shapes of each kind (60 in all), and which shapes are denied on /validate: one GPU pod
# setting NVIDIA_VISIBLE_DEVICES (GPU002; in the bench's runtime-class layout only GPU pods run under the
# NVIDIA runtime, so only they are judged for it), one GPU pod with a privileged sidecar (GPU003).
KIND_SHAPES = {"none": 38, "gpu": 12, "mps": 5, "mig": 5}
DENIED_SHAPES = {"gpu-07": "GPU002", "gpu-05": "GPU003"}


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
    """The identical body: 3 containers x 20 env vars (GPU in the first); /validate allows it, /mutate patches it."""
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


# --- the pod mix -----------------------------------------------------------------------------------

_IMAGES = ("registry.example.com/shop/api:2.14.1", "nginx:1.27-alpine", "redis:7.4", "python:3.12-slim",
           "ghcr.io/example/worker:0.9.3", "postgres:16.4", "quay.io/prometheus/node-exporter:v1.8.2",
           "docker.io/bitnami/kafka:3.8")
_GPU_IMAGES = ("nvcr.io/nvidia/pytorch:24.08-py3", "nvcr.io/nvidia/tritonserver:24.08-py3",
               "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04", "vllm/vllm-openai:v0.6.1")
_SIDECARS = ("istio-proxy", "log-shipper", "metrics-agent")
_MIG = ("nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb", "nvidia.com/mig-3g.40gb")


@dataclass(frozen=True)
class Shape:
    """One kind of pod a workload creates over and over: what `_fill_pod` makes of the recorded pod."""

    name: str  # "gpu-03"
    kind: str  # a key of KIND_SHARE
    index: int
    denied_by: str = ""  # the rule /validate denies it with ("" = allowed)
    params: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def gpu(self) -> bool:
        return self.kind != "none"


def _shape(kind: str, index: int) -> Shape:
    name = f"{kind}-{index:02d}"
    rng = random.Random(name)
    params = {
        "containers": 1 + index % 3 if kind == "none" else 1 + index % 2,
        "init": index % 4 == 1,
        "env": (0, 4, 9, 16, 30)[index % 5],
        "volumes": index % 3,
        "probes": index % 2 == 0,
        "labels": 2 + index % 4,
        "annotations": index % 3,
        "gpus": (1, 1, 2, 1, 4)[index % 5] if kind == "gpu" else 1,
        "selector": index % 2 == 0 if kind in ("gpu", "mig") else kind == "mps" and index % 3 != 2,
        "toleration": index % 2 == 1,
        "image": rng.choice(_GPU_IMAGES if kind != "none" else _IMAGES),
        "hash": f"{rng.getrandbits(40):010x}"[:10],
    }
    return Shape(name, kind, index, DENIED_SHAPES.get(name, ""), params)


SHAPES: tuple[Shape, ...] = tuple(_shape(kind, i) for kind, n in KIND_SHAPES.items() for i in range(n))


def _resources(shape: Shape, main: bool) -> dict[str, Any]:
    cpu = {"requests": {"cpu": f"{100 * (1 + shape.index % 4)}m", "memory": f"{128 << shape.index % 3}Mi"},
           "limits": {"cpu": f"{200 * (1 + shape.index % 4)}m", "memory": f"{256 << shape.index % 3}Mi"}}
    if not main or shape.kind == "none":
        return cpu
    resource = _MIG[shape.index % len(_MIG)] if shape.kind == "mig" else GPU
    amount = str(shape.params["gpus"])
    return {"requests": {**cpu["requests"], resource: amount}, "limits": {**cpu["limits"], resource: amount}}


def _env(shape: Shape, container: int) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [{"name": f"{shape.kind.upper()}_SETTING_{container}_{i}", "value": f"v{i}"}
                                 for i in range(shape.params["env"])]
    if shape.params["env"] > 4:
        env.append({"name": "POD_IP", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}})
    if shape.denied_by == "GPU002" and container == 0:
        env.append({"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"})
    return env


def _mix_container(shape: Shape, position: int, token_volume: str) -> dict[str, Any]:
    main = position == 0
    p = shape.params
    c: dict[str, Any] = {
        "name": "main" if main else _SIDECARS[(position - 1) % len(_SIDECARS)],
        "image": p["image"] if main else f"registry.example.com/platform/{_SIDECARS[(position - 1) % 3]}:1.{position}",
        "resources": _resources(shape, main),
        "volumeMounts": [{"name": token_volume, "readOnly": True,
                          "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
        "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
    }
    if main:
        c["ports"] = [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
        c["volumeMounts"] += [{"name": f"data-{v}", "mountPath": f"/data/{v}"} for v in range(p["volumes"])]
    env = _env(shape, position)
    if env:
        c["env"] = env
    if p["probes"] and main:
        probe = {"httpGet": {"path": "/healthz", "port": 8080, "scheme": "HTTP"}, "timeoutSeconds": 1,
                 "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3}
        c["livenessProbe"], c["readinessProbe"] = probe, {**probe, "periodSeconds": 5}
    if shape.denied_by == "GPU003" and position == 1:
        c["securityContext"] = {"privileged": True}
    elif not main:
        c["securityContext"] = {"runAsNonRoot": True, "allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]}}
    return c


def _fill_pod(obj: dict[str, Any], shape: Shape) -> None:
    """Turn the recorded ReplicaSet pod into one of `shape` (the envelope stays the recorded one)."""
    p = shape.params
    meta, spec = obj["metadata"], obj["spec"]
    workload = f"{shape.name}-app"
    rs = f"{workload}-{p['hash']}"
    meta["generateName"] = f"{rs}-"
    meta["labels"] = {"app": workload, "pod-template-hash": p["hash"],
                      **{f"example.com/label-{i}": f"{shape.kind}-{i}" for i in range(p["labels"] - 2)}}
    annotations = {f"example.com/annotation-{i}": f"value {i} of {shape.name}" for i in range(p["annotations"])}
    if shape.kind == "mps" and not p["selector"]:
        annotations[MPS_ANNOTATION] = "true"
    if annotations:
        meta["annotations"] = annotations
    owner = meta["ownerReferences"][0]
    owner["name"] = rs
    owner["uid"] = f"{random.Random(rs).getrandbits(128):032x}"
    token = spec["volumes"][0]["name"]
    spec["volumes"] = [spec["volumes"][0], *({"name": f"data-{v}", "emptyDir": {}} for v in range(p["volumes"]))]
    spec["containers"] = [_mix_container(shape, i, token) for i in range(p["containers"])]
    if p["init"]:
        init = _mix_container(shape, 1, token)
        init.update(name="init-config", command=["sh", "-c", "cp /config/* /data/"],
                    securityContext={"runAsNonRoot": True, "allowPrivilegeEscalation": False})
        init.pop("livenessProbe", None)
        spec["initContainers"] = [init]
    selector = {"mps": {CONFIG_LABEL: "mps-x10"}, "mig": {CONFIG_LABEL: "mig-mixed"},
                "gpu": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}}.get(shape.kind)
    if p["selector"] and selector:
        spec["nodeSelector"] = selector
    if p["toleration"] and shape.gpu:
        spec["tolerations"] = [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}, *spec["tolerations"]]


def _uid(rng: random.Random) -> str:
    """A UUID whose last group is SERIAL_MARK (mix.lua writes the per-send serial there)."""
    return f"{rng.getrandbits(32):08x}-{rng.getrandbits(16):04x}-4{rng.getrandbits(12):03x}-" \
           f"{0x8000 | rng.getrandbits(14):04x}-{SERIAL_MARK}"


def mix_shapes(total: int = MIX_BODIES) -> list[Shape]:
    """The shape of each body of the mix, in the order sent: every shape of a kind gets an equal part of
    the kind's share of `total`, then the list is shuffled (fixed seed)."""
    out: list[Shape] = []
    for kind, share in KIND_SHARE.items():
        shapes = [s for s in SHAPES if s.kind == kind]
        count = round(total * share)
        out += [shapes[i % len(shapes)] for i in range(count)]
    random.Random(26).shuffle(out)
    return out


def pod_mix(endpoint: str, total: int = MIX_BODIES) -> list[Body]:
    """The mixed pod CREATEs for one endpoint; the same shapes in the same order for both endpoints."""
    assert endpoint in ENDPOINTS, endpoint
    base = recorded(f"pod-by-replicaset-{endpoint}.json")
    validating = endpoint == "validate"
    out = []
    for n, shape in enumerate(mix_shapes(total)):
        rng = random.Random(f"{endpoint}-{n}")
        review = copy.deepcopy(base)
        request, obj = review["request"], review["request"]["object"]
        _fill_pod(obj, shape)
        request["uid"] = _uid(rng)
        if validating:  # the API server has named the pod by now (generateName + 5 characters there)
            obj["metadata"]["name"] = request["name"] = f"{obj['metadata']['generateName']}{n:05d}{SERIAL_MARK}"
            obj["metadata"]["uid"] = _uid(rng)
        out.append(Body(shape.name, f"/{endpoint}", review, allowed=not (validating and shape.denied_by),
                        patched=not validating and shape.gpu))
    return out


def stamp(data: bytes, serial: int) -> bytes:
    """What bench/mix.lua sends for `data` as its `serial`-th request: SERIAL_MARK -> 12 digits."""
    return data.replace(SERIAL_MARK.encode(), f"{serial:012d}".encode())


def describe(validate: list[Body], mutate: list[Body]) -> dict[str, Any]:
    """What the report says about the mix, counted from the bodies themselves."""
    kinds = {s.name: s.kind for s in SHAPES}
    by_kind = {}
    for kind in KIND_SHARE:
        of_kind = [b for b in validate if kinds[b.name] == kind]
        by_kind[kind] = {"shapes": len({b.name for b in of_kind}), "bodies": len(of_kind),
                         "share": len(of_kind) / len(validate) if validate else 0.0}
    return {"bodies": len(validate), "shapes": len({b.name for b in validate}), "by_kind": by_kind,
            "denied": sum(not b.allowed for b in validate), "patched": sum(b.patched for b in mutate),
            "bytes": sum(len(b.data) for b in validate) / max(1, len(validate)),
            "denied_by": dict(DENIED_SHAPES)}
