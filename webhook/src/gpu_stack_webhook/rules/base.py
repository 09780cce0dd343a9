"""What every rule gets, and the GPU facts several rules share."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from ..config import PolicyConfig
from ..pod import ContainerRef, PodView, parse_count
from ..sharing import SharingIndex


@dataclass(frozen=True)
class Context:
    config: PolicyConfig
    sharing: SharingIndex = field(compare=False)
    # True only for a Pod being created through /mutate: the one case where rules may emit patches.
    can_patch: bool = False

    @classmethod
    def for_config(cls, config: PolicyConfig, *, can_patch: bool = False) -> Context:
        return cls(config=config, sharing=SharingIndex(config), can_patch=can_patch)


@dataclass(frozen=True, slots=True)
class GpuAmount:
    container: ContainerRef
    resource: str
    request: Any  # raw values as written, None when absent
    limit: Any

    @property
    def count(self) -> Decimal | None:
        """What the container will be given: the limit, else the request."""
        return parse_count(self.limit if self.limit is not None else self.request)


def gpu_amounts(pod: PodView, ctx: Context) -> Iterator[GpuAmount]:
    """Every GPU resource named in any container's requests or limits."""
    is_gpu = ctx.config.gpu_resources.is_gpu
    for container in pod.containers():
        requests, limits = container.resources("requests"), container.resources("limits")
        for resource in dict.fromkeys([*requests, *limits]):
            if is_gpu(resource):
                yield GpuAmount(container, resource, requests.get(resource), limits.get(resource))


def is_gpu_pod(pod: PodView, ctx: Context) -> bool:
    """A pod that requests any GPU resource in any container, or runs with a GPU runtime class."""
    if pod.spec.get("runtimeClassName") in ctx.config.gpu_runtime_class_names:
        return True
    return any(True for _ in gpu_amounts(pod, ctx))
