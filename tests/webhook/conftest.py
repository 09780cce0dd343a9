"""Shared fixtures and builders for the webhook tests.

Everything here is plain data in, plain data out, so other test modules (the HTTP tests too) can
`from conftest import ...` the builders, or use the pytest fixtures at the bottom.

- `recorded(name)`: a file from the recorded apiserver v1.36 traffic (skips when it is absent).
- `container(...)`, `make_pod(...)`, `wrap(pod, kind)`: a Pod, or any workload holding its pod spec.
- `review(...)`: an admission.k8s.io/v1 AdmissionReview request body around an object.
- `config_*()`: the policy configs the rule tables use (default, time-slicing, MPS, MIG, per-node).
- `evaluate(...)`, `findings(...)`, `decide(...)`: run the real engine and look at what a user sees.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from gpu_stack_webhook.admission import decide as admission_decide
from gpu_stack_webhook.admission.decide import Endpoint
from gpu_stack_webhook.admission.review import Decision, parse_review
from gpu_stack_webhook.policy.config import PolicyConfig, parse_config
from gpu_stack_webhook.policy.engine import Evaluation, Policy
from gpu_stack_webhook.policy.findings import Finding

# --------------------------------------------------------------------------------------------------
# Recorded apiserver traffic
# --------------------------------------------------------------------------------------------------

REPO_ROOT = Path(__file__).parents[2]
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "apiserver-v1.36"  # copied from ../shared (tests/fixtures/README.md)
ADMISSION_REQUESTS = FIXTURES / "admission-requests"
RESPONSES = FIXTURES / "responses"


def _missing(path: Path) -> str:
    return (
        f"recorded fixture {path} is absent: copy it from ../shared/fixtures/apiserver-v1.36 into "
        f"{FIXTURES} (tests/fixtures/README.md)"
    )


def recorded(name: str) -> Any:
    """A recorded file by its path under FIXTURES: parsed JSON for *.json, text otherwise.

    Skips the calling test (with the path in the reason) when the recordings are not there."""
    path = FIXTURES / name
    if not path.is_file():
        pytest.skip(_missing(path))
    text = path.read_text(encoding="utf-8")
    return json.loads(text) if path.suffix == ".json" else text


def recorded_names(pattern: str) -> list[str]:
    """Names (relative to FIXTURES) matching a glob, for parametrizing; [] when the recordings are absent."""
    if not FIXTURES.is_dir():
        return []
    return sorted(str(p.relative_to(FIXTURES)) for p in FIXTURES.glob(pattern) if p.is_file())


def recorded_params(pattern: str) -> list[Any]:
    """pytest params over recorded files, one per file (id = file stem); a single skipping param when none."""
    names = recorded_names(pattern)
    if not names:
        return [pytest.param(None, marks=pytest.mark.skip(reason=_missing(FIXTURES / pattern)), id="absent")]
    return [pytest.param(n, id=Path(n).stem) for n in names]


# --------------------------------------------------------------------------------------------------
# Pods and workloads
# --------------------------------------------------------------------------------------------------

GPU = "nvidia.com/gpu"
WORKLOAD_KINDS = ("Deployment", "ReplicaSet", "StatefulSet", "DaemonSet", "Job", "CronJob")
ALL_KINDS = ("Pod", *WORKLOAD_KINDS)
CONTAINER_KINDS = ("containers", "initContainers", "ephemeralContainers")
# What a user calls each container field in messages (ContainerRef.label).
CONTAINER_LABEL = {
    "containers": "container",
    "initContainers": "initContainer",
    "ephemeralContainers": "ephemeralContainer",
}

API = {
    "Pod": ("", "v1"),
    "Deployment": ("apps", "v1"),
    "ReplicaSet": ("apps", "v1"),
    "StatefulSet": ("apps", "v1"),
    "DaemonSet": ("apps", "v1"),
    "Job": ("batch", "v1"),
    "CronJob": ("batch", "v1"),
}
RESOURCE = {
    "Pod": "pods",
    "Deployment": "deployments",
    "ReplicaSet": "replicasets",
    "StatefulSet": "statefulsets",
    "DaemonSet": "daemonsets",
    "Job": "jobs",
    "CronJob": "cronjobs",
}
# Field path (kubectl style) and JSON pointer of the pod spec / pod metadata, per kind.
SPEC_PATH = {
    "Pod": "spec",
    **{k: "spec.template.spec" for k in WORKLOAD_KINDS},
    "CronJob": "spec.jobTemplate.spec.template.spec",
}
META_PATH = {
    "Pod": "metadata",
    **{k: "spec.template.metadata" for k in WORKLOAD_KINDS},
    "CronJob": "spec.jobTemplate.spec.template.metadata",
}


def spec_pointer(kind: str) -> str:
    return "/" + SPEC_PATH[kind].replace(".", "/")


def container(
    name: str = "main",
    *,
    gpu: Any = None,
    requests: Mapping[str, Any] | None = None,
    limits: Mapping[str, Any] | None = None,
    env: Sequence[Mapping[str, Any]] | None = None,
    env_from: Sequence[Mapping[str, Any]] | None = None,
    privileged: bool | None = None,
    mounts: Sequence[str | Mapping[str, Any]] | None = None,
    image: str = "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
    **extra: Any,
) -> dict[str, Any]:
    """One container. `gpu=1` sets requests and limits of nvidia.com/gpu to the same value."""
    c: dict[str, Any] = {"name": name, "image": image, **extra}
    req, lim = dict(requests or {}), dict(limits or {})
    if gpu is not None:
        req.setdefault(GPU, gpu)
        lim.setdefault(GPU, gpu)
    if req or lim:
        c["resources"] = {}
        if req:
            c["resources"]["requests"] = req
        if lim:
            c["resources"]["limits"] = lim
    if env is not None:
        c["env"] = [dict(e) for e in env]
    if env_from is not None:
        c["envFrom"] = [dict(e) for e in env_from]
    if privileged is not None:
        c["securityContext"] = {"privileged": privileged}
    if mounts is not None:
        c["volumeMounts"] = [
            {"name": "devnull", "mountPath": m} if isinstance(m, str) else dict(m) for m in mounts
        ]
    return c


def make_pod(
    containers: Iterable[Mapping[str, Any]] = (),
    *,
    init: Iterable[Mapping[str, Any]] = (),
    ephemeral: Iterable[Mapping[str, Any]] = (),
    name: str = "gpu-pod",
    namespace: str = "gpu-demo",
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    **spec_fields: Any,
) -> dict[str, Any]:
    """A Pod. With no containers given it has one plain non-GPU container "main".

    Extra keyword arguments become pod spec fields (nodeSelector=..., tolerations=..., hostIPC=...)."""
    conts = [dict(c) for c in containers] or [container("main")]
    spec: dict[str, Any] = {"containers": conts}
    if init := [dict(c) for c in init]:
        spec["initContainers"] = init
    if ephemeral := [dict(c) for c in ephemeral]:
        spec["ephemeralContainers"] = ephemeral
    spec.update(spec_fields)
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        metadata["labels"] = dict(labels)
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def pod_with(field: str, c: Mapping[str, Any], **pod_kw: Any) -> dict[str, Any]:
    """A Pod whose `field` (containers | initContainers | ephemeralContainers) holds `c` at index 0.

    For init and ephemeral containers the pod also gets a plain main container "app"; pass
    `main=container(...)` to choose it (e.g. to make the pod a GPU pod)."""
    main = pod_kw.pop("main", None) or container("app")
    if field == "containers":
        return make_pod([c], **pod_kw)
    if field == "initContainers":
        return make_pod([main], init=[c], **pod_kw)
    if field == "ephemeralContainers":
        return make_pod([main], ephemeral=[c], **pod_kw)
    raise ValueError(f"unknown container field {field}")  # pragma: no cover


def wrap(pod: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """The Pod itself for kind "Pod", else a workload of `kind` whose pod template is this pod.

    The pod's labels and annotations move to the template metadata (where they reach the pods);
    the workload object gets the pod's name and namespace."""
    pod = copy.deepcopy(dict(pod))
    if kind == "Pod":
        return pod
    meta = pod.get("metadata", {})
    name, namespace = meta.get("name", "gpu-workload"), meta.get("namespace", "gpu-demo")
    template_meta = {k: v for k, v in meta.items() if k in ("labels", "annotations")}
    template_meta.setdefault("labels", {"app": name})
    template = {"metadata": template_meta, "spec": pod["spec"]}
    group, version = API[kind]
    obj: dict[str, Any] = {
        "apiVersion": f"{group}/{version}",
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace},
    }
    selector = {"matchLabels": dict(template_meta["labels"])}
    if kind in ("Deployment", "ReplicaSet", "DaemonSet"):
        obj["spec"] = {"selector": selector, "template": template}
    elif kind == "StatefulSet":
        obj["spec"] = {"selector": selector, "serviceName": name, "template": template}
    elif kind == "Job":
        template["spec"].setdefault("restartPolicy", "Never")
        obj["spec"] = {"template": template}
    elif kind == "CronJob":
        template["spec"].setdefault("restartPolicy", "Never")
        obj["spec"] = {"schedule": "0 3 * * *", "jobTemplate": {"spec": {"template": template}}}
    else:  # pragma: no cover - a typo in a test table
        raise ValueError(f"unknown kind {kind}")
    return obj


def pod_spec_of(obj: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """The (mutable) pod spec inside an object built by `wrap`."""
    node: Any = obj
    for key in SPEC_PATH[kind].split("."):
        node = node[key]
    return node  # type: ignore[no-any-return]


def review(
    obj: Mapping[str, Any] | None,
    *,
    kind: str | None = None,
    operation: str = "CREATE",
    old: Mapping[str, Any] | None = None,
    namespace: str | None = None,
    sub_resource: str | None = None,
    uid: str | None = None,
    dry_run: bool = False,
    group: str | None = None,
) -> dict[str, Any]:
    """An admission.k8s.io/v1 AdmissionReview request body, shaped like the recorded ones."""
    source = obj if obj is not None else old
    kind = kind or (source or {}).get("kind", "Pod")
    grp, version = API.get(kind, (group or "", "v1"))
    if group is not None:
        grp = group
    meta = (source or {}).get("metadata", {})
    resource = RESOURCE.get(kind, kind.lower() + "s")
    request: dict[str, Any] = {
        "uid": uid or str(uuid.uuid4()),
        "kind": {"group": grp, "version": version, "kind": kind},
        "resource": {"group": grp, "version": version, "resource": resource},
        "name": meta.get("name", ""),
        "namespace": namespace if namespace is not None else meta.get("namespace", "gpu-demo"),
        "operation": operation,
        "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters", "system:authenticated"]},
        "object": copy.deepcopy(obj) if obj is not None else None,
        "oldObject": copy.deepcopy(old) if old is not None else None,
        "dryRun": dry_run,
    }
    if sub_resource:
        request["subResource"] = sub_resource
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def apply_patch(obj: Mapping[str, Any], ops: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Apply JSONPatch ops (RFC 6902) the way the apiserver does; the input is not modified."""
    return jsonpatch.JsonPatch([dict(op) for op in ops]).apply(copy.deepcopy(dict(obj)))  # type: ignore[no-any-return]


# --------------------------------------------------------------------------------------------------
# Policy configs
# --------------------------------------------------------------------------------------------------

CONFIG_LABEL = "nvidia.com/device-plugin.config"
CUSTOM_CONFIG_LABEL = "example.com/gpu-sharing"


def _device_plugin(mig: str = "none", *, time_slicing: Any = None, mps: Any = None) -> dict[str, Any]:
    cfg: dict[str, Any] = {"version": "v1", "flags": {"migStrategy": mig}}
    sharing = {}
    if time_slicing is not None:
        sharing["timeSlicing"] = time_slicing
    if mps is not None:
        sharing["mps"] = mps
    if sharing:
        cfg["sharing"] = sharing
    return cfg


def time_slicing(
    replicas: int = 4,
    *,
    fail: bool = True,
    rename_by_default: bool = False,
    resource: str = GPU,
    rename: str | None = None,
) -> dict[str, Any]:
    res: dict[str, Any] = {"name": resource, "replicas": replicas}
    if rename:
        res["rename"] = rename
    return {"renameByDefault": rename_by_default, "failRequestsGreaterThanOne": fail, "resources": [res]}


def mps_sharing(replicas: int = 10, *, rename_by_default: bool = False) -> dict[str, Any]:
    return {"renameByDefault": rename_by_default, "resources": [{"name": GPU, "replicas": replicas}]}


def make_config(data: Mapping[str, Any] | None = None, **overrides: Any) -> PolicyConfig:
    """parse_config over a dict; keyword overrides are top-level keys (Python names, e.g. exemptNamespaces=...)."""
    merged = {**(dict(data) if data else {}), **overrides}
    return parse_config(merged, "<test>")


def single_config(device_plugin: Mapping[str, Any], **overrides: Any) -> PolicyConfig:
    """Every node runs the same device plugin config."""
    return make_config({"sharing": {"configs": {"default": dict(device_plugin)}}}, **overrides)


def config_default(**overrides: Any) -> PolicyConfig:
    return make_config(**overrides)


def config_time_slicing(replicas: int = 4, *, fail: bool = True, **kw: Any) -> PolicyConfig:
    """Time-slicing x4 on every node; with failRequestsGreaterThanOne unless fail=False."""
    return single_config(_device_plugin(time_slicing=time_slicing(replicas, fail=fail, **kw)))


def config_mps(replicas: int = 10, **overrides: Any) -> PolicyConfig:
    """MPS x10 on every node."""
    return single_config(_device_plugin(mps=mps_sharing(replicas)), **overrides)


def config_mig(strategy: str, **overrides: Any) -> PolicyConfig:
    """migStrategy none | single | mixed on every node."""
    return single_config(_device_plugin(strategy), **overrides)


def config_per_node(label: str = CONFIG_LABEL, **overrides: Any) -> PolicyConfig:
    """Named configs chosen per node by `label`: an exclusive default plus one of each kind of sharing."""
    return make_config(
        {
            "sharing": {
                "nodeConfigLabel": label,
                "defaultConfig": "default",
                "configs": {
                    "default": _device_plugin(),
                    "ts-x4": _device_plugin(time_slicing=time_slicing(4, fail=True)),
                    "ts-x4-lenient": _device_plugin(time_slicing=time_slicing(4, fail=False)),
                    "mps-x10": _device_plugin(mps=mps_sharing(10)),
                    "mig-mixed": _device_plugin("mixed"),
                    "mig-single": _device_plugin("single"),
                },
            }
        },
        **overrides,
    )


# --------------------------------------------------------------------------------------------------
# Running the engine
# --------------------------------------------------------------------------------------------------


def evaluate(
    obj: Mapping[str, Any], kind: str = "Pod", config: PolicyConfig | None = None, *, can_patch: bool = False
) -> Evaluation:
    return Policy(config or PolicyConfig()).evaluate(obj, kind, can_patch=can_patch)


def findings(
    obj: Mapping[str, Any],
    rule_id: str | None = None,
    kind: str = "Pod",
    config: PolicyConfig | None = None,
    *,
    can_patch: bool = False,
) -> list[Finding]:
    """The findings of one rule (or all) for `obj`, as /validate (can_patch False) or /mutate of a Pod CREATE."""
    return [f for f in evaluate(obj, kind, config, can_patch=can_patch).findings if rule_id in (None, f.rule_id)]


def decide(
    obj: Mapping[str, Any] | None,
    endpoint: Endpoint | str = Endpoint.VALIDATE,
    config: PolicyConfig | None = None,
    **review_kw: Any,
) -> Decision:
    """The Decision /mutate or /validate returns for an AdmissionReview built by `review`."""
    endpoint = Endpoint(endpoint) if isinstance(endpoint, str) else endpoint
    request = parse_review(review(obj, **review_kw))
    return admission_decide.review(Policy(config or PolicyConfig()), request, endpoint)


# --------------------------------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def fixtures_dir() -> Path:
    """The recorded apiserver traffic; skips when absent."""
    if not FIXTURES.is_dir():
        pytest.skip(_missing(FIXTURES))
    return FIXTURES


@pytest.fixture
def default_config() -> PolicyConfig:
    return config_default()


@pytest.fixture
def ts_config() -> PolicyConfig:
    return config_time_slicing()


@pytest.fixture
def mps_config() -> PolicyConfig:
    return config_mps()


@pytest.fixture
def mig_single_config() -> PolicyConfig:
    return config_mig("single")


@pytest.fixture
def mig_mixed_config() -> PolicyConfig:
    return config_mig("mixed")


@pytest.fixture
def per_node_config() -> PolicyConfig:
    return config_per_node()


@pytest.fixture
def policy() -> Policy:
    return Policy(PolicyConfig())


@pytest.fixture
def pod_builder() -> Any:
    return make_pod


@pytest.fixture
def workload_builder() -> Any:
    return wrap


@pytest.fixture
def review_builder() -> Any:
    return review


def only(found: Sequence[Finding]) -> Finding:
    """The single finding of a list, with every finding's text in the failure message."""
    assert len(found) == 1, f"expected exactly one finding, got {[f.text for f in found]}"
    return found[0]


def summary(found: Iterable[Finding]) -> list[tuple[str, str, str]]:
    """(rule ID, severity, field path) per finding: what a table test compares."""
    return [(f.rule_id, f.severity.value, f.path) for f in found]
