"""The BrainTrainingJob CustomResourceDefinition and its field reference, generated from the spec model.

`python -m brain_operator.crd` writes deploy/crd/braintrainingjob.yaml, the
chart's copy in charts/brain-operator/crds/ and docs/crd.md; `--check` exits 1
when any of them differs from what the model says.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import yaml

from brain_trainer.schema import key_for, openapi_schema, setting

from .render.common import CONFIG_DIR, CONFIG_PATH
from .render.elastic import RDZV_PORT
from .spec import (
    API_SERVER_RULES,
    DNS_LABEL_MAX,
    GROUP,
    KIND,
    PLURAL,
    RESERVED_ENV_KEYS,
    RESERVED_ENV_PREFIXES,
    SHORT_NAME,
    SINGULAR,
    VERSION,
    JobSpec,
    OperatorDefaults,
)
from .status import CONDITION_TYPES, PHASES

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "deploy" / "crd" / "braintrainingjob.yaml"
# Helm installs CRDs only from the chart's own crds/ folder: the same bytes.
CHART_CRD_PATH = ROOT / "charts" / "brain-operator" / "crds" / "braintrainingjob.yaml"
DOCS_PATH = ROOT / "docs" / "crd.md"


@dataclass
class Condition:
    """One condition of the job (Valid, Running, Restarting, Suspended, Succeeded, Failed)."""

    type: str = setting(choices=CONDITION_TYPES)
    status: str = setting(choices=("True", "False", "Unknown"))
    reason: Optional[str] = setting(None)
    message: Optional[str] = setting(None)
    last_transition_time: Optional[str] = setting(None)


@dataclass
class WorkerCounts:
    """Worker pods by state."""

    desired: int = setting(0, minimum=0)
    ready: int = setting(0, minimum=0)
    running: int = setting(0, minimum=0)
    succeeded: int = setting(0, minimum=0)
    failed: int = setting(0, minimum=0)


@dataclass
class Progress:
    """Rank 0's latest progress report."""

    step: Optional[int] = setting(None, minimum=0)
    total_steps: Optional[int] = setting(None, minimum=0)
    loss: Optional[float] = setting(None)
    tokens_per_second: Optional[float] = setting(None, minimum=0)
    eta_seconds: Optional[int] = setting(None, minimum=0)
    updated_at: Optional[str] = setting(None)


@dataclass
class LastCheckpoint:
    """The newest committed checkpoint."""

    step: int = setting(minimum=0)
    path: str = setting()


@dataclass
class JobStatus:
    """Observed state of a BrainTrainingJob, written by the operator."""

    phase: Optional[str] = setting(None, choices=PHASES)
    conditions: list[Condition] = field(default_factory=list)
    workers: Optional[WorkerCounts] = None
    nodes: Optional[str] = setting(None, help="ready/desired workers, for the Nodes column")
    selector: Optional[str] = setting(None, help="label selector of the worker pods (scale subresource)")
    restarts: int = setting(0, minimum=0, help="worker pods replaced after failures; never decreases")
    strategy: Optional[str] = setting(None, help="the parallelism strategy as resolved")
    effective_batch_size: Optional[int] = setting(None, minimum=1, help="sequences per optimizer step")
    progress: Optional[Progress] = None
    last_checkpoint: Optional[LastCheckpoint] = None
    start_time: Optional[str] = setting(None)
    completion_time: Optional[str] = setting(None)
    observed_generation: Optional[int] = setting(None)


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
    schema["x-kubernetes-validations"] = [{"rule": rule, "message": message} for rule, message in API_SERVER_RULES]
    return schema


def status_schema() -> dict[str, Any]:
    return _with_timestamps(openapi_schema(JobStatus, camel_case=True))


def build_crd() -> dict[str, Any]:
    """The CustomResourceDefinition, ready for `kubectl apply`."""
    columns = [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Nodes", "type": "string", "description": "ready/desired workers", "jsonPath": ".status.nodes"},
        {"name": "Step", "type": "integer", "jsonPath": ".status.progress.step"},
        {"name": "Loss", "type": "number", "jsonPath": ".status.progress.loss"},
        {"name": "Restarts", "type": "integer", "priority": 1, "jsonPath": ".status.restarts"},
        {"name": "Backend", "type": "string", "priority": 1, "jsonPath": ".spec.backend"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
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
                "categories": ["all"],
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
                    "additionalPrinterColumns": columns,
                }
            ],
        },
    }


def crd_yaml() -> str:
    header = "# Generated by `python -m brain_operator.crd` from brain_operator/spec.py: do not edit.\n"
    return header + yaml.safe_dump(build_crd(), sort_keys=False, width=120)


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


def _constraints(f: dataclasses.Field) -> str:
    m = f.metadata
    parts = []
    if m.get("choices"):
        parts.append(" \\| ".join(f"`{c}`" for c in m["choices"]))
    if m.get("minimum") is not None:
        parts.append(f"{'>' if m.get('exclusive_minimum') else '>='} {m['minimum']}")
    if m.get("maximum") is not None:
        parts.append(f"<= {m['maximum']}")
    return ", ".join(parts)


def _rows(cls: type, prefix: str) -> list[str]:
    hints = typing.get_type_hints(cls)
    rows = []
    for f in dataclasses.fields(cls):
        path = f"{prefix}{key_for(f, True)}"
        tp = hints[f.name]
        inner = next((a for a in (tp, *typing.get_args(tp)) if dataclasses.is_dataclass(a)), None)
        help_text = f.metadata.get("help") or ((inner.__doc__ or "").strip().splitlines()[0] if inner else "")
        cells = [f"`{path}`", _type_name(tp), _default_text(f), _constraints(f), help_text.replace("|", "\\|")]
        rows.append("| " + " | ".join(cells) + " |")
        if inner is not None:
            rows.extend(_rows(inner, f"{path}."))
    return rows


_RENDERING = f"""## What a job becomes

For a job `J`, the `elastic` backend (default) creates a headless Service `J-workers`, a ConfigMap
`J-config` holding the resolved `trainer.yaml` (mounted read-only at `{CONFIG_DIR}`), a PVC
`J-checkpoints` when `checkpoint.volumeClaimTemplate` is set, and pods `J-worker-0..nodes-1` running
`torchrun -m brain_trainer --config {CONFIG_PATH}` with c10d rendezvous on `J-worker-0.J-workers:{RDZV_PORT}`.
The `pytorchjob` backend creates the ConfigMap, the PVC and a Kubeflow `kubeflow.org/v1` PyTorchJob instead:
Master + Worker for a fixed size, Workers with an `elasticPolicy` when `elastic.minNodes < elastic.maxNodes`.

Rules across fields: `nodes` lies within `elastic.minNodes..maxNodes` (an unset bound is `nodes`; the API
server enforces this too, so `kubectl scale btj/J --replicas=N` stays in range); `claimName` and
`volumeClaimTemplate` exclude each other, and without either, checkpoints are pod-local scratch that does not
survive a replaced pod; a job that may run on more than one node needs a `ReadWriteMany` template, because
every rank writes its own shard; `globalBatchSize` must divide evenly at every node count in the range;
`nccl.env` may not set {", ".join(RESERVED_ENV_KEYS)} or any `{"*`, `".join(RESERVED_ENV_PREFIXES)}*` variable;
`J-worker-<maxNodes-1>` must fit a {DNS_LABEL_MAX}-character hostname.

Operator-wide defaults for jobs that omit them come from the operator's environment (the Helm chart sets
them): `{OperatorDefaults.ENV_IMAGE}` (image), `{OperatorDefaults.ENV_PULL_POLICY}` (imagePullPolicy) and
`{OperatorDefaults.ENV_NCCL}` (a JSON object of extra NCCL variables; a job's own `nccl.env` keys win).
"""


def docs_markdown() -> str:
    """docs/crd.md: every spec and status field with its type, default, constraints and meaning."""
    head = "| field | type | default | allowed | meaning |\n|---|---|---|---|---|\n"
    return (
        "# BrainTrainingJob field reference\n\n"
        "<!-- Generated by `python -m brain_operator.crd` from brain_operator/spec.py: do not edit. -->\n\n"
        f"`apiVersion: {GROUP}/{VERSION}`, `kind: {KIND}`, short name `{SHORT_NAME}`, namespaced. "
        "The API server checks types, enums and bounds from the CRD schema; `braintrain validate` and the "
        "operator also check the rules across fields (elastic range, reserved environment keys, name length, "
        "storage access modes, batch divisibility) and name the field in every error.\n\n"
        f"{_RENDERING}\n"
        "## spec\n\n" + head + "\n".join(_rows(JobSpec, "spec.")) + "\n\n"
        "## status\n\nWritten by the operator.\n\n" + head + "\n".join(_rows(JobStatus, "status.")) + "\n"
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m brain_operator.crd", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed files are stale")
    args = parser.parse_args(argv)
    crd = crd_yaml()
    outputs = {CRD_PATH: crd, CHART_CRD_PATH: crd, DOCS_PATH: docs_markdown()}
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
