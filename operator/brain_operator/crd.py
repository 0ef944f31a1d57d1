"""The BrainTrainingJob CustomResourceDefinition and its field reference, generated from the spec model.

`python -m brain_operator.crd` writes deploy/crd/braintrainingjob.yaml, the
chart's copy in charts/brain-operator/crds/, docs/crd.md and the core/v1
schemas the pod overlay is typed with (spec/corev1.json, from
kubernetes-validate); `--check` exits 1 when any of them differs from what the
model says.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from dataclasses import MISSING
from pathlib import Path
from typing import Any, Optional, Sequence

from brain_trainer.config import kubeyaml
from brain_trainer.schema import in_view, is_bool_or_string, key_for, openapi_schema

from .status.job_status import JobStatus
from .backends.shared.workers import CONFIG_DIR, CONFIG_PATH, RDZV_PORT
from .spec import (
    API_SERVER_RULES,
    GROUP,
    KIND,
    PLURAL,
    RESERVED_ENV_KEYS,
    RESERVED_ENV_PREFIXES,
    SHORT_NAME,
    TRANSITION_RULES,
    SINGULAR,
    VERSION,
    JobSpec,
    OperatorDefaults,
)
from .spec import corev1
from .spec.edits import immutable_fields, propagated_fields
from .spec.kube import DNS_LABEL_MAX

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "deploy" / "crd" / "braintrainingjob.yaml"
# Helm installs CRDs only from the chart's own crds/ folder: the same bytes.
CHART_CRD_PATH = ROOT / "charts" / "brain-operator" / "crds" / "braintrainingjob.yaml"
DOCS_PATH = ROOT / "docs" / "crd.md"


_TIMESTAMP_FIELDS = ("lastTransitionTime", "updatedAt", "startTime", "completionTime")


def _with_timestamps(schema: dict[str, Any]) -> dict[str, Any]:
    """RFC 3339 timestamps get `format: date-time` (the API server then checks them)."""
    for key, prop in schema.get("properties", {}).items():
        if key in _TIMESTAMP_FIELDS:
            prop["format"] = "date-time"
        _with_timestamps(prop)
        _with_timestamps(prop.get("items", {}))
    return schema


def spec_schema() -> dict[str, Any]:
    schema = openapi_schema(JobSpec, camel_case=True)
    schema["x-kubernetes-validations"] = [
        {"rule": rule, "message": message} for rule, message in (*API_SERVER_RULES, *TRANSITION_RULES)
    ]
    return schema


def status_schema() -> dict[str, Any]:
    return _with_timestamps(openapi_schema(JobStatus, camel_case=True))


# What `kubectl get braintrainingjobs` shows (`-o wide` adds those of priority 1).
PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Nodes", "type": "string", "description": "ready/desired workers", "jsonPath": ".status.nodes"},
    {"name": "Step", "type": "integer", "jsonPath": ".status.progress.step"},
    {"name": "Loss", "type": "number", "jsonPath": ".status.progress.loss"},
    {"name": "EvalLoss", "type": "number", "priority": 1, "jsonPath": ".status.progress.evalLoss"},
    {"name": "Restarts", "type": "integer", "priority": 1, "jsonPath": ".status.restarts"},
    {"name": "Goodput", "type": "number", "priority": 1, "description": "productive over wall time",
     "jsonPath": ".status.goodput.ratio"},
    {"name": "Reason", "type": "string", "priority": 1, "description": "why workers wait, or why the latest failed",
     "jsonPath": ".status.reason"},
    {"name": "Backend", "type": "string", "priority": 1, "jsonPath": ".spec.backend"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def build_crd() -> dict[str, Any]:
    """The CustomResourceDefinition, ready for `kubectl apply`."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": [SHORT_NAME],
                "categories": ["all", "brain"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "description": "A distributed PyTorch training job of the BrainAI model family.",
                            "type": "object",
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema(),
                                "status": status_schema(),
                            },
                            "required": ["spec"],
                        }
                    },
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.nodes",
                            "statusReplicasPath": ".status.workers.running",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


def crd_yaml() -> str:
    header = "# Generated by `python -m brain_operator.crd` from brain_operator/spec/ and brain_trainer/config/: do not edit.\n"
    return header + kubeyaml.dump(build_crd(), width=120)


# ---- field reference (docs/crd.md) ----


def _type_name(tp: Any) -> str:
    tp_args = [a for a in typing.get_args(tp) if a is not type(None)]
    origin = typing.get_origin(tp)
    if origin is list:
        return f"list of {_type_name(tp_args[0])}"
    if origin is dict:
        return "map" if tp_args[1] is Any else f"map of {_type_name(tp_args[1])}"
    if tp_args and set(tp_args) == {int, str}:
        return "int or string"
    if tp_args and set(tp_args) == {bool, str}:
        return "boolean or string"
    if tp_args and len(tp_args) == 1:
        return _type_name(tp_args[0])
    if dataclasses.is_dataclass(tp):
        return "object"
    return {int: "integer", float: "number", str: "string", bool: "boolean"}.get(tp, str(tp))


def _yaml_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_yaml_text(v) for v in value) + "]"
    return str(value)


def _default_text(f: dataclasses.Field) -> str:
    """A plain default as YAML would show it; nothing for None, empty containers and nested objects."""
    if f.default is not MISSING:
        value = f.default
    elif f.default_factory is not MISSING and not dataclasses.is_dataclass(f.default_factory):
        value = f.default_factory()
    else:
        return ""
    return "" if value is None or value in ([], {}) else f"`{_yaml_text(value)}`"


def _constraints(f: dataclasses.Field, tp: Any) -> str:
    m = f.metadata
    parts = []
    if m.get("choices"):
        words = (True, False, *m["choices"]) if is_bool_or_string(tp) else m["choices"]
        parts.append(" \\| ".join(f"`{_yaml_text(c)}`" for c in words))
    if m.get("minimum") is not None:
        parts.append(f"{'>' if m.get('exclusive_minimum') else '>='} {m['minimum']}")
    if m.get("maximum") is not None:
        parts.append(f"<= {m['maximum']}")
    return ", ".join(parts)


def _rows(cls: type, prefix: str) -> list[str]:
    hints = typing.get_type_hints(cls)
    rows = []
    for f in dataclasses.fields(cls):
        if not in_view(f, True):
            continue
        path = f"{prefix}{key_for(f, True)}"
        tp = hints[f.name]
        inner = next((a for a in (tp, *typing.get_args(tp)) if dataclasses.is_dataclass(a)), None)
        core = f.metadata.get("schema")
        help_text = (
            f.metadata.get("help")
            or (core.get("description", "").split(". ")[0] if core else "")
            or ((inner.__doc__ or "").strip().splitlines()[0] if inner else "")
        )
        type_text = corev1.CORE_FIELDS[key_for(f, True)] if core else _type_name(tp)
        cells = [f"`{path}`", type_text, _default_text(f), _constraints(f, tp), " ".join(help_text.split()).replace("|", "\\|")]
        rows.append("| " + " | ".join(cells) + " |")
        if inner is not None:
            rows.extend(_rows(inner, f"{path}."))
    return rows


_RENDERING = f"""## What a job becomes

For a job `J`, the `elastic` backend (default) creates a headless Service `J-workers`, a ConfigMap
`J-config` holding the resolved `trainer.yaml` (mounted read-only at `{CONFIG_DIR}`), a PVC
`J-checkpoints` when `checkpoint.volumeClaimTemplate` is set, a PodGroup `J` when `scheduling.gang` names a
gang scheduler, and pods `J-worker-0..nodes-1` running torchrun's quiet agent under `tini` as PID 1
(`tini -- python -m brain_trainer.agent -m brain_trainer --config {CONFIG_PATH}`) with c10d rendezvous on
`J-worker-0.J-workers:{RDZV_PORT}`.
The `pytorchjob` backend creates the ConfigMap, the PVC and a Kubeflow `kubeflow.org/v1` PyTorchJob instead:
Master + Worker for a fixed size, Workers with an `elasticPolicy` when `elastic.minNodes < elastic.maxNodes`.
Every child but the checkpoint PVC is owned by the job; the PVC is too only with
`checkpoint.reclaimPolicy: Delete` (by default it is kept, labelled `brain.ai/job-name=J`, and a new job named
`J` resumes from it). `podTemplate` adds labels, annotations and Kubernetes PodSpec fields to every worker pod
on both backends; what the operator sets itself is refused, naming the field.

Rules across fields: `nodes` lies within `elastic.minNodes..maxNodes` (an unset bound is `nodes`; the API
server enforces this too, so `kubectl scale btj/J --replicas=N` stays in range); `claimName` and
`volumeClaimTemplate` exclude each other, and without either, checkpoints are pod-local scratch that does not
survive a replaced pod; a job that may run on more than one node needs a `ReadWriteMany` template, because
every rank writes its own shard; `globalBatchSize` must divide evenly at every node count in the range;
`nccl.env` may not set {", ".join(RESERVED_ENV_KEYS)} or any `{"*`, `".join(RESERVED_ENV_PREFIXES)}*` variable;
`J-worker-<maxNodes-1>` must fit a {DNS_LABEL_MAX}-character hostname.

Operator-wide defaults for jobs that omit them come from the operator's environment (the Helm chart sets
them): `{OperatorDefaults.ENV_IMAGE}` (image), `{OperatorDefaults.ENV_PULL_POLICY}` (imagePullPolicy),
`{OperatorDefaults.ENV_PULL_SECRETS}` (a JSON list of `{{name: ...}}`) and `{OperatorDefaults.ENV_NCCL}` (a JSON
object of extra NCCL variables; a job's own `nccl.env` keys win). The operator's settings that bound a job come
from there too: `{OperatorDefaults.ENV_OVERLAY_POLICY}` (the chart's `podOverlayPolicy`, what `podTemplate` may
ask for; docs/security.md), `{OperatorDefaults.ENV_NETWORK_POLICY}` (`false`: no NetworkPolicy per job),
`{OperatorDefaults.ENV_NAMESPACE}` and `{OperatorDefaults.ENV_SCRAPE_NAMESPACES}` (who may reach the metrics port).
"""


def _edits_markdown() -> str:
    immutable = ", ".join(f"`spec.{'.'.join(keys)}`" for keys, _ in immutable_fields())
    propagated = ", ".join(f"`{path}`" for path in propagated_fields())
    return (
        "## Changing a running job\n\n"
        f"Propagated while the job runs: {propagated}. `nodes` and `runPolicy` act at the next reconcile; the "
        "trainer settings are patched into `J-config`, and each worker pod started afterwards carries the new "
        "`brain.ai/config-hash` and reads them (so does a worker group torchrun restarts inside a pod).\n\n"
        f"Immutable (the API server refuses the edit, naming the field): {immutable}. Writing out a field's "
        "default is not a change.\n"
    )


def docs_markdown() -> str:
    """docs/crd.md: every spec and status field with its type, default, constraints and meaning."""
    head = "| field | type | default | allowed | meaning |\n|---|---|---|---|---|\n"
    return (
        "# BrainTrainingJob field reference\n\n"
        "<!-- Generated by `python -m brain_operator.crd` from brain_operator/spec/ and brain_trainer/config/: do not edit. -->\n\n"
        f"`apiVersion: {GROUP}/{VERSION}`, `kind: {KIND}`, short name `{SHORT_NAME}`, namespaced. "
        "The API server checks types, enums and bounds from the CRD schema; `braintrain validate` and the "
        "operator also check the rules across fields (elastic range, reserved environment keys, name length, "
        "storage access modes, batch divisibility) and name the field in every error.\n\n"
        f"{_RENDERING}\n" + _edits_markdown() + "\n"
        "## spec\n\n" + head + "\n".join(_rows(JobSpec, "spec.")) + "\n\n"
        "## status\n\nWritten by the operator.\n\n" + head + "\n".join(_rows(JobStatus, "status.")) + "\n"
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m brain_operator.crd", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed files are stale")
    args = parser.parse_args(argv)
    crd = crd_yaml()
    outputs = {corev1.SCHEMA_FILE: corev1.generate(), CRD_PATH: crd, CHART_CRD_PATH: crd, DOCS_PATH: docs_markdown()}
    if args.check:
        stale = [p for p, text in outputs.items() if not p.exists() or p.read_text() != text]
        for path in stale:
            print(f"{path.relative_to(ROOT)} is stale: run python -m brain_operator.crd", file=sys.stderr)
        return 1 if stale else 0
    for path, text in outputs.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
