"""Strict Kubernetes JSON-schema validation (kubernetes-validate's schemas) with the validator
compiled once per kind: `kubernetes_validate.validate` re-reads ~2 MB of schema on every call."""

from __future__ import annotations

from functools import cache
from typing import Any

import jsonschema
import kubernetes_validate
from kubernetes_validate.utils import schema_contents
from referencing import Registry, Resource

# The newest Kubernetes minor kubernetes-validate ships schemas for (1.37 with 1.37.0).
K8S_VERSION = kubernetes_validate.latest_version()


@cache
def _validator(kind: str, api_version: str) -> jsonschema.protocols.Validator:
    group_version = api_version.replace("/", "-") if "/" in api_version else api_version
    schema_dir = f"kubernetes-json-schema/v{K8S_VERSION}-local-strict"
    schema = schema_contents(f"{schema_dir}/{kind.lower()}-{group_version}.json", K8S_VERSION)
    definitions = schema_contents(f"{schema_dir}/_definitions.json", K8S_VERSION)
    registry: Registry[Any] = Resource.from_contents(definitions) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)


def schema_errors(obj: dict[str, Any]) -> list[str]:
    """Every strict-schema violation of `obj` (empty when valid), as `path: message`."""
    validator = _validator(str(obj["kind"]), str(obj["apiVersion"]))
    return [f"{'.'.join(str(p) for p in e.absolute_path)}: {e.message}" for e in validator.iter_errors(obj)]
