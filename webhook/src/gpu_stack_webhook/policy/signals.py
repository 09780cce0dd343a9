"""The signals: what in a request lets a rule act on it, each with its Python predicate and its CEL
expression side by side. A rule module names the signals it acts on (SCOPE); policy/scope.py assembles the
Python predicates, cel/match_conditions.py the CEL ones into the webhook configurations' matchConditions.

Where a CEL test is looser than the Python one (the MPS annotation's key without its value, a selector's key
without its value) it errs towards calling the webhook. tests/property/test_match_conditions.py checks, on
generated pods and every overlay's policy, that the CEL holds wherever the Python predicate does.

The CEL reads the config (CONFIG, as cel/library.config_values computes it) through `${name}` placeholders
the chart replaces with JSON literals, and the pod through the bindings of BINDINGS (`spec`, `annotations`,
`gpuResources`).
"""

from __future__ import annotations

import enum
import posixpath
from collections.abc import Callable, Mapping
from typing import Any, Final

from gpu_stack_webhook.policy.context import Context
from gpu_stack_webhook.policy.dra import EXTENDED_RESOURCE_PREFIX, dra_gpus, names_dra
from gpu_stack_webhook.policy.gpus import gpu_amounts, is_gpu_pod
from gpu_stack_webhook.policy.pod import CONTAINER_FIELDS, PodView

# What the NVIDIA runtime reads from a pod spec besides its GPUs (GPU002, GPU007), and what containerd and
# CRI-O read under any runtime (GPU007).
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
DEVICE_LIST_DIR = "/var/run/nvidia-container-devices"
DEVICE_LIST_NAME = posixpath.basename(DEVICE_LIST_DIR)
CDI_ANNOTATION_PREFIX: Final = "cdi.k8s.io/"  # Final: compiled, a constant, not a global read (engine.py)
# The toolkit's NRI plugin injects the CDI devices named by a pod annotation `nvidia.cdi.k8s.io/container.<name>`,
# `nvidia.cdi.k8s.io/pod` or `nvidia.cdi.k8s.io`, under any runtime (nvidia-container-toolkit v1.20.0
# cmd/nvidia-ctk-installer/container/runtime/nri/plugin.go, nriCDIAnnotationDomain, and containerd/nri
# pkg/plugin/annotations.go GetEffectiveAnnotation, vendored there).
NRI_ANNOTATION_DOMAIN: Final = "nvidia.cdi.k8s.io"


def is_device_annotation(key: object) -> bool:
    """An annotation the container engine (cdi.k8s.io/) or the toolkit's NRI plugin reads as a device request."""
    return isinstance(key, str) and (key.startswith(CDI_ANNOTATION_PREFIX) or key == NRI_ANNOTATION_DOMAIN
                                     or key.startswith(NRI_ANNOTATION_DOMAIN + "/"))


class Signal(enum.Enum):
    """What in a request lets a rule act on it. Each rule module declares the signals it needs (SCOPE);
    a request with none of its rules' signals gets no finding and no change from any rule
    (tests/property/test_match_conditions.py), so the API server need not call the webhook for it: the
    webhook configurations' matchConditions are assembled from the rules' SCOPE and the CEL below
    (cel/match_conditions.py)."""

    # A container names a GPU resource in requests or limits (any count), or the pod's runtimeClassName is a
    # GPU runtime class (is_gpu_pod; its CEL calls the webhook for every runtimeClassName but those declared
    # non-GPU (nonGpuRuntimeClassNames), since which runtime a RuntimeClass selects is its handler, read from
    # the cluster: policy/runtime_classes.py); or the pod may
    # hold GPUs by Dynamic Resource Allocation: it names claims (spec.resourceClaims) or a container names a
    # deviceclass.resource.kubernetes.io/ resource (names_dra: whether a claim holds a GPU needs a lookup, so
    # any claim is in scope).
    GPU_POD = "gpu-pod"
    # The part of GPU_POD read from the pod alone: a container names a GPU resource, or the pod may hold GPUs by
    # DRA. What a GPU runtime class without these brings is judged at /validate only: no mutating rule changes
    # anything for it, so /mutate is not called for a sandboxed pod (gVisor, Kata) without GPUs.
    GPU_RESOURCES = "gpu-resources"
    # The pod runs under the NVIDIA runtime (a GPU pod, or any pod where that runtime is the node's
    # default: config nvidiaRuntimeIsDefault) and names something that runtime reads from a pod spec:
    # NVIDIA_VISIBLE_DEVICES in env, an envFrom source, a mount under its device list directory. A GPU
    # pod always carries it.
    NVIDIA_RUNTIME = "nvidia-runtime"
    # The MPS opt-in annotation, or a nodeSelector / required node affinity on an MPS label or on the
    # device plugin config label (mps_selection).
    MPS_SELECTION = "mps-selection"
    # An annotation under cdi.k8s.io/, which containerd and CRI-O read under any runtime, or one the toolkit's
    # NRI plugin reads (nvidia.cdi.k8s.io).
    CDI_ANNOTATION = "cdi-annotation"
    # A resource.k8s.io ResourceClaim or ResourceClaimTemplate (GPU009): never a pod.
    DRA_OBJECT = "dra-object"


# --- What every CEL expression reads --------------------------------------------------------------------------

# The config the expressions read (cel/library.config_values keys).
CONFIG = ("gpuResourcePattern", "gpuRuntimeClassNames", "nonGpuRuntimeClassNames", "configLabel",
          "mpsAnnotation", "mpsNodeSelector", "nvidiaRuntimeIsDefault", "disabledRules")

# The pod spec and pod metadata of a Pod or a workload's template (cel_twin.POD_VARIABLES, with every
# step optional: a matchCondition that fails to evaluate is a refusal under failurePolicy Fail).
_SPEC = ("(object.kind == 'Pod' ? object.?spec : object.kind == 'CronJob' ? "
         "object.?spec.?jobTemplate.?spec.?template.?spec : object.?spec.?template.?spec).orValue({})")
_ANNOTATIONS = ("(object.kind == 'Pod' ? object.?metadata : object.kind == 'CronJob' ? "
                "object.?spec.?jobTemplate.?spec.?template.?metadata : object.?spec.?template.?metadata)"
                ".?annotations.orValue({})")

# The API server meters matchConditions (k8s.io/apiserver pkg/apis/cel/config.go, v1.36: PerCallLimit
# 1,000,000 per expression, RuntimeCELCostBudgetMatchConditions 2,500,000 per webhook) and refuses a
# request whose conditions run over under failurePolicy Fail. Iterating a 1.5 MiB pod's tens of thousands
# of resource keys or annotations runs over, so every list or map is sized first (size() is one step) and
# one larger than these bounds sends the request to the webhook without being read: the conditions' cost
# is bounded by the constants, whatever the pod (tests/e2e/test_match_conditions.py, on the API server).
MAX_CONTAINERS = 64  # containers + initContainers + ephemeralContainers
MAX_RESOURCES = 32  # requests + limits entries of one container
MAX_ANNOTATIONS = 128
MAX_SELECTOR = 64  # nodeSelector entries
MAX_TERMS = 8  # required node affinity terms
MAX_EXPRESSIONS = 16  # matchExpressions of one term
MAX_ENV = 64  # env entries of one container
MAX_MOUNTS = 32  # volumeMounts of one container


# --- Signal.GPU_POD -------------------------------------------------------------------------------------------

def gpu_pod(pod: PodView, ctx: Context) -> bool:
    """Signal.GPU_POD."""
    return is_gpu_pod(pod, ctx) or names_dra(pod)


def gpu_resources(pod: PodView, ctx: Context) -> bool:
    """Signal.GPU_RESOURCES."""
    return bool(gpu_amounts(pod, ctx)) or names_dra(pod)


# One regular expression for the config's GPU names and prefixes (cel/library.gpu_resource_pattern), not a
# comprehension over the prefixes per resource key; with the one container list below, the API server spends
# ~13 µs less per evaluation on a 2-container pod without GPU (bench/match_conditions_cost.py, v1.36).
_IS_GPU = f"(r.matches(${{gpuResourcePattern}}) || r.startsWith('{EXTENDED_RESOURCE_PREFIX}'))"
_CONTAINER_LISTS = [f"spec.?{field}.orValue([])" for field, _ in CONTAINER_FIELDS]
# Every container of the pod, as one list: one comprehension instead of one per kind of container.
_CONTAINERS = f"({' + '.join(_CONTAINER_LISTS)})"
# The maps are read twice rather than bound: in cel-go a binding is a one-element comprehension (lower_binds),
# which costs the API server more than a second optional select.
_REQUESTS, _LIMITS = "c.?resources.?requests.orValue({})", "c.?resources.?limits.orValue({})"
_NAMES_GPU = (
    f"size({_REQUESTS}) + size({_LIMITS}) > {MAX_RESOURCES} || "
    f"{_REQUESTS}.exists(r, {_IS_GPU}) || {_LIMITS}.exists(r, {_IS_GPU})"
)
# A pod with DRA claims may hold GPUs (whether a claim does needs a lookup: policy/dra.py names_dra).
_GPU_RESOURCES = (
    "size(spec.?resourceClaims.orValue([])) > 0 || "
    f"{' + '.join(f'size({lst})' for lst in _CONTAINER_LISTS)} > {MAX_CONTAINERS} || "
    f"{_CONTAINERS}.exists(c, {_NAMES_GPU})"
)
# The names an expression may read, bound in this order around it (each only where it is read:
# cel/match_conditions.py).
BINDINGS = (("spec", _SPEC), ("annotations", _ANNOTATIONS), ("gpuResources", _GPU_RESOURCES))
GPU_RESOURCES_CEL = "gpuResources"
# A runtime class the admin declares non-GPU is not read from the cluster (policy/runtime_classes.py), so it
# sends nothing. Written out where it is read, not bound: the API server evaluates a binding (a comprehension)
# whether or not it is read, and /mutate does not read this.
GPU_POD_CEL = ("(spec.?runtimeClassName.orValue('') != '' && "
               "!(spec.runtimeClassName in ${nonGpuRuntimeClassNames}) || gpuResources)")


# --- Signal.NVIDIA_RUNTIME ------------------------------------------------------------------------------------

def reaches_nvidia_runtime(pod: PodView, ctx: Context) -> bool:
    """Does the pod run under the NVIDIA runtime (Signal.NVIDIA_RUNTIME)? Only there do
    NVIDIA_VISIBLE_DEVICES and the device list mounts select GPUs. A pod whose GPUs come by DRA counts."""
    return ctx.config.nvidia_runtime_is_default or is_gpu_pod(pod, ctx) or bool(dra_gpus(pod, ctx))


def nvidia_runtime(pod: PodView, ctx: Context) -> bool:
    """Signal.NVIDIA_RUNTIME: a GPU pod, or a pod under the NVIDIA runtime naming what it reads."""
    return gpu_pod(pod, ctx) or (reaches_nvidia_runtime(pod, ctx) and reads_runtime_input(pod))


def reads_runtime_input(pod: PodView) -> bool:
    """Does a container name what the NVIDIA runtime reads from a pod spec (GPU002, GPU007's mounts):
    NVIDIA_VISIBLE_DEVICES in env, any envFrom source, a mount path with the device list directory's name?"""
    for container in pod.containers():
        if container.env_from or any(isinstance(e, dict) and e.get("name") == VISIBLE_DEVICES for e in container.env):
            return True
        for mount in container.spec.get("volumeMounts") or []:
            path = mount.get("mountPath") if isinstance(mount, dict) else None
            if isinstance(path, str) and DEVICE_LIST_NAME in path:
                return True
    return False


# What the NVIDIA runtime reads from a pod spec: NVIDIA_VISIBLE_DEVICES in env (or from an envFrom source,
# with or without a prefix) and mounts under its device list directory (reads_runtime_input).
_RUNTIME_INPUT = (
    f"{_CONTAINERS}.exists(c, cel.bind(env, c.?env.orValue([]), cel.bind(mounts, c.?volumeMounts.orValue([]), "
    f"size(c.?envFrom.orValue([])) > 0 || size(env) > {MAX_ENV} || size(mounts) > {MAX_MOUNTS} || "
    f"env.exists(e, e.?name.orValue('') == '{VISIBLE_DEVICES}') || "
    f"mounts.exists(m, m.?mountPath.orValue('').contains('{DEVICE_LIST_NAME}')))))")
NVIDIA_RUNTIME_CEL = f"{GPU_POD_CEL} || ${{nvidiaRuntimeIsDefault}} && ({_RUNTIME_INPUT})"


# --- Signal.MPS_SELECTION -------------------------------------------------------------------------------------

def _selects(key: Any, values: set[str], wanted: Mapping[str, str], ctx: Context) -> bool:
    if key == ctx.sharing.label:
        return bool(values & ctx.sharing.mps_config_names)
    return key in wanted and wanted[key] in values


def mps_selection(pod: PodView, ctx: Context) -> str | None:
    """Why this pod is an MPS pod without looking at its resources (Signal.MPS_SELECTION), or None."""
    if str(pod.annotations.get(ctx.config.mps.annotation, "")).lower() == "true":
        return f"annotation {ctx.config.mps.annotation}"
    wanted = ctx.config.mps.node_selector
    for key, value in pod.node_selector.items():
        if _selects(key, {str(value)}, wanted, ctx):
            return f"selects {key}={value}"
    for term in pod.required_node_selector_terms():
        for expr in term.get("matchExpressions") or []:
            if isinstance(expr, Mapping) and expr.get("operator") == "In":
                values = {str(v) for v in expr.get("values") or []}
                if _selects(expr.get("key"), values, wanted, ctx):
                    return f"affinity on {expr.get('key')}"
    return None


def mps_selected(pod: PodView, ctx: Context) -> bool:
    """Signal.MPS_SELECTION."""
    return mps_selection(pod, ctx) is not None


_AFFINITY_TERMS = ("spec.?affinity.?nodeAffinity.?requiredDuringSchedulingIgnoredDuringExecution"
                   ".?nodeSelectorTerms.orValue([])")
_MPS_KEY = "(k == ${configLabel} || k in ${mpsNodeSelector})"
MPS_SELECTION_CEL = (
    "${mpsAnnotation} in annotations || "
    f"cel.bind(ns, spec.?nodeSelector.orValue({{}}), size(ns) > {MAX_SELECTOR} || ns.exists(k, {_MPS_KEY})) || "
    f"cel.bind(terms, {_AFFINITY_TERMS}, size(terms) > {MAX_TERMS} || terms.exists(t, "
    f"cel.bind(xs, t.?matchExpressions.orValue([]), size(xs) > {MAX_EXPRESSIONS} || xs.exists(x, "
    f"cel.bind(k, x.?key.orValue(''), {_MPS_KEY})))))"
)


# --- Signal.CDI_ANNOTATION ------------------------------------------------------------------------------------

def cdi_annotation(pod: PodView, ctx: Context) -> bool:
    """Signal.CDI_ANNOTATION."""
    return any(is_device_annotation(key) for key in pod.annotations)


DEVICE_ANNOTATION_CEL = (f"k.startsWith('{CDI_ANNOTATION_PREFIX}') || k == '{NRI_ANNOTATION_DOMAIN}' || "
                         f"k.startsWith('{NRI_ANNOTATION_DOMAIN}/')")
CDI_ANNOTATION_CEL = f"size(annotations) > {MAX_ANNOTATIONS} || annotations.exists(k, {DEVICE_ANNOTATION_CEL})"


# --- Signal.DRA_OBJECT ----------------------------------------------------------------------------------------

def dra_object(pod: PodView, ctx: Context) -> bool:
    """Signal.DRA_OBJECT: never a pod (scope.object_in_scope judges the kinds)."""
    return False


DRA_OBJECT_CEL = "object.kind == 'ResourceClaim' || object.kind == 'ResourceClaimTemplate'"


# --- The signals, each with both predicates -------------------------------------------------------------------

class Carried:
    """How to tell that a request carries a signal: in Python (on the pod, for a rule's context) and in CEL
    (on the object, as a matchCondition term)."""

    __slots__ = ("cel", "python")

    def __init__(self, python: Callable[[PodView, Context], bool], cel: str) -> None:
        self.python = python
        self.cel = cel


SIGNALS: dict[Signal, Carried] = {
    Signal.GPU_POD: Carried(gpu_pod, GPU_POD_CEL),
    Signal.GPU_RESOURCES: Carried(gpu_resources, GPU_RESOURCES_CEL),
    Signal.NVIDIA_RUNTIME: Carried(nvidia_runtime, NVIDIA_RUNTIME_CEL),
    Signal.MPS_SELECTION: Carried(mps_selected, MPS_SELECTION_CEL),
    Signal.CDI_ANNOTATION: Carried(cdi_annotation, CDI_ANNOTATION_CEL),
    Signal.DRA_OBJECT: Carried(dra_object, DRA_OBJECT_CEL),
}
