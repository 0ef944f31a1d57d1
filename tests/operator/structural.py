"""Validate an object against a CRD's structural openAPIV3Schema as the API server does with kubectl's default
(`--validate=strict`: an unknown field is an error, not silently pruned), using jsonschema."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with unknown fields refused wherever it declares properties."""
    out = copy.deepcopy(schema)
    stack = [out]
    while stack:
        node = stack.pop()
        if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            node.setdefault("additionalProperties", False)
        stack.extend(node.get("properties", {}).values())
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                stack.append(node[key])
        stack.extend(node.get("anyOf", []))
    return out


def validator(openapi_schema: dict[str, Any]) -> jsonschema.Draft4Validator:
    return jsonschema.Draft4Validator(strict(openapi_schema))


def errors(openapi_schema: dict[str, Any], obj: Any) -> list[str]:
    """One line per problem: the JSON path and jsonschema's message."""
    return [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator(openapi_schema).iter_errors(obj)
    ]
