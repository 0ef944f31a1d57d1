"""Kubernetes' own core/v1 schemas for the pod overlay (`spec.podTemplate`) and `spec.scheduling`, and a checker for them.

The CRD types the overlay's pod fields, and scheduling's affinity and
tolerations, with these schemas (so `kubectl explain`
works and the API server rejects a typo), and the parser checks a manifest
against the same ones, naming the path of each problem. They are Kubernetes
1.29's, the oldest version the project supports, so what they accept every
supported cluster accepts; `python -m brain_operator.crd` takes them from
kubernetes-validate's bundled definitions into corev1.json ($refs inlined,
IntOrString and Quantity as int-or-string, descriptions two levels deep so
`kubectl explain` helps and the CRD stays well under kubectl's 256 KiB
annotation limit).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any, Iterator, Mapping

from brain_trainer.schema import key_for, quoted, setting

SOURCE_VERSION = "1.29.0"
SCHEMA_FILE = Path(__file__).with_name("corev1.json")
# The PodSpec fields the overlay may set, with their Kubernetes types (for docs/crd.md).
POD_SPEC_FIELDS = {
    "imagePullSecrets": "list of core/v1 LocalObjectReference",
    "serviceAccountName": "string",
    "automountServiceAccountToken": "boolean",
    "volumes": "list of core/v1 Volume",
    "initContainers": "list of core/v1 Container",
    "containers": "list of core/v1 Container",
    "priorityClassName": "string",
    "hostNetwork": "boolean",
    "dnsPolicy": "string",
    "runtimeClassName": "string",
}
# The PodSpec fields spec.scheduling passes to every worker pod (spec/model.py's SchedulingSpec).
SCHEDULING_FIELDS = {
    "affinity": "core/v1 Affinity",
    "tolerations": "list of core/v1 Toleration",
}
CORE_FIELDS = {**POD_SPEC_FIELDS, **SCHEDULING_FIELDS}
# Levels of nested properties that keep their descriptions.
DESCRIBED_LEVELS = 2
_KEPT = ("description", "type", "format", "properties", "items", "required", "enum", "additionalProperties",
         "x-kubernetes-map-type", "x-kubernetes-list-type", "x-kubernetes-list-map-keys")
_INT_OR_STRING = {"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}]}


@functools.lru_cache(maxsize=None)
def _pod_spec() -> dict[str, Any]:
    return json.loads(SCHEMA_FILE.read_text())["podSpec"]


def pod_spec_field(name: str) -> dict[str, Any]:
    """The structural OpenAPI schema of one PodSpec field, as Kubernetes declares it."""
    return _pod_spec()[name]


def core_setting(name: str, help: str = "") -> Any:
    """A dataclass field holding Kubernetes' own PodSpec field `name`, typed by its core/v1 schema."""
    schema = pod_spec_field(name)
    if help:
        schema = {**schema, "description": help}
    if schema.get("type") == "array":
        return setting(default_factory=list, schema=schema)
    return setting(None, schema=schema)


def core_problems(instance: Any) -> Iterator[tuple[str, str]]:
    """(field, message) for each core/v1 field of a dataclass (declared with core_setting) that breaks its schema."""
    for f in dataclasses.fields(instance):
        if "schema" in f.metadata and f.metadata["schema"] is not None:
            yield from schema_errors(getattr(instance, f.name), f.metadata["schema"], key_for(f, True))


# ---- generation (dev only: kubernetes-validate is a dev dependency) ----


def _structural(node: Mapping[str, Any], defs: Mapping[str, Any], depth: int) -> dict[str, Any]:
    """A JSON-schema node of kubernetes-validate as a structural OpenAPI v3 schema for a CRD."""
    described = depth > 0 and "description" in node
    if "$ref" in node:
        target = _structural(defs[node["$ref"].rsplit("/", 1)[1]], defs, depth)
        return {**target, "description": node["description"]} if described else target
    if "oneOf" in node:  # IntOrString and Quantity
        return {"description": node["description"], **_INT_OR_STRING} if described else dict(_INT_OR_STRING)
    out: dict[str, Any] = {}
    for key in _KEPT:
        if key not in node or (key == "description" and depth <= 0):
            continue
        value = node[key]
        if key == "type":
            value = value if isinstance(value, str) else next(t for t in value if t != "null")
        elif key == "properties":
            value = {name: _structural(sub, defs, depth - 1) for name, sub in value.items()}
        elif key == "items":
            value = _structural(value, defs, depth)
        elif key == "additionalProperties":
            if not isinstance(value, Mapping):
                continue  # `false`: a structural schema prunes unknown fields instead
            value = _structural(value, defs, depth - 1)
        out[key] = value
    if out.get("x-kubernetes-list-type") == "map":
        # A CRD's map-list keys must be required; upstream relies on built-in defaults (a port's protocol).
        required = set((out.get("items") or {}).get("required", []))
        if not set(out.get("x-kubernetes-list-map-keys", [])) <= required:
            out.pop("x-kubernetes-list-type")
            out.pop("x-kubernetes-list-map-keys", None)
    return out


def generate() -> str:
    """corev1.json: the overlay's PodSpec fields from kubernetes-validate's definitions."""
    import kubernetes_validate

    source = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / f"v{SOURCE_VERSION}-local-strict"
    defs = json.loads((source / "_definitions.json").read_text())["$defs"]
    pod_spec = defs["io.k8s.api.core.v1.PodSpec"]["properties"]
    doc = {
        "source": f"kubernetes-validate {SOURCE_VERSION} io.k8s.api.core.v1.PodSpec (generated by python -m brain_operator.crd)",
        "podSpec": {name: _structural(pod_spec[name], defs, DESCRIBED_LEVELS) for name in CORE_FIELDS},
    }
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


# ---- checking a value against a structural schema ----

_PYTHON_TYPES = {"string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,)}
_WORDS = {"string": "a string", "integer": "an integer", "number": "a number", "boolean": "a boolean"}


def _got(value: Any) -> str:
    return type(value).__name__ if isinstance(value, (dict, list)) else quoted(value)


def schema_errors(value: Any, schema: Mapping[str, Any], path: str) -> Iterator[tuple[str, str]]:
    """(path, message) for each way `value` breaks `schema`, as the API server's strict field validation sees it.

    Unknown fields are errors (kubectl's default, `--validate=strict`); null is an absent value.
    """
    if value is None:
        return
    if schema.get("x-kubernetes-int-or-string"):
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            yield path, f"must be an integer or a string, got {_got(value)}"
        return
    kind = schema.get("type")
    if kind == "object":
        if not isinstance(value, Mapping):
            yield path, f"must be a mapping, got {_got(value)}"
            return
        properties = schema.get("properties")
        if properties is None:
            extra = schema.get("additionalProperties")
            for key, item in value.items():
                if extra is not None:
                    yield from schema_errors(item, extra, f"{path}.{key}")
            return
        for key in value:
            if key not in properties:
                yield f"{path}.{key}", f"unknown field (known fields: {', '.join(properties)})"
        for key in schema.get("required", ()):
            if value.get(key) is None:
                yield f"{path}.{key}", "required field is missing"
        for key, item in value.items():
            if key in properties:
                yield from schema_errors(item, properties[key], f"{path}.{key}")
    elif kind == "array":
        if not isinstance(value, list):
            yield path, f"must be a list, got {_got(value)}"
            return
        for i, item in enumerate(value):
            yield from schema_errors(item, schema.get("items") or {}, f"{path}[{i}]")
    elif kind in _PYTHON_TYPES:
        wrong_bool = isinstance(value, bool) and kind != "boolean"
        if wrong_bool or not isinstance(value, _PYTHON_TYPES[kind]):
            yield path, f"must be {_WORDS[kind]}, got {_got(value)}"
        elif "enum" in schema and value not in schema["enum"]:
            yield path, f"must be one of {', '.join(map(str, schema['enum']))}; got {_got(value)}"
