"""The generated CRD: committed copy in sync, structural, valid for the API server, scale and columns wired."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone
from pathlib import Path

import celpy
import jsonschema
import kubernetes_validate
import pytest
import yaml

from brain_operator import crd
from brain_operator.status.job_status import JobStatus
from brain_operator.status.progress import progress_status
from brain_operator.spec import API_SERVER_RULES, TRANSITION_RULES, ConfigError, parse_job
from brain_operator.spec.edits import immutable_fields, propagated_fields

ROOT = Path(__file__).resolve().parents[2]
GENERATED = crd.build_crd()
VERSION = GENERATED["spec"]["versions"][0]
SCHEMA = VERSION["schema"]["openAPIV3Schema"]


def test_committed_crd_is_current():
    committed = (ROOT / "deploy" / "crd" / "braintrainingjob.yaml").read_text()
    assert committed == crd.crd_yaml(), "stale: run python -m brain_operator.crd"
    assert yaml.safe_load(committed) == GENERATED


def test_committed_docs_are_current():
    assert (ROOT / "docs" / "crd.md").read_text() == crd.docs_markdown(), "stale: run python -m brain_operator.crd"


def test_check_mode_detects_drift(tmp_path, monkeypatch, capsys):
    assert crd.main(["--check"]) == 0
    stale = tmp_path / "crd.yaml"
    stale.write_text(crd.crd_yaml().replace("btj", "bt"))
    monkeypatch.setattr(crd, "CRD_PATH", stale)
    monkeypatch.setattr(crd, "ROOT", tmp_path)
    monkeypatch.setattr(crd, "DOCS_PATH", tmp_path / "docs" / "crd.md")
    monkeypatch.setattr(crd, "CHART_CRD_PATH", tmp_path / "chart" / "crd.yaml")
    monkeypatch.setattr(crd.corev1, "SCHEMA_FILE", tmp_path / "corev1.json")
    assert crd.main(["--check"]) == 1
    assert "crd.yaml is stale" in capsys.readouterr().err
    assert crd.main([]) == 0
    assert stale.read_text() == crd.crd_yaml() and crd.main(["--check"]) == 0


@pytest.mark.parametrize("version", ["1.29", "1.37"])
def test_crd_is_a_valid_custom_resource_definition(version):
    assert kubernetes_validate.validate(GENERATED, version, strict=True) == version


def test_identity():
    spec = GENERATED["spec"]
    assert GENERATED["metadata"]["name"] == "braintrainingjobs.brain.ai"
    assert (spec["group"], spec["scope"], VERSION["name"]) == ("brain.ai", "Namespaced", "v1alpha1")
    assert spec["names"]["kind"] == "BrainTrainingJob" and spec["names"]["shortNames"] == ["btj"]
    assert VERSION["served"] and VERSION["storage"]


def _walk(schema, path="$"):
    yield path, schema
    for key, prop in schema.get("properties", {}).items():
        yield from _walk(prop, f"{path}.{key}")
    if isinstance(schema.get("items"), dict):
        yield from _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _walk(schema["additionalProperties"], f"{path}{{}}")


def test_schema_is_structural():
    for path, node in _walk(SCHEMA):
        typed = "type" in node or node.get("x-kubernetes-int-or-string") or node.get("x-kubernetes-preserve-unknown-fields")
        assert typed, f"{path} has no type"
        assert not ("properties" in node and "additionalProperties" in node), path
        for branch in node.get("anyOf", []):
            # Structural schemas allow only value validations under anyOf.
            assert set(branch) <= {"type"} and node.get("x-kubernetes-int-or-string"), path
        if "pattern" in node:
            assert node["pattern"].startswith("^") and node["pattern"].endswith("$"), path


def _at(path):
    node = SCHEMA
    for part in path.strip(".").split("."):
        node = node["properties"][part]
    return node


def test_constraints_come_from_the_spec_model():
    assert _at(".spec.backend")["enum"] == ["elastic", "pytorchjob"]
    assert _at(".spec.nodes") == {"description": "worker pods", "type": "integer", "minimum": 1}
    assert _at(".spec.model.preset")["enum"] == ["minimal", "1b", "3b", "7b", "13b", "70b"]
    assert _at(".spec.training.learningRate")["exclusiveMinimum"] is True
    assert _at(".spec.checkpoint").get("properties", {}).get("async", {}).get("type") == "boolean"
    assert _at(".spec.resources.limits")["additionalProperties"]["x-kubernetes-int-or-string"] is True
    assert "image" not in SCHEMA["properties"]["spec"].get("required", [])
    assert _at(".status.conditions")["items"]["required"] == ["type", "status"]
    assert _at(".status.startTime")["format"] == "date-time"


def test_subresources_point_at_real_fields():
    sub = VERSION["subresources"]
    assert sub["status"] == {}
    scale = sub["scale"]
    assert scale["specReplicasPath"] == ".spec.nodes" and _at(".spec.nodes")["type"] == "integer"
    assert _at(scale["statusReplicasPath"])["type"] == "integer"
    assert _at(scale["labelSelectorPath"])["type"] == "string"


def test_printer_columns():
    columns = {c["name"]: c for c in VERSION["additionalPrinterColumns"]}
    assert [c["name"] for c in VERSION["additionalPrinterColumns"] if not c.get("priority")] == ["Phase", "Nodes", "Step", "Loss", "Age"]
    assert columns["Age"]["jsonPath"] == ".metadata.creationTimestamp"
    assert (columns["EvalLoss"]["jsonPath"], columns["EvalLoss"]["priority"]) == (".status.progress.evalLoss", 1)
    # kubectl get btj -o wide
    assert [c["name"] for c in VERSION["additionalPrinterColumns"] if c.get("priority")] == ["EvalLoss", "Restarts", "Goodput", "Reason", "Backend"]
    assert columns["Goodput"]["jsonPath"] == ".status.goodput.ratio"
    for name, column in columns.items():
        if name != "Age":
            assert _at(column["jsonPath"])["type"] == column["type"], name


def test_status_schema_accepts_what_the_operator_writes():
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    counted = JobStatus.read({
        "phase": "Running",
        "conditions": [{"type": "Running", "status": "True", "reason": "WorkersRunning", "message": "", "lastTransitionTime": "2026-01-02T03:04:05Z"}],
        "workers": {"desired": 3, "ready": 3, "running": 3, "succeeded": 0, "failed": 0},
        "nodes": "3/3",
        "selector": "brain.ai/job-name=llm",
        "restarts": 1,
        "strategy": "fsdp",
        "effectiveBatchSize": 256,
        "startTime": "2026-01-02T03:00:00Z",
        "observedGeneration": 4,
    })
    status = progress_status(
        {"step": 120, "total_steps": 1000, "loss": 2.5, "tokens_per_second": 1e5, "eta_seconds": 600, "last_checkpoint_step": 100,
         "eval_loss": 2.75},
        counted,
        now=now,
        root="/ckpt",
    ).to_dict()
    assert status["restarts"] == 1 and status["progress"]["step"] == 120 and status["lastCheckpoint"]["step"] == 100
    validator = jsonschema.Draft4Validator(SCHEMA["properties"]["status"])
    validator.validate(status)
    # Structural schemas prune unknown fields: every key written must be declared.
    for key, value in status.items():
        assert key in SCHEMA["properties"]["status"]["properties"], key
        if isinstance(value, dict):
            assert set(value) <= set(_at(f".status.{key}")["properties"]), key
    with pytest.raises(jsonschema.ValidationError):
        validator.validate({**status, "phase": "Exploded"})


# ---- CEL rules: the API server enforces the elastic bounds, so `kubectl scale` cannot leave the range ----

_CEL = celpy.Environment()
_PROGRAMS = [(_CEL.program(_CEL.compile(rule)), message) for rule, message in API_SERVER_RULES]


def cel_errors(spec):
    return [message for program, message in _PROGRAMS if not program.evaluate({"self": celpy.json_to_cel(spec)})]


def test_rules_are_on_the_spec_schema():
    rules = [(r["rule"], r["message"]) for r in SCHEMA["properties"]["spec"]["x-kubernetes-validations"]]
    assert rules == [*API_SERVER_RULES, *TRANSITION_RULES]


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"nodes": 3},
        {"nodes": 3, "elastic": {"minNodes": 2, "maxNodes": 4}},
        {"nodes": 2, "elastic": {"minNodes": 2}},
        {"nodes": 4, "elastic": {"maxNodes": 4}},
        {"elastic": {"maxRestarts": 2}},
        {"nodes": 5, "elastic": {"minNodes": 2, "maxNodes": 4}},
        {"nodes": 1, "elastic": {"minNodes": 2}},
        {"nodes": 3, "elastic": {"minNodes": 4, "maxNodes": 2}},
        {"elastic": {"minNodes": 2}},
    ],
)
def test_cel_rules_agree_with_the_parser(spec):
    manifest = {"apiVersion": "brain.ai/v1alpha1", "kind": "BrainTrainingJob", "metadata": {"name": "j"}, "spec": {"image": "i", **spec}}
    try:
        parse_job(manifest)
        parser_ok = True
    except ConfigError:
        parser_ok = False
    assert (not cel_errors(spec)) == parser_ok


def test_examples_pass_the_cel_rules():
    for path in sorted((ROOT / "deploy" / "examples").glob("*.yaml")):
        assert cel_errors(yaml.safe_load(path.read_text())["spec"]) == [], path.name


# ---- transition rules: fields that cannot change in flight (spec/edits.py) ----

_TRANSITIONS = [(_CEL.program(_CEL.compile(rule)), message) for rule, message in TRANSITION_RULES]
# A changed value for each immutable section (scalars get one from their type and default).
SECTION_CHANGES = {
    "model": {"preset": "1b"},
    "distributed": {"strategy": "ddp"},
    "data": {"numWorkers": 2},
    "elastic": {"maxRestarts": 5},
    "resources": {"limits": {"cpu": 2}},
    "checkpoint.volumeClaimTemplate": {"storage": "1Gi"},
    "nccl": {"debug": "INFO"},
    "scheduling": {"queueName": "q"},
    "podTemplate": {"metadata": {"labels": {"team": "a"}}},
}


def transition_errors(old, new):
    return [
        message for program, message in _TRANSITIONS
        if not program.evaluate({"self": celpy.json_to_cel(new), "oldSelf": celpy.json_to_cel(old)})
    ]


def _changed(keys, f):
    path = ".".join(keys)
    if path in SECTION_CHANGES:
        return SECTION_CHANGES[path]
    default = None if f.default is dataclasses.MISSING else f.default
    if f.metadata.get("choices"):
        return next(c for c in f.metadata["choices"] if c != default)
    if isinstance(default, bool):
        return not default
    if isinstance(default, (int, float)):
        return default * 2 + 1
    return 8 if "Size" in path else "other"


def _nested(keys, value):
    out = value
    for key in reversed(keys):
        out = {key: out}
    return out


IMMUTABLE = [(keys, _changed(keys, f)) for keys, f in immutable_fields()]


@pytest.mark.parametrize(("keys", "value"), IMMUTABLE, ids=[".".join(k) for k, _ in IMMUTABLE])
def test_each_immutable_field_is_refused_by_its_own_rule_naming_it(keys, value):
    spec = _nested(keys, value)
    expected = [f"spec.{'.'.join(keys)} cannot change while the job exists: delete the job and create it again "
                "(a retained checkpoint claim resumes it)"]
    assert transition_errors({}, spec) == expected  # set where it was not
    assert transition_errors(spec, {}) == expected  # removed
    assert transition_errors(spec, spec) == []


def test_propagated_fields_and_written_out_defaults_pass_every_rule():
    assert propagated_fields() == [
        "spec.nodes", "spec.runPolicy", "spec.training.steps", "spec.training.logInterval", "spec.training.compile",
        "spec.checkpoint.intervalSteps", "spec.checkpoint.keepLast",
    ]
    old = {"image": "i", "nodes": 2, "training": {"steps": 100, "microBatchSize": 4}, "checkpoint": {"claimName": "c"}}
    new = {
        "image": "i", "nodes": 3, "runPolicy": {"suspend": True, "backoffLimit": 9, "activeDeadlineSeconds": 60},
        "training": {"steps": 500, "logInterval": 1, "microBatchSize": 4},
        "checkpoint": {"claimName": "c", "intervalSteps": 10, "keepLast": 1},
    }
    assert transition_errors(old, new) == []
    defaults = {**old, "backend": "elastic", "training": {**old["training"], "seqLen": 128, "learningRate": 0.0003},
                "checkpoint": {**old["checkpoint"], "async": True, "reclaimPolicy": "Retain"}}
    assert transition_errors(old, defaults) == []
    assert transition_errors(old, {**old, "training": {"steps": 100, "microBatchSize": 8}}) == [
        "spec.training.microBatchSize cannot change while the job exists: delete the job and create it again "
        "(a retained checkpoint claim resumes it)"
    ]


def test_resume_from_is_immutable_as_a_step_or_a_word_and_its_default_is_no_change():
    def job(**checkpoint):
        return {"image": "i", "checkpoint": {"claimName": "c", **checkpoint}}

    refused = ["spec.checkpoint.resumeFrom cannot change while the job exists: delete the job and create it again "
               "(a retained checkpoint claim resumes it)"]
    assert transition_errors(job(), job(resumeFrom="latest")) == []
    assert transition_errors(job(), job(resumeFrom=40)) == refused
    assert transition_errors(job(resumeFrom=40), job(resumeFrom="none")) == refused
    assert transition_errors(job(resumeFrom=40), job(resumeFrom=40)) == []
    assert transition_errors(job(resumeFrom=40), job(resumeFrom="40")) == []  # the same step, quoted
    assert cel_errors(job(resumeFrom=40)) == [] and cel_errors(job(resumeFrom="none")) == []
