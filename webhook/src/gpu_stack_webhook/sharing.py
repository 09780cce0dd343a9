"""What the nodes expose, derived from the device plugin configs the chart rendered.

At CREATE a pod has no node, so the policy asks which named device plugin configs the pod could run
under (its nodeSelector or required node affinity on the config label, else any of them), and what
each of those configs advertises: resource names, and for each whether it is exclusive, time-sliced
or MPS-shared, and whether requests greater than one fail.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from .config import DevicePluginConfig, PolicyConfig, ReplicatedResources
from .pod import PodView

FULL_GPU = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"


class Strategy(enum.Enum):
    EXCLUSIVE = "exclusive"
    TIME_SLICING = "time-slicing"
    MPS = "mps"


@dataclass(frozen=True, slots=True)
class ExposedResource:
    name: str
    strategy: Strategy
    replicas: int = 1
    fail_requests_greater_than_one: bool = False


@dataclass(frozen=True)
class NodeConfig:
    """One named device plugin config as the policy sees it."""

    name: str
    mig_strategy: str
    exposed: Mapping[str, ExposedResource]
    # Resource names a sharing section renamed away: the node no longer advertises them.
    replaced: frozenset[str] = frozenset()

    def lookup(self, resource: str) -> ExposedResource | None:
        found = self.exposed.get(resource)
        if (found is None and self.mig_strategy == "mixed" and resource.startswith(MIG_PREFIX)
                and resource not in self.replaced):
            # Under the mixed strategy every MIG profile on the node becomes its own resource.
            return ExposedResource(resource, Strategy.EXCLUSIVE)
        return found

    @property
    def uses_mps(self) -> bool:
        return any(r.strategy is Strategy.MPS for r in self.exposed.values())


def _shared_name(name: str, rename: str | None, rename_by_default: bool) -> str:
    if rename:
        return rename
    return f"{name}.shared" if rename_by_default else name


def _build_node_config(name: str, config: DevicePluginConfig) -> NodeConfig:
    mig = config.flags.mig_strategy
    exposed: dict[str, ExposedResource] = {FULL_GPU: ExposedResource(FULL_GPU, Strategy.EXCLUSIVE)}
    replicated: list[tuple[Strategy, ReplicatedResources]] = []
    replaced: set[str] = set()
    if config.sharing.time_slicing:
        replicated.append((Strategy.TIME_SLICING, config.sharing.time_slicing))
    if config.sharing.mps:
        replicated.append((Strategy.MPS, config.sharing.mps))
    for strategy, section in replicated:
        for resource in section.resources:
            exposed.pop(resource.name, None)  # the shared resource replaces the plain one
            shared = _shared_name(resource.name, resource.rename, section.rename_by_default)
            if shared != resource.name:
                replaced.add(resource.name)
            exposed[shared] = ExposedResource(
                name=shared,
                strategy=strategy,
                replicas=resource.replicas,
                # The device plugin refuses MPS requests above one whatever the flag says.
                fail_requests_greater_than_one=strategy is Strategy.MPS
                or section.fail_requests_greater_than_one,
            )
    return NodeConfig(name=name, mig_strategy=mig, exposed=exposed, replaced=frozenset(replaced - set(exposed)))


class SharingIndex:
    """All named configs of one policy config; built once per loaded config."""

    def __init__(self, policy: PolicyConfig) -> None:
        self.label = policy.sharing.node_config_label
        self.default = policy.sharing.default_config
        self.configs: dict[str, NodeConfig] = {
            name: _build_node_config(name, cfg) for name, cfg in policy.sharing.configs.items()
        }

    @cached_property
    def mps_config_names(self) -> frozenset[str]:
        return frozenset(name for name, cfg in self.configs.items() if cfg.uses_mps)

    def _named(self, names: Iterable[str]) -> list[NodeConfig]:
        # A label value naming no config makes the config-manager fall back to the default.
        chosen = {n if n in self.configs else self.default for n in names}
        return [self.configs[n] for n in sorted(chosen)]

    def candidates(self, pod: PodView) -> list[NodeConfig]:
        """The configs of every node the pod could be scheduled to."""
        selected = pod.node_selector.get(self.label)
        if isinstance(selected, str):
            return self._named([selected])
        terms = pod.required_node_selector_terms()
        names: set[str] = set()
        for term in terms:
            values = _values_required(term, self.label)
            if values is None:  # a term that does not pin the label allows every config
                return list(self.configs.values())
            names.update(values)
        if terms and names:
            return self._named(names)
        return list(self.configs.values())


def _values_required(term: Mapping[str, Any], label: str) -> set[str] | None:
    for expr in term.get("matchExpressions") or []:
        if isinstance(expr, Mapping) and expr.get("key") == label and expr.get("operator") == "In":
            values = expr.get("values")
            if isinstance(values, list):
                return {str(v) for v in values}
    return None
