"""`training.compile: auto | true | false` (issue 27, point 6): auto compiles on CUDA and not on CPU; a compile
that fails trains eager with one warning line; manifests and trainer.yaml take the three values (YAML booleans as
kubectl reads them) and refuse anything else naming the field."""

from __future__ import annotations

import logging
import sys

import pytest
import torch

from brain_operator import crd
from brain_operator.spec import ConfigError, parse_job
from brain_operator.spec.derive import trainer_config
from brain_operator.spec.edits import propagated_fields, transition_rules
from brain_trainer.config import TrainerConfig, kubeyaml
from brain_trainer.config.presets import preset_config
from brain_trainer.loop.train import train
from brain_trainer.model.brain_ai import BrainAI
from brain_trainer.parallel.blocks import block_names
from test_blocks import SMALL, STEPS, losses  # the plain model's losses, and with blocks checkpointed or compiled



@pytest.mark.parametrize(("value", "on_cuda", "on_cpu"), [("auto", True, False), (True, True, True), (False, False, False)])
def test_auto_compiles_on_cuda_only_and_true_or_false_everywhere(value, on_cuda, on_cpu):
    training = TrainerConfig.from_dict({"training": {"compile": value}}).training
    assert (training.compiles("cuda"), training.compiles("cpu")) == (on_cuda, on_cpu)


def test_auto_is_the_default():
    assert TrainerConfig().training.compile == "auto"


def manifest(compile_text: str) -> dict:
    return kubeyaml.load(f"""
apiVersion: brain.ai/v1alpha1
kind: BrainTrainingJob
metadata: {{name: c}}
spec:
  image: trainer:1
  training: {{compile: {compile_text}}}
""")


@pytest.mark.parametrize(("text", "value"), [("auto", "auto"), ("true", True), ("false", False), ("on", True), ("no", False)])
def test_a_manifest_takes_auto_and_yaml_booleans_and_trainer_yaml_gets_the_same(text, value):
    job = parse_job(manifest(text))
    assert job.spec.training.compile == value
    assert TrainerConfig.from_dict(kubeyaml.load(trainer_config(job).to_yaml())).training.compile == value


@pytest.mark.parametrize(("text", "complaint"), [
    ("maybe", "spec.training.compile: must be true, false or auto; got 'maybe'"),
    ('"true"', "spec.training.compile: must be true, false or auto; got 'true' (unquoted: a YAML boolean)"),
    ("2", "spec.training.compile: must be a boolean or a string, got 2"),
    ("[auto]", "spec.training.compile: must be a boolean or a string, got ['auto']"),
])
def test_anything_else_is_refused_naming_the_field_and_the_value(text, complaint):
    with pytest.raises(ConfigError) as caught:
        parse_job(manifest(text))
    assert [str(e) for e in caught.value.errors] == [complaint]


def test_the_crd_takes_any_value_there_and_no_cel_rule_reads_it():
    # A structural schema has no boolean-or-string type, and CEL cannot read a field without a type: the parser
    # refuses the other values; an edit in flight reaches the workers started afterwards.
    schema = crd.spec_schema()["properties"]["training"]["properties"]["compile"]
    assert schema["x-kubernetes-preserve-unknown-fields"] is True and "type" not in schema and "enum" not in schema
    assert not any("compile" in rule for rule, _ in transition_rules())
    assert "spec.training.compile" in propagated_fields()


# -- a compile that fails --


def failing_backend(graph_module, example_inputs):
    raise RuntimeError("no C++ compiler on this machine")


def test_a_compile_that_fails_trains_eager_with_one_warning_line(caplog):
    torch._dynamo.reset()
    plain = losses("none")
    with caplog.at_level(logging.WARNING, logger="brain_trainer.parallel.blocks"):
        fell_back = losses("none", backend=failing_backend)
    assert fell_back == plain, "every block back on its eager forward: the plain model's losses, bitwise"
    (warning,) = [r.getMessage() for r in caplog.records]
    first_block = block_names(BrainAI(preset_config("minimal", **SMALL)))[0]
    assert warning == (f"torch.compile failed in {first_block} (RuntimeError: no C++ compiler on this machine): "
                       "every block trains eager")


def test_training_with_compile_true_on_cpu_falls_back_and_finishes(tmp_path, monkeypatch, caplog):
    torch._dynamo.reset()
    monkeypatch.setattr(sys.modules["brain_trainer.loop.wrap"], "COMPILE_BACKEND", failing_backend)
    cfg = TrainerConfig.from_dict({
        "model": {"preset": "minimal"},
        "training": {"steps": STEPS, "micro_batch_size": 2, "seq_len": 16, "warmup_steps": 0, "log_interval": 1,
                     "compile": True},
        "distributed": {"strategy": "single"},
        "data": {"source": "synthetic", "num_samples": 64},
        "checkpoint": {"dir": str(tmp_path), "interval_steps": 0},
        "metrics": {"port": 0},
    })
    with caplog.at_level(logging.WARNING, logger="brain_trainer.parallel.blocks"):
        result = train(cfg)
    assert result.step == STEPS
    assert len([r for r in caplog.records if r.getMessage().startswith("torch.compile failed in ")]) == 1
