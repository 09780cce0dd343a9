"""A read-only view of a pod spec wherever it lives: a Pod, or the pod template of a workload."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from jsonpointer import escape as escape_pointer_token

from gpu_stack_webhook.policy.desired import DesiredPod
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

EMPTY: Mapping[str, Any] = {}


class NotAPodError(ValueError):
    """The object does not hold a pod spec where its kind says it should."""


# Objects come from JSON or YAML, so their mappings are dicts: `isinstance(x, dict)` is much cheaper
# than the ABC check on this hot path.
def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else EMPTY


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


# Plain (not frozen) slotted classes: frozen __init__ is several times slower and these are built per review.
@dataclass(slots=True)
class ContainerRef:
    kind: str  # container | initContainer | ephemeralContainer
    index: int
    spec: Mapping[str, Any]
    field_name: str  # initContainers
    pod_path: str  # spec
    pod_pointer: str  # /spec

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

    def resources(self, section: str) -> Mapping[str, Any]:
        return _mapping(_mapping(self.spec.get("resources")).get(section))

    @property
    def env(self) -> list[Any]:
        return _list(self.spec.get("env"))

    @property
    def env_from(self) -> list[Any]:
        return _list(self.spec.get("envFrom"))

    @property
    def security_context(self) -> Mapping[str, Any]:
        return _mapping(self.spec.get("securityContext"))


@dataclass
class PodView:
    """The pod spec and metadata of an object, with the paths to reach them."""

    kind: str
    metadata: Mapping[str, Any]
    spec: Mapping[str, Any]
    path: str  # "spec" or "spec.template.spec"
    pointer: str  # "/spec" or "/spec/template/spec"
    metadata_path: str  # "metadata" or "spec.template.metadata"
    # Per-evaluation memo for facts several rules derive from the same pod (see rules.base).
    memo: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)
    # The object as the rules want it (desired.py); editable only for a Pod being created (ctx.can_patch).
    desired: DesiredPod = field(default_factory=lambda: DesiredPod({}), compare=False, repr=False)
    # Built on the first containers() call (not a cached_property: its lock costs more than the build).
    _containers: tuple[ContainerRef, ...] | None = field(default=None, init=False, compare=False, repr=False)

    @property
    def is_template(self) -> bool:
        return self.kind != "Pod"

    @classmethod
    def of(cls, obj: Mapping[str, Any], kind: str, *, patchable: bool = False) -> PodView:
        spec_path, meta_path = POD_SPEC_LOCATIONS[kind]
        spec: Any = obj
        for key in spec_path:
            spec = spec.get(key) if isinstance(spec, Mapping) else None
        if not isinstance(spec, Mapping):
            raise NotAPodError(f"{kind} has no pod spec at {'.'.join(spec_path)}")
        if not isinstance(spec.get("containers"), list):
            raise NotAPodError(f"{kind} pod spec has no containers list at {'.'.join(spec_path)}.containers")
        meta: Any = obj
        for key in meta_path:
            meta = _mapping(meta).get(key)
        return cls(
            kind=kind,
            metadata=_mapping(meta),
            spec=spec,
            path=".".join(spec_path),
            pointer="/" + "/".join(spec_path),
            metadata_path=".".join(meta_path),
            desired=DesiredPod(obj, writable=patchable),
        )

    def containers(self) -> Iterator[ContainerRef]:
        """Every container of the three kinds, in spec order."""
        found = self._containers
        if found is None:
            found = self._containers = self._collect_containers()
        return iter(found)

    def _collect_containers(self) -> tuple[ContainerRef, ...]:
        spec, path, pointer = self.spec, self.path, self.pointer
        found = []
        for field_name, kind in CONTAINER_FIELDS:
            items = spec.get(field_name)
            if isinstance(items, list):
                for index, container in enumerate(items):
                    if isinstance(container, dict):
                        found.append(ContainerRef(kind, index, container, field_name, path, pointer))
        return tuple(found)

    @property
    def annotations(self) -> Mapping[str, Any]:
        return _mapping(self.metadata.get("annotations"))

    @property
    def node_selector(self) -> Mapping[str, Any]:
        return _mapping(self.spec.get("nodeSelector"))

    @property
    def tolerations(self) -> list[Any]:
        return _list(self.spec.get("tolerations"))

    def required_node_selector_terms(self) -> list[Mapping[str, Any]]:
        node_affinity = _mapping(_mapping(self.spec.get("affinity")).get("nodeAffinity"))
        required = _mapping(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
        return [t for t in _list(required.get("nodeSelectorTerms")) if isinstance(t, Mapping)]


def parse_count(value: Any) -> Decimal | None:
    """A resource quantity as a number ("1", 1, "1000m", "2k"), or None when it is not a quantity."""
    if isinstance(value, bool) or value is None:
        return None
    if type(value) is int or (type(value) is str and value.isascii() and value.isdigit()):
        return Decimal(value)  # the common spelling, without the general parser
    try:
        parsed = parse_quantity(value)
    except (ValueError, TypeError, ArithmeticError):
        return None
    # Python's parser takes "Infinity", "inf" and "NaN"; Kubernetes quantities are finite numbers.
    return parsed if parsed.is_finite() else None


def format_count(value: Decimal) -> str:
    return str(int(value)) if value == value.to_integral_value() else str(value.normalize())


def pointer_token(key: str) -> str:
    return escape_pointer_token(key)
