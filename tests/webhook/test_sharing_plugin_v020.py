"""What the pinned NVIDIA device plugin (v0.20) advertises for a config, as sharing.SharingIndex models it.

Upstream (github.com/NVIDIA/k8s-device-plugin, tag v0.20.0):
- api/config/v1/resources.go NewResourceName: "gpu" -> "nvidia.com/gpu" (prefix added when missing).
- api/config/v1/resources.go DefaultSharedRename, consts.go DefaultSharedResourceNameSuffix = ".shared".
- api/config/v1/config.go DisableResourceNamingInConfig (called by cmd/nvidia-device-plugin/main.go):
  `rename` is cleared (or forced to <name>.shared with renameByDefault), `devices` reset to all.
- api/config/v1/config.go NewConfig: MPS failRequestsGreaterThanOne defaults to true only when unset.
- internal/rm/rm.go ValidateRequest: a request of more than one replica fails when the flag is true.
- api/config/v1/sharing.go ReplicatedResources: the mps section, when present, is the one in force.
- internal/rm/rm.go AddDefaultResourcesToConfig + internal/rm/device_map.go updateDeviceMapWithReplicas:
  devices exist for nvidia.com/gpu (and nvidia.com/mig-* under mixed); a sharing entry for any other
  name matches nothing; a replicated resource replaces the plain one under its (re)name.
- api/config/v1/flags.go deviceListStrategyFlag: one string or a list; cmd/nvidia-device-plugin/main.go:
  the default strategy is envvar.
"""

from __future__ import annotations

from typing import Any

import pytest
from gpu_stack_webhook.policy.sharing import SharingIndex, Strategy

from .policylib import make_config


def index(plugin: dict[str, Any]) -> SharingIndex:
    return SharingIndex(make_config({"sharing": {"configs": {"default": {"version": "v1", **plugin}}}}))


def exposed(plugin: dict[str, Any]) -> dict[str, tuple[Strategy, bool]]:
    cfg = index(plugin).configs["default"]
    return {name: (r.strategy, r.fail_requests_greater_than_one) for name, r in cfg.exposed.items()}


@pytest.mark.parametrize(("plugin", "expected"), [
    pytest.param({"sharing": {"mps": {"resources": [{"name": "gpu", "replicas": 4}]}}},
                 {"nvidia.com/gpu": (Strategy.MPS, True)}, id="bare-name-mps-fails-by-default"),
    pytest.param({"sharing": {"mps": {"failRequestsGreaterThanOne": False,
                                      "resources": [{"name": "gpu", "replicas": 4}]}}},
                 {"nvidia.com/gpu": (Strategy.MPS, False)}, id="mps-explicit-false-honoured"),
    pytest.param({"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 4}]}}},
                 {"nvidia.com/gpu": (Strategy.TIME_SLICING, False)}, id="time-slicing-default-lets-more-through"),
    pytest.param({"sharing": {"timeSlicing": {"renameByDefault": True, "resources": [{"name": "gpu", "replicas": 4}]}}},
                 {"nvidia.com/gpu.shared": (Strategy.TIME_SLICING, False)}, id="rename-by-default-replaces-plain"),
    pytest.param({"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "rename": "fast", "replicas": 4}]}}},
                 {"nvidia.com/gpu": (Strategy.TIME_SLICING, False)}, id="rename-ignored"),
    pytest.param({"sharing": {"timeSlicing": {"renameByDefault": True,
                                              "resources": [{"name": "gpu", "rename": "fast", "replicas": 4}]}}},
                 {"nvidia.com/gpu.shared": (Strategy.TIME_SLICING, False)}, id="rename-forced-to-default"),
    pytest.param({"sharing": {"timeSlicing": {"resources": [{"name": "gpus", "replicas": 4}]}}},
                 {"nvidia.com/gpu": (Strategy.EXCLUSIVE, False)}, id="unknown-name-matches-nothing"),
    pytest.param({"flags": {"migStrategy": "mixed"},
                  "sharing": {"timeSlicing": {"resources": [{"name": "mig-1g.5gb", "replicas": 2}]}}},
                 {"nvidia.com/gpu": (Strategy.EXCLUSIVE, False),
                  "nvidia.com/mig-1g.5gb": (Strategy.TIME_SLICING, False)},
                 id="bare-mig-name-under-mixed"),
])
def test_what_the_plugin_advertises(plugin: dict[str, Any], expected: dict[str, tuple[Strategy, bool]]) -> None:
    assert exposed(plugin) == expected


def test_every_sharing_name_is_a_gpu_resource() -> None:
    idx = index({"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "rename": "fast", "replicas": 4}]}}})
    assert all(idx.is_gpu(n) for n in ("nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/fast",
                                       "nvidia.com/mig-2g.10gb"))
    assert not any(idx.is_gpu(n) for n in ("nvidia.com/rdma_shared_device_a", "nvidia.com/hostdev", "fast"))


@pytest.mark.parametrize(("strategy", "overrides"), [
    ("envvar", True), (["volume-mounts"], True), (["cdi-annotations"], True), (["cdi-cri"], False),
    (["cdi-cri", "volume-mounts"], True),
])
def test_device_list_strategy_single_string_or_list(strategy: Any, overrides: bool) -> None:
    cfg = index({"flags": {"plugin": {"deviceListStrategy": strategy}}}).configs["default"]
    assert cfg.list_overrides_image_env is overrides


def test_default_strategy_is_envvar() -> None:
    assert index({}).configs["default"].list_overrides_image_env is True
