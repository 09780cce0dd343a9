"""What the nodes expose, derived from the device plugin configs the chart rendered.

At CREATE a pod has no node, so the policy asks which named device plugin configs the pod could run
under (its nodeSelector or required node affinity on the config label, else any of them; a pod pinned
with spec.nodeName: its node's label, see gpus.candidate_configs), and what each of those
configs advertises: resource names, and for each whether it is exclusive, time-sliced or MPS-shared,
and whether requests greater than one fail. "Advertises" means what the pinned device plugin (v0.20)
makes of the config, which is not always what it says: bare names are prefixed, `rename` and
`devices` are ignored, MPS fails requests above one unless told not to.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpu_stack_webhook.policy.config import DevicePluginConfig, PolicyConfig, ReplicatedResources
from gpu_stack_webhook.policy.pod import PodView

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
    # The plugin's device list for a container takes precedence over its image environment in the
    # NVIDIA runtime: envvar (sets NVIDIA_VISIBLE_DEVICES), volume-mounts (read first, and sets
    # NVIDIA_VISIBLE_DEVICES to the mount root) or cdi-annotations (read first). cdi-cri alone sets
    # nothing the NVIDIA runtime reads (k8s-device-plugin v0.20 internal/plugin/server.go).
    list_overrides_image_env: bool = True

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


# github.com/NVIDIA/k8s-device-plugin v0.20 api/config/v1 (consts.go, resources.go NewResourceName):
# a name without the "nvidia.com/" prefix gets it, so `name: gpu` means nvidia.com/gpu.
RESOURCE_NAME_PREFIX = "nvidia.com/"
SHARED_SUFFIX = ".shared"
LIST_OVERRIDES_IMAGE_ENV = frozenset({"envvar", "volume-mounts", "cdi-annotations"})


def plugin_resource_name(name: str) -> str:
    """A resource name from a device plugin config, as the device plugin reads it."""
    return name if name.startswith(RESOURCE_NAME_PREFIX) else RESOURCE_NAME_PREFIX + name


def _advertised_by_plugin(resource: str, mig_strategy: str) -> bool:
    """Resources the plugin has devices for (rm.AddDefaultResourcesToConfig): nvidia.com/gpu always
    (MIG devices too under `single`), nvidia.com/mig-<profile> under `mixed`. A sharing entry naming
    anything else matches no device and is skipped (device_map.go updateDeviceMapWithReplicas)."""
    return resource == FULL_GPU or (mig_strategy == "mixed" and resource.startswith(MIG_PREFIX))


def _fails_requests_above_one(strategy: Strategy, section: ReplicatedResources) -> bool:
    # v0.20 config.go NewConfig: an MPS section without failRequestsGreaterThanOne gets true; an
    # explicit false is honoured. Time-slicing fails them only when the flag is true.
    if section.fail_requests_greater_than_one is None:
        return strategy is Strategy.MPS
    return section.fail_requests_greater_than_one


def _build_node_config(name: str, config: DevicePluginConfig) -> NodeConfig:
    """What the pinned device plugin (v0.20) advertises with this config. v0.20 ignores `rename`
    and `devices` (DisableResourceNamingInConfig): a shared resource is called by its name, or
    <name>.shared with renameByDefault, and every device of it is shared."""
    mig = config.flags.mig_strategy
    exposed: dict[str, ExposedResource] = {FULL_GPU: ExposedResource(FULL_GPU, Strategy.EXCLUSIVE)}
    replicated: list[tuple[Strategy, ReplicatedResources]] = []
    replaced: set[str] = set()
    # v0.20 sharing.go ReplicatedResources: the mps section, when present, is the one in force.
    if config.sharing.mps and config.sharing.mps.resources:
        replicated.append((Strategy.MPS, config.sharing.mps))
    elif config.sharing.time_slicing:
        replicated.append((Strategy.TIME_SLICING, config.sharing.time_slicing))
    for strategy, section in replicated:
        for resource in section.resources:
            base = plugin_resource_name(resource.name)
            if not _advertised_by_plugin(base, mig):
                continue
            exposed.pop(base, None)  # the shared resource replaces the plain one
            shared = base + SHARED_SUFFIX if section.rename_by_default else base
            if shared != base:
                replaced.add(base)
            exposed[shared] = ExposedResource(
                name=shared,
                strategy=strategy,
                replicas=resource.replicas,
                fail_requests_greater_than_one=_fails_requests_above_one(strategy, section),
            )
    overrides = bool(LIST_OVERRIDES_IMAGE_ENV & set(config.flags.plugin.device_list_strategies))
    return NodeConfig(name=name, mig_strategy=mig, exposed=exposed, replaced=frozenset(replaced - set(exposed)),
                      list_overrides_image_env=overrides)


def sharing_resource_names(config: DevicePluginConfig) -> set[str]:
    """Every resource name a sharing config mentions (names, their .shared forms, renames), normalised:
    all of them are GPUs, whatever the plugin version makes of them."""
    names: set[str] = set()
    for section in (config.sharing.time_slicing, config.sharing.mps):
        for resource in section.resources if section else ():
            base = plugin_resource_name(resource.name)
            names.update({base, base + SHARED_SUFFIX})
            if resource.rename:
                names.add(plugin_resource_name(resource.rename))
    return names


class SharingIndex:
    """All named configs of one policy config; built once per loaded config."""

    def __init__(self, policy: PolicyConfig) -> None:
        self.label = policy.sharing.node_config_label
        self.default = policy.sharing.default_config
        self.configs: dict[str, NodeConfig] = {
            name: _build_node_config(name, cfg) for name, cfg in policy.sharing.configs.items()
        }
        gpus = policy.gpu_resources
        self.gpu_names = frozenset(gpus.names).union(
            *(sharing_resource_names(cfg) for cfg in policy.sharing.configs.values())
        )
        self.gpu_prefixes = gpus.prefixes
        # Read by rules on every review: plain attributes (a cached_property is a generic lookup, compiled).
        self.mps_config_names = frozenset(name for name, cfg in self.configs.items() if cfg.uses_mps)
        # Does any config fail requests above one for some resource? (Without one, GPU004 has nothing to say.)
        self.refuses_more_than_one = any(
            r.fail_requests_greater_than_one for cfg in self.configs.values() for r in cfg.exposed.values()
        )

    def is_gpu(self, resource: str) -> bool:
        """Is this extended resource a GPU (policy gpuResources, or named in a sharing config)?"""
        return resource in self.gpu_names or resource.startswith(self.gpu_prefixes)

    def _named(self, names: Iterable[str]) -> list[NodeConfig]:
        # A label value naming no config makes the config-manager fall back to the default.
        chosen = {n if n in self.configs else self.default for n in names}
        return [self.configs[n] for n in sorted(chosen)]

    def for_node_label(self, value: str | None) -> NodeConfig:
        """The config of a node whose config label is `value` (None: the node has no such label)."""
        return self._named([value if value is not None else self.default])[0]

    def candidates(self, pod: PodView) -> list[NodeConfig]:
        """The configs of every node the pod could be scheduled to (from the pod alone)."""
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
