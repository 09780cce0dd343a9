"""The GPU rules as Kubernetes CEL admission policies (admissionregistration.k8s.io/v1), written here by hand
beside the Python rules (sharing their IDs, names, constants and config, not their code); that both decide
alike is tested (tests/property/test_cel_equivalence.py), not derived.

- `library`: CEL building blocks shared by every policy (where the pod spec is, its containers, which
  resources are GPUs, the device plugin configs a pod can land on) and `config_values`, the policy
  config as the values of the config variables the chart renders.
- `validating`: one ValidatingAdmissionPolicy per rule CEL can express (GPU001, GPU002, GPU003, GPU007,
  GPU009).
- `mutating`: MutatingAdmissionPolicies for the GPU limit fill (GPU001), the MPS injection (GPU006) and
  the runtime class injection (GPU008).
- `render`: the chart's generated policy file (charts/gpu-stack/files/cel-policies.yaml), with each
  validating policy's variables also on oldObject (identifiers renamed by a small CEL tokenizer).
- `runtime`: the policies evaluated offline (cel-expr-python plus the Kubernetes library functions
  they use), for `gpu-stack-webhook check --engine cel` and the equivalence property tests.
"""
