"""What every rule gets: the policy config, its sharing index, the cluster facts, and whether it may patch."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpu_stack_webhook.policy.config import PolicyConfig
from gpu_stack_webhook.policy.facts import OFFLINE, ClusterFacts
from gpu_stack_webhook.policy.sharing import SharingIndex


@dataclass(frozen=True)
class Context:
    config: PolicyConfig
    sharing: SharingIndex = field(compare=False)
    # True only for a Pod being created through /mutate: the one case where rules may emit patches.
    can_patch: bool = False
    # What the cluster says (facts.py); offline unless the webhook runs with API lookups.
    facts: ClusterFacts = field(default=OFFLINE, compare=False)
    # The namespace of the object under review ("" offline: rules then never ask `facts`).
    namespace: str = ""

    @classmethod
    def for_config(cls, config: PolicyConfig, *, can_patch: bool = False) -> Context:
        return cls(config=config, sharing=SharingIndex(config), can_patch=can_patch)
