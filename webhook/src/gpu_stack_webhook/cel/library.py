"""What the generated policies share beyond the rule modules' CEL twins (policy/cel_twin.py): the config they
read and the denial message.

Config-dependent facts are *config variables*: CEL literals the chart renders from its values
(templates/webhook/_cel.tpl) and `config_values` computes from a PolicyConfig, so offline evaluation and
the chart read the same config; a chart test compares the two for every overlay. The Kubernetes CEL
environment has no bindings extension: `lower_binds` rewrites the `cel.bind` the expressions are
written with.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from gpu_stack_webhook.policy.config import PolicyConfig
from gpu_stack_webhook.policy.sharing import SharingIndex


def violations_message() -> str:
    """The denial text from `variables.violations`, as engine.denial_message joins findings."""
    v = "variables.violations"
    return (f"size({v}) == 1 ? {v}[0] : string(size({v})) + ' GPU policy violations: ' + "
            f"lists.range(size({v})).map(i, '[' + string(i + 1) + '] ' + {v}[i]).join('; ')")


def config_values(config: PolicyConfig) -> dict[str, Any]:
    """The config variables for `config`, as plain JSON values (the chart renders the same ones)."""
    index = SharingIndex(config)
    mps = config.mps
    return {
        "gpuNames": sorted(index.gpu_names),
        "gpuPrefixes": sorted(index.gpu_prefixes),
        "gpuResourcePattern": gpu_resource_pattern(index.gpu_names, index.gpu_prefixes),
        "gpuRuntimeClassNames": sorted(config.gpu_runtime_class_names),
        "nonGpuRuntimeClassNames": sorted(set(config.non_gpu_runtime_class_names)),
        "configLabel": index.label,
        "configNames": sorted(index.configs),
        "defaultConfig": index.default,
        "overridingConfigs": sorted(n for n, c in index.configs.items() if c.list_overrides_image_env),
        # Per config: resource -> strategy, the names renamed away, and whether MIG is mixed.
        "exposed": {n: {r: e.strategy.value for r, e in sorted(c.exposed.items())} for n, c in index.configs.items()},
        "replaced": {n: sorted(c.replaced) for n, c in index.configs.items()},
        "mixedMigConfigs": sorted(n for n, c in index.configs.items() if c.mig_strategy == "mixed"),
        "mpsConfigNames": sorted(index.mps_config_names),
        "mpsAnnotation": mps.annotation,
        "mpsNodeSelector": dict(sorted(mps.node_selector.items())),
        "mpsTolerations": [t.as_k8s() for t in mps.tolerations],
        "injectHostIPC": mps.inject_host_ipc,
        "injectRuntimeClassName": config.inject_runtime_class_name,
        "nvidiaRuntimeIsDefault": config.nvidia_runtime_is_default,
        "disabledRules": sorted(config.rules.disabled),
        # Dynamic Resource Allocation (config.DraPolicy; GPU002, GPU003, GPU009).
        "draGpuClasses": sorted(set(config.dra.gpu_device_classes)),
        "draAllocationModeAllNamespaces": sorted(set(config.dra.allocation_mode_all_namespaces)),
        "draAdminAccessNamespaces": sorted(set(config.dra.admin_access_namespaces)),
        "draSharingStrategies": sorted(set(config.dra.sharing_strategies)),
        "draMpsDefaultLimit": config.dra.mps_default_pinned_device_memory_limit,
    }


def gpu_resource_pattern(names: Iterable[str], prefixes: Iterable[str]) -> str:
    """A regular expression (RE2, as CEL's `matches` reads it) for a resource name that is one of `names` or
    starts with one of `prefixes`. With neither, it matches only the empty string, which is no resource name.
    The chart builds the same string (templates/webhook/_cel.tpl, with Go's regexp.QuoteMeta)."""
    alternatives = [f"{_quote_meta(n)}$" for n in sorted(set(names))]
    alternatives += [_quote_meta(p) for p in sorted(set(prefixes))]
    return f"^(?:{'|'.join(alternatives)})" if alternatives else "^$"


def _quote_meta(text: str) -> str:
    """Go's regexp.QuoteMeta (Helm's regexQuoteMeta): a backslash before each of \\.+*?()|[]{}^$."""
    return re.sub(r"[\\.+*?()|\[\]{}^$]", lambda m: "\\" + m.group(), text)


def lower_binds(expr: str) -> str:
    """`cel.bind(x, value, body)` -> `[value].map(x, body)[0]`: the Kubernetes CEL environment has no
    bindings extension, so the generated policies write the binding as a one-element comprehension."""
    start = expr.find("cel.bind(")
    if start < 0:
        return expr
    args, end = _call_args(expr, start + len("cel.bind("))
    name, value, body = (lower_binds(a.strip()) for a in args)
    return expr[:start] + f"[{value}].map({name}, {body})[0]" + lower_binds(expr[end:])


def _call_args(expr: str, pos: int) -> tuple[list[str], int]:
    """The top-level comma-separated arguments from `pos` to the matching `)`, and the index after it."""
    args, depth, quote, begin = [], 0, "", pos
    for i in range(pos, len(expr)):
        ch = expr[i]
        if quote:
            if ch == quote and expr[i - 1] != "\\":
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                args.append(expr[begin:i])
                return args, i + 1
            depth -= 1
        elif ch == "," and depth == 0:
            args.append(expr[begin:i])
            begin = i + 1
    raise ValueError(f"unbalanced cel.bind in {expr[:80]}...")
