"""The chart's Grafana dashboards as inspect reports them: its dashboard ConfigMaps (what Grafana's sidecar
imports) and grafana-operator GrafanaDashboards in the release (or monitoring.dashboards) namespace, with
uid and title from the dashboard JSON and the folder."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from gpu_stack_webhook.gpuinspect.fields import as_dict
from gpu_stack_webhook.gpuinspect.records import Dashboard, Dashboards

# Where the folder is read from a ConfigMap: the chart's default monitoring.dashboards.folderAnnotation,
# then the Grafana sidecar's own default (kiwigrid k8s-sidecar FOLDER_ANNOTATION).
FOLDER_ANNOTATIONS = ("grafana_folder", "k8s-sidecar-target-directory")


def _dashboard_json(text: Any) -> tuple[str | None, str | None]:
    try:
        doc = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        return None, None
    uid, title = doc.get("uid"), doc.get("title")
    return (uid if isinstance(uid, str) else None), (title if isinstance(title, str) else None)


def dashboards(namespace: str, configmaps: Iterable[Mapping[str, Any]],
               grafana_dashboards: Iterable[Mapping[str, Any]] = ()) -> Dashboards:
    """The chart's dashboards as found in `namespace`: one per `*.json` key of its dashboard ConfigMaps
    (what Grafana's sidecar imports), and one per GrafanaDashboard (what grafana-operator imports);
    sorted by kind, then name."""
    found: list[Dashboard] = []
    for cm in configmaps:
        meta = as_dict(cm.get("metadata"))
        annotations = as_dict(meta.get("annotations"))
        folder = next((str(annotations[k]) for k in FOLDER_ANNOTATIONS if k in annotations), None)
        for key, text in sorted(as_dict(cm.get("data")).items()):
            if str(key).endswith(".json"):
                uid, title = _dashboard_json(text)
                found.append(Dashboard("ConfigMap", str(meta.get("namespace", namespace)), str(meta.get("name", "")),
                                       uid, title, folder))
    for gd in grafana_dashboards:
        meta, spec = as_dict(gd.get("metadata")), as_dict(gd.get("spec"))
        uid, title = _dashboard_json(spec.get("json"))
        folder = spec.get("folder")
        found.append(Dashboard("GrafanaDashboard", str(meta.get("namespace", namespace)), str(meta.get("name", "")),
                               uid, title, folder if isinstance(folder, str) else None))
    return Dashboards(namespace, tuple(sorted(found, key=lambda d: (d.kind, d.name, d.uid or ""))))
