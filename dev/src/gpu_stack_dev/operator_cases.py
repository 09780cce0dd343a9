"""The pods docs/gpu-operator.md's verdict table is made of, each with what it gets on a GPU Operator v26.7.0
cluster without gpu-stack ("out of the box", prose with its upstream source) and what gpu-stack answers on the
operator's default ClusterPolicy (tests/fixtures/gpu-operator-v26.7.0/clusterpolicy.yaml) and its RuntimeClasses,
written down by hand with why (`Case.expect`, `Case.why`): never computed from the webhook. `make generate`
writes the table from them (`table()`); tests/e2e/test_gpu_operator_policy.py sends the same pods to the API
server, beside the real operator controller, and expects them; tests/webhook/test_live_source.py compares them
with the webhook's answers offline (`answers()`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import yaml
from gpu_stack_webhook.admission import decide
from gpu_stack_webhook.admission.decide import Endpoint
from gpu_stack_webhook.admission.requests import admission_review
from gpu_stack_webhook.admission.review import parse_review
from gpu_stack_webhook.policy.config import PolicyConfig, RuntimeClasses
from gpu_stack_webhook.policy.engine import Policy
from gpu_stack_webhook.policy.live import operator_policy, read_cluster_policy

from gpu_stack_dev.generate.paths import with_section
from gpu_stack_dev.paths import ROOT

CLUSTER_POLICY = ROOT / "tests" / "fixtures" / "gpu-operator-v26.7.0" / "clusterpolicy.yaml"
SECTION = "operator-verdicts"
# The operator's RuntimeClasses (v26.7.0 assets/pre-requisites/0200, 0210, 0220: handler = name), an admin's
# class for the same runtime under another name, and one for another runtime.
# In NRI mode the operator deletes its own (gpu-operator v26.7.0 controllers/state_manager.go: the pre-requisites
# state is off with cdi.nriPluginEnabled, and RuntimeClasses() clears them).
OPERATOR_RUNTIME_CLASSES = {"nvidia": "nvidia", "nvidia-cdi": "nvidia-cdi", "nvidia-legacy": "nvidia-legacy"}
ADMIN_RUNTIME_CLASSES = {"gpu-fast": "nvidia", "sandboxed": "runsc"}
# What the API server's RuntimeClass admission answers for a pod naming one that does not exist
# (kubernetes v1.36 plugin/pkg/admission/runtimeclass/admission.go), before any webhook is called.
NO_RUNTIME_CLASS = "refused by the API server: no such RuntimeClass"
CUDA = "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04"
VISIBLE = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}
PRIVILEGED = {"securityContext": {"privileged": True}}
GPU = {"limits": {"nvidia.com/gpu": 1}}
MIG = {"limits": {"nvidia.com/mig-1g.5gb": 1}}


@dataclass(frozen=True)
class Case:
    name: str
    what: str  # the pod, in words
    out_of_the_box: str
    containers: tuple[dict[str, Any], ...]
    runtime_class: str = ""
    annotations: tuple[tuple[str, str], ...] = ()
    # What gpu-stack answers, written down by hand (never computed from the webhook): `allowed`,
    # `denied: GPU0xx, ...` (the denying rules, sorted) or NO_RUNTIME_CLASS; with why. `expect_nri`: with
    # `cdi.nriPluginEnabled: true`, when it differs.
    expect: str = ""
    why: str = ""
    expect_nri: str = ""

    def expected(self, nri: bool = False) -> str:
        return (self.expect_nri or self.expect) if nri else self.expect

    def pod(self, name: str = "") -> dict[str, Any]:
        spec: dict[str, Any] = {"containers": [copy.deepcopy(c) for c in self.containers]}
        if self.runtime_class:
            spec["runtimeClassName"] = self.runtime_class
        metadata: dict[str, Any] = {"name": name or self.name}
        if self.annotations:
            metadata["annotations"] = dict(self.annotations)
        return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def _c(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "image": CUDA, **fields}


OPEN_RUNTIME = "open: the NVIDIA runtime gives it every GPU its image's `NVIDIA_VISIBLE_DEVICES=all` names"
# Why the webhook denies, rule by rule (written down here, not taken from the webhook's answers).
NO_GPU_OF_ITS_OWN = "GPU011: a container without a GPU of its own under the NVIDIA runtime, which honours the variable"
ENV = "GPU002: it names NVIDIA_VISIBLE_DEVICES under the NVIDIA runtime"
CASES = (
    Case("runtime-class-cuda-image", "`runtimeClassName: nvidia`, a CUDA image, no GPU request", OPEN_RUNTIME,
         (_c("main"),), "nvidia", expect="denied: GPU011", why=NO_GPU_OF_ITS_OWN, expect_nri=NO_RUNTIME_CLASS),
    Case("cdi-runtime-cuda-image", "`runtimeClassName: nvidia-cdi`, a CUDA image, no GPU request",
         "open: in CDI mode the runtime turns the image's variable into the CDI device `nvidia.com/gpu=all`",
         (_c("main"),), "nvidia-cdi", expect="denied: GPU011", why=NO_GPU_OF_ITS_OWN, expect_nri=NO_RUNTIME_CLASS),
    Case("legacy-runtime-env", "`runtimeClassName: nvidia-legacy`, env `NVIDIA_VISIBLE_DEVICES=all`, no GPU request",
         "open: every GPU (gpu-operator #1588)", (_c("main", env=[VISIBLE]),), "nvidia-legacy",
         expect="denied: GPU002, GPU011", why=f"{ENV}; {NO_GPU_OF_ITS_OWN}", expect_nri=NO_RUNTIME_CLASS),
    Case("admin-runtime-class", "`runtimeClassName: gpu-fast`, an admin's class with handler `nvidia`, a CUDA "
         "image, no GPU request", OPEN_RUNTIME, (_c("main"),), "gpu-fast", expect="denied: GPU011",
         why=f"its handler is the NVIDIA runtime's; {NO_GPU_OF_ITS_OWN}"),
    Case("runtime-class-env", "`runtimeClassName: nvidia`, env `NVIDIA_VISIBLE_DEVICES=all`, no GPU request",
         "open: every GPU", (_c("main", env=[VISIBLE]),), "nvidia", expect="denied: GPU002, GPU011",
         why=f"{ENV}; {NO_GPU_OF_ITS_OWN}", expect_nri=NO_RUNTIME_CLASS),
    Case("cuda-sidecar", "one GPU for `main`, a second container without one, `runtimeClassName: nvidia`",
         "open: the second container gets every GPU", (_c("main", resources=GPU), _c("side")), "nvidia",
         expect="denied: GPU011", why=NO_GPU_OF_ITS_OWN, expect_nri=NO_RUNTIME_CLASS),
    Case("other-runtime-class", "`runtimeClassName: sandboxed` (handler `runsc`), env `NVIDIA_VISIBLE_DEVICES=all`",
         "closed: gVisor reads no NVIDIA variable", (_c("main", env=[VISIBLE]),), "sandboxed",
         expect="allowed", why="its handler is not the NVIDIA runtime"),
    Case("env-without-runtime-class", "env `NVIDIA_VISIBLE_DEVICES=all`, no GPU request, no runtime class",
         "closed: runc ignores the variable (`nvidia` is not the default runtime under CDI)",
         (_c("main", env=[VISIBLE]),), expect="allowed",
         why="runc runs it: `nvidia` is not the default runtime under CDI"),
    Case("cdi-annotation", "annotation `cdi.k8s.io/gpu: nvidia.com/gpu=all`, no GPU request",
         "open where the container engine injects CDI devices named in pod annotations", (_c("main"),),
         annotations=(("cdi.k8s.io/gpu", "nvidia.com/gpu=all"),), expect="denied: GPU007",
         why="GPU007: containerd and CRI-O inject what it names, under any runtime"),
    Case("nri-annotation", "annotation `nvidia.cdi.k8s.io/container.main: nvidia.com/gpu=all`, no GPU request",
         "closed by default; open in NRI mode: the toolkit's NRI plugin injects the devices it names, in any "
         "namespace", (_c("main"),), annotations=(("nvidia.cdi.k8s.io/container.main", "nvidia.com/gpu=all"),),
         expect="denied: GPU007",
         why="GPU007: the NRI plugin injects what it names once it is switched on, whatever the ClusterPolicy "
             "says when the pod is admitted"),
    Case("privileged-sidecar", "one GPU for `main`, a privileged second container",
         "open: a privileged container sees every device node of the host",
         (_c("main", resources=GPU), _c("side", **PRIVILEGED)), expect="denied: GPU003",
         why="GPU003: a privileged container in a GPU pod"),
    Case("privileged-no-gpu", "a privileged container, no GPU request", "open: every device node of the host",
         (_c("main", **PRIVILEGED),), expect="allowed",
         why="not a GPU pod; keep privileged pods out with Pod Security"),
    Case("mig-under-single", "requests `nvidia.com/mig-1g.5gb`",
         "pending forever: under `single` no node advertises it", (_c("main", resources=MIG),),
         expect="denied: GPU005", why="GPU005: a MIG resource under the `single` MIG strategy"),
    Case("one-gpu", "requests one `nvidia.com/gpu`", "runs", (_c("main", resources=GPU),), expect="allowed",
         why="one GPU through the device plugin"),
)


def cluster_policy(nri: bool = False) -> dict[str, Any]:
    obj = dict(yaml.safe_load(CLUSTER_POLICY.read_text(encoding="utf-8")))
    if nri:
        obj["spec"]["cdi"]["nriPluginEnabled"] = True
    return obj


def runtime_classes(nri: bool = False) -> dict[str, str]:
    """The cluster's RuntimeClasses, name -> handler."""
    return dict(ADMIN_RUNTIME_CLASSES) if nri else {**OPERATOR_RUNTIME_CLASSES, **ADMIN_RUNTIME_CLASSES}


def operator_config(nri: bool = False) -> PolicyConfig:
    """The webhook's policy on the default v26.7.0 cluster (NRI mode: `cdi.nriPluginEnabled: true`)."""
    config = operator_policy(PolicyConfig(), read_cluster_policy(cluster_policy(nri)), None)
    return config.model_copy(update={"runtime_classes": RuntimeClasses(handlers=runtime_classes(nri))})


def verdict(config: PolicyConfig, pod: dict[str, Any]) -> str:
    """`allowed`, or `denied: GPU0xx, ...` with the rules that deny, as the table says it; NO_RUNTIME_CLASS for a
    pod the API server refuses before calling the webhook."""
    name = pod["spec"].get("runtimeClassName")
    if name and config.runtime_classes is not None and name not in config.runtime_classes.handlers:
        return NO_RUNTIME_CLASS
    decision = decide.review(Policy(config), parse_review(admission_review(pod)), Endpoint.VALIDATE)
    return "allowed" if decision.allowed else "denied: " + ", ".join(sorted(set(decision.denied_by)))


def expected(nri: bool = False) -> dict[str, str]:
    """The hand-written verdicts (Case.expect): what the e2e tests and the table expect."""
    return {case.name: case.expected(nri) for case in CASES}


def answers(nri: bool = False) -> dict[str, str]:
    """What the webhook answers offline, to be compared with `expected` (tests/webhook/test_live_source.py)."""
    config = operator_config(nri)
    return {case.name: verdict(config, case.pod()) for case in CASES}


def table() -> str:
    rows = ["| Case | The pod | Out of the box | With gpu-stack | With gpu-stack, NRI mode |", "|---|---|---|---|---|"]
    for case in CASES:
        note = f": {case.why}" if case.expect == "allowed" else ""
        rows.append(f"| `{case.name}` | {case.what} | {case.out_of_the_box} | {case.expect}{note} | "
                    f"{case.expected(nri=True)} |")
    return "\n".join(rows) + "\n"


def readme(text: str) -> str:
    """docs/gpu-operator.md `text` with its verdict table computed from CASES."""
    return with_section(text, SECTION, table())
