"""Totals from the Prometheus text of a /metrics page (the API server's, etcd's), read with prometheus_client's
parser: each page is parsed once, into its samples, and every figure is a sum over them."""

from __future__ import annotations

from collections.abc import Collection

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

# The API server's own time (histograms; k8s.io/apiserver pkg/admission/metrics, v1.36) calling a webhook,
# from the request sent to the answer applied, and evaluating a webhook's matchConditions, the object and
# request turned into CEL values included.
WEBHOOK_METRIC = "apiserver_admission_webhook_admission_duration_seconds"
MATCH_METRIC = "apiserver_admission_match_condition_evaluation_seconds"


def samples(text: str) -> list[Sample]:
    """Every sample of the page."""
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def total(page: list[Sample], sample_name: str, webhooks: Collection[str] | None = None) -> float:
    """The sum of the samples named `sample_name` (`..._sum`, `..._count` for a histogram's), over all their
    labels; given `webhooks`, only those whose `name` label is one of them."""
    return sum(s.value for s in page
               if s.name == sample_name and (webhooks is None or s.labels.get("name") in webhooks))
