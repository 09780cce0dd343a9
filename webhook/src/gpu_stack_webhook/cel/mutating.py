"""The MutatingAdmissionPolicies (JSONPatch) for what /mutate changes: the CEL_MUTATION of every rule module
that has one, in RULES order.

- GPU001 fill: a GPU resource with a valid request and no limit gets the request as its limit.
- GPU006 MPS injection: hostIPC (when `injectHostIPC`), the missing MPS tolerations, and for the
  annotation opt-in the missing MPS node selector labels; an MPS pod is recognised exactly as
  rules.mps.mps_reason does (annotation, nodeSelector/affinity on MPS labels or MPS configs, a
  resource every candidate config shares through MPS). An opt-in whose nodeSelector excludes MPS nodes
  is left alone (the webhook denies it; CEL cannot).
- GPU008: `runtimeClassName` for a Pod that allocates a GPU and names none (`injectRuntimeClassName`).
- GPU009 MPS memory limit: a ResourceClaim or ResourceClaimTemplate being created whose NVIDIA opaque config
  shares through MPS (enabled in `dra.sharingStrategies`) without `mpsConfig.defaultPinnedDeviceMemoryLimit`
  gets `dra.mpsDefaultPinnedDeviceMemoryLimit` (target "dra": its own matchConstraints).

Like the webhook, every patch first checks what is there (reinvocationPolicy IfNeeded adds nothing
twice), and the policies are independent of each other's order: the limit fill changes no count the
others read. Where a map does not exist yet the patch adds it empty first, then one key per op, so the
pod is the same as after the webhook's patch (tests/property/test_cel_equivalence.py).
"""

from __future__ import annotations

from gpu_stack_webhook.policy.cel_twin import CelMutation
from gpu_stack_webhook.policy.rules import RULES

POLICIES: tuple[CelMutation, ...] = tuple(rule.cel_mutation for rule in RULES if rule.cel_mutation is not None)
