"""Strict validation of every object the chart renders, custom resources included.

kubernetes-validate knows Kubernetes' own kinds only. A custom resource is
checked the way the API server checks it: against its CRD's openAPIV3Schema
(the upstream CRDs kept, trimmed, under upstream/, and the chart's own), with
unknown fields refused as `kubectl apply`'s default strict field validation
refuses them. Its metadata is checked as the ObjectMeta it is.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any, Mapping

import jsonschema
import kubernetes_validate
import yaml

UPSTREAM = Path(__file__).with_name("upstream")
CHART_CRDS = Path(__file__).resolve().parents[2] / "charts" / "brain-operator" / "crds"


def closed(schema: Any) -> Any:
    """The schema with every object that lists its properties refusing others (strict field validation)."""
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: closed(value) for key, value in schema.items()}
    if "properties" in out and not out.get("x-kubernetes-preserve-unknown-fields"):
        out.setdefault("additionalProperties", False)
    return out


@cache
def crd_schemas() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> the closed openAPIV3Schema of each served version of the CRDs we know."""
    schemas = {}
    for path in sorted([*UPSTREAM.glob("*.yaml"), *CHART_CRDS.glob("*.yaml")]):
        crd = yaml.safe_load(path.read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if version["served"]:
                schemas[(f"{group}/{version['name']}", kind)] = closed(version["schema"]["openAPIV3Schema"])
    return schemas


def violations(obj: Mapping[str, Any], kubernetes_version: str) -> list[str]:
    """One line per problem, empty when the API server of that version would accept the object."""
    schema = crd_schemas().get((obj["apiVersion"], obj["kind"]))
    try:
        if schema is None:
            kubernetes_validate.validate(dict(obj), kubernetes_version, strict=True)
            return []
        # Any kind carrying the metadata validates it as ObjectMeta.
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]},
                                     kubernetes_version, strict=True)
    except kubernetes_validate.ValidationError as error:
        return [f"{list(error.path)}: {error.message}"]
    # OpenAPI v3.0 schemas have draft-4 semantics (a boolean exclusiveMinimum).
    validator = jsonschema.Draft4Validator(schema)
    return [f"{list(error.path)}: {error.message}" for error in validator.iter_errors(dict(obj))]
