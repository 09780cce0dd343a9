"""PromQL helpers of the generated rules and dashboards.

metric_names: the metric names a PromQL expression reads, without a PromQL parser (none is packaged for
Python): strings, label matchers, range and subquery brackets and grouping clauses are blanked out, and what
remains is a name unless a `(` follows it (a function or an aggregation) or it is an operator keyword. Tests
check it on the chart's own expressions (tests/monitoring/test_metric_names.py); promtool checks that they
parse. with_hostname: the DCGM exporter's node label under one spelling.
"""

from __future__ import annotations

import re

KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
                      "offset", "atan2", "inf", "nan", "Inf", "NaN"})
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![\w.:])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def metric_names(expr: str) -> set[str]:
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub(" ", text)
    text = _BRACKETS.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for match in _IDENT.finditer(text):
        name, call = match.group(1), match.group(2)
        if call or name in KEYWORDS:
            continue
        names.add(name)
    return names


def family(name: str) -> str:
    """The metric family of a series name: a histogram's _bucket/_sum/_count series belong to its name."""
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


def with_hostname(expr: str) -> str:
    """A DCGM exporter alert's result with the node in `Hostname` whichever spelling the exporter uses: up to
    tag 4.5.3-4.8.2 it writes `Hostname`, its main branch since d5e5f510a1b6 ("Rename Hostname label to
    hostname") writes `hostname` (NVIDIA/dcgm-exporter internal/pkg/rendermetrics/render_metrics.go); the
    chart sets NODE_NAME, so the value is the node's name either way. Annotations read `$labels.Hostname`."""
    return f'label_replace({expr}, "Hostname", "$1", "hostname", "(.+)")'
