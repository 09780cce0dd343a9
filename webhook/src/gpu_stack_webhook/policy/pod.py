"""A read-only view of a pod spec wherever it lives: a Pod, or the pod template of a workload."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from decimal import Decimal
from typing import Any

from gpu_stack_webhook.policy.desired import READ_ONLY, DesiredPod
from gpu_stack_webhook.policy.quantity import parse_quantity

# (field in the pod spec, how a user calls it)
CONTAINER_FIELDS = (
    ("containers", "container"),
    ("initContainers", "initContainer"),
    ("ephemeralContainers", "ephemeralContainer"),
)

# Where the pod spec sits, per kind: (path segments, metadata segments).
POD_SPEC_LOCATIONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "Pod": (("spec",), ("metadata",)),
    "Deployment": (("spec", "template", "spec"), ("spec", "template", "metadata")),
    "ReplicaSet": (("spec", "template", "spec"), ("spec", "template", "metadata")),
    "StatefulSet": (("spec", "template", "spec"), ("spec", "template", "metadata")),
    "DaemonSet": (("spec", "template", "spec"), ("spec", "template", "metadata")),
    "Job": (("spec", "template", "spec"), ("spec", "template", "metadata")),
    "CronJob": (
        ("spec", "jobTemplate", "spec", "template", "spec"),
        ("spec", "jobTemplate", "spec", "template", "metadata"),
    ),
}

# (path, pointer, metadata path) per kind: "spec.template.spec", "/spec/template/spec", "spec.template.metadata".
_PATHS = {kind: (".".join(spec), "/" + "/".join(spec), ".".join(meta))
          for kind, (spec, meta) in POD_SPEC_LOCATIONS.items()}


class NotAPodError(ValueError):
    """The object does not hold a pod spec where its kind says it should."""


# Objects come from JSON or YAML, so their mappings are dicts: `isinstance(x, dict)` is much cheaper
# than the ABC check on this hot path, and typed as dicts the compiled rules read them with the dict's own
# C functions instead of a method call. An absent member reads as a new empty dict: rules never modify
# what the view shows (rules/__init__.py), and if one did, no other review would see it.
def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


# Plain classes with a written __init__, not dataclasses: compiled by mypyc (setup.py) their construction and
# attribute reads are native, where a dataclass keeps the __init__ the dataclasses module generates in
# Python. They are built per review, several per container.
class ContainerRef:
    """One container of the pod spec, with the members every rule reads already looked up (once per
    review, where the containers are collected: the rules read them from the slots)."""

    __slots__ = ("env", "env_from", "field_name", "index", "kind", "limits", "pod_path", "pod_pointer", "requests",
                 "security_context", "spec")

    def __init__(self, spec: dict[str, Any], index: int, place: tuple[str, str, str, str]) -> None:
        """`place`: (kind, field name, pod path, pod pointer), the same for every container of a field."""
        self.kind, self.field_name, self.pod_path, self.pod_pointer = place  # container, initContainers, spec, /spec
        self.index = index
        self.spec = spec
        # _mapping and _list inlined: this runs for every container of every review.
        resources = spec.get("resources")
        requests: Any = None
        limits: Any = None
        if isinstance(resources, dict):
            requests, limits = resources.get("requests"), resources.get("limits")
        self.requests: dict[str, Any] = requests if isinstance(requests, dict) else {}  # resources.requests
        self.limits: dict[str, Any] = limits if isinstance(limits, dict) else {}
        env, env_from, context = spec.get("env"), spec.get("envFrom"), spec.get("securityContext")
        self.env: list[Any] = env if isinstance(env, list) else []  # [] when absent or not a list
        self.env_from: list[Any] = env_from if isinstance(env_from, list) else []
        self.security_context: dict[str, Any] = context if isinstance(context, dict) else {}

    def __repr__(self) -> str:
        return f"ContainerRef({self.path})"

    @property
    def path(self) -> str:
        """spec.initContainers[0]: formatted only when a finding names it."""
        return f"{self.pod_path}.{self.field_name}[{self.index}]"

    @property
    def pointer(self) -> str:
        """/spec/initContainers/0"""
        return f"{self.pod_pointer}/{self.field_name}/{self.index}"

    @property
    def name(self) -> str:
        return str(self.spec.get("name", f"#{self.index}"))

    @property
    def label(self) -> str:
        return f'{self.kind} "{self.name}"'


class PodView:
    """The pod spec and metadata of an object, with the paths to reach them (a plain class: see ContainerRef)."""

    __slots__ = ("_containers", "desired", "kind", "memo", "metadata", "metadata_path", "path", "pointer", "spec")

    def __init__(self, kind: str, metadata: dict[str, Any], spec: dict[str, Any],
                 desired: DesiredPod = READ_ONLY) -> None:
        """`kind`: one of POD_SPEC_LOCATIONS, whose paths say where `spec` and `metadata` sit."""
        self.kind = kind
        self.metadata = metadata
        self.spec = spec
        # "spec" or "spec.template.spec", "/spec" or "/spec/template/spec", "metadata" or "spec.template.metadata"
        self.path, self.pointer, self.metadata_path = _PATHS[kind]
        # Per-evaluation memo for facts several rules derive from the same pod (see gpus.py, dra.py).
        self.memo: dict[Any, Any] = {}
        # The object as the rules want it (desired.py); editable only for a Pod being created (ctx.can_patch).
        self.desired = desired
        # Built on the first containers() call (not a cached_property: its lock costs more than the build).
        self._containers: tuple[ContainerRef, ...] | None = None

    def __repr__(self) -> str:
        return f"PodView({self.kind} at {self.path})"

    @property
    def is_template(self) -> bool:
        return self.kind != "Pod"

    @classmethod
    def of(cls, obj: Mapping[str, Any], kind: str, *, patchable: bool = False) -> PodView:
        spec_path, meta_path = POD_SPEC_LOCATIONS[kind]
        spec: Any = obj
        for key in spec_path:
            spec = spec.get(key) if isinstance(spec, dict) else None
        if not isinstance(spec, dict):
            raise NotAPodError(f"{kind} has no pod spec at {'.'.join(spec_path)}")
        if not isinstance(spec.get("containers"), list):
            raise NotAPodError(f"{kind} pod spec has no containers list at {'.'.join(spec_path)}.containers")
        meta: Any = obj
        for key in meta_path:
            meta = _mapping(meta).get(key)
        return cls(kind, _mapping(meta), spec, DesiredPod(obj, writable=True) if patchable else READ_ONLY)

    def containers(self) -> Iterator[ContainerRef]:
        """Every container of the three kinds, in spec order."""
        found = self._containers
        if found is None:
            found = self._containers = self._collect_containers()
        return iter(found)

    def _collect_containers(self) -> tuple[ContainerRef, ...]:
        spec, path, pointer = self.spec, self.path, self.pointer
        found: list[ContainerRef] = []
        for field_name, kind in CONTAINER_FIELDS:
            items = spec.get(field_name)
            if isinstance(items, list):
                place = (kind, field_name, path, pointer)
                for index, container in enumerate(items):
                    if isinstance(container, dict):
                        found.append(ContainerRef(container, index, place))
        return tuple(found)

    @property
    def annotations(self) -> dict[str, Any]:
        return _mapping(self.metadata.get("annotations"))

    @property
    def node_selector(self) -> dict[str, Any]:
        return _mapping(self.spec.get("nodeSelector"))

    @property
    def tolerations(self) -> list[Any]:
        return _list(self.spec.get("tolerations"))

    def required_node_selector_terms(self) -> list[dict[str, Any]]:
        affinity = self.spec.get("affinity")
        if not affinity:  # most pods: no affinity at all
            return []
        node_affinity = _mapping(_mapping(affinity).get("nodeAffinity"))
        required = _mapping(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
        return [t for t in _list(required.get("nodeSelectorTerms")) if isinstance(t, dict)]


# The counts pods ask for nearly always: Decimals are immutable, so one of each serves every review.
_SMALL_COUNTS: dict[Any, Decimal] = {spelling: Decimal(n) for n in range(65) for spelling in (str(n), n)}


def parse_count(value: Any) -> Decimal | None:
    """A resource quantity as a number ("1", 1, "1000m", "2k"), or None when it is not a quantity."""
    if isinstance(value, bool) or value is None:
        return None
    if type(value) is int or (type(value) is str and value.isascii() and value.isdigit()):
        small = _SMALL_COUNTS.get(value)  # the common spelling, without the general parser
        return small if small is not None else Decimal(value)
    try:
        parsed = parse_quantity(value)
    except (ValueError, TypeError, ArithmeticError):
        return None
    # Python's parser takes "Infinity", "inf" and "NaN"; Kubernetes quantities are finite numbers.
    return parsed if parsed.is_finite() else None


def format_count(value: Decimal) -> str:
    return str(int(value)) if value == value.to_integral_value() else str(value.normalize())
