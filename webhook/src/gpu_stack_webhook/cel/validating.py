"""The ValidatingAdmissionPolicies: the CEL_VALIDATION of every rule module that has one, in RULES order
(docs/cel-mode.md lists them).

Each policy computes `variables.violations`, the list of the texts the Python rule's denials have
(Finding.text: "GPU002 container \"main\" sets ... (spec.containers[0].env[0])"), and denies when it is
not empty, with the message engine.denial_message would build. Each is written in its rule's module,
beside the Python check; tests/property/test_cel_equivalence.py runs both on
generated pods and compares the texts.

What stays in the webhook: warnings (GPU002's unprefixed envFrom, GPU009's MPS claim without a memory
limit), the API lookups (ConfigMap keys, Pod Security levels, the ResourceClaims a pod names: CEL sees a
pod's DRA GPUs only as deviceclass.resource.kubernetes.io/<GPU class> resources), GPU004/GPU005 (per-node
sharing and MIG exposure) and GPU006's denials. GPU009 judges ResourceClaims and ResourceClaimTemplates
(target "dra"), every other policy Pods and workloads (target "pods").
"""

from __future__ import annotations

from gpu_stack_webhook.policy.cel_twin import CelValidation
from gpu_stack_webhook.policy.rules import RULES

POLICIES: tuple[CelValidation, ...] = tuple(rule.cel_validation for rule in RULES if rule.cel_validation is not None)
