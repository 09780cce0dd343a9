"""The GPU rules as Kubernetes CEL admission policies (admissionregistration.k8s.io/v1) and the webhook
configurations' matchConditions, assembled from the rule modules: each rule module writes its CEL twin by
hand beside its Python check (policy/rules/, with the pieces of policy/cel_twin.py), sharing its ID, name,
message templates, constants and config, not its code; that both decide alike is tested
(tests/property/test_cel_equivalence.py), not derived.

- `library`: `config_values`, the policy config as the values of the config variables the chart renders,
  the denial message, and `lower_binds` (the Kubernetes CEL environment has no bindings extension).
- `validating`, `mutating`: the rule modules' CEL_VALIDATION and CEL_MUTATION, in RULES order.
- `match_conditions`: the webhooks' matchConditions from the rules' SCOPE and the signals' CEL
  (policy/signals.py).
- `render`: the chart's generated policy file (charts/gpu-stack/files/cel-policies.yaml), with each
  validating policy's variables also on oldObject (identifiers renamed by a small CEL tokenizer).
- `runtime`: the policies evaluated offline (cel-expr-python plus the Kubernetes library functions
  they use), for `gpu-stack-webhook check --engine cel` and the equivalence property tests.
- `check`: `gpu-stack-webhook check --engine cel`.
"""
