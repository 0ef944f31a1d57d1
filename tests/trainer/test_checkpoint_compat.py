"""Incompatible checkpoints are configuration errors (issue 23, point 2).

One process, real saves and restores: `train` (strategy single) writes a checkpoint, then a run with
another model setting resumes from it and fails at once with a CheckpointError (a ConfigError:
config-error, exit 2, one line per rank, no traceback) naming the setting and the first tensor; a
setting that may change on resume (training.steps, training.learning_rate) is named in a warning and
the run resumes. The preset case uses CheckpointManager with tiny stand-in models: every other preset
has a billion parameters, too many to build here.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from brain_trainer.checkpoint import CheckpointError, CheckpointManager, TrainState, store
from brain_trainer.checkpoint.compat import changes, first_difference, recorded
from brain_trainer.config import CheckpointConfig, TrainerConfig
from brain_trainer.contract import CONFIG_ERROR, CONFIG_ERROR_REASON, EXIT_CODES
from brain_trainer.loop.train import train
from brain_trainer.model.init_from import manifest_fields
from brain_trainer.resilience.failures import classify

STEPS = 2
FAST_S = 10  # a mismatch fails before any load: well within this


def job(root: Path, model: dict[str, Any] | None = None, **training: Any) -> TrainerConfig:
    return TrainerConfig.from_dict({
        "model": model or {"preset": "minimal"},
        "training": {"steps": STEPS, "micro_batch_size": 2, "seq_len": 16, "warmup_steps": 0, "log_interval": 1,
                     **training},
        "distributed": {"strategy": "single"},
        "data": {"source": "synthetic", "num_samples": 64},
        "checkpoint": {"dir": str(root), "interval_steps": 0},
        "metrics": {"port": 0},
    })


def refused(cfg: TrainerConfig) -> CheckpointError:
    began = time.monotonic()
    with pytest.raises(CheckpointError) as caught:
        train(cfg)
    assert time.monotonic() - began < FAST_S
    reason, line = classify(caught.value)
    assert (reason, EXIT_CODES[reason]) == (CONFIG_ERROR_REASON, CONFIG_ERROR) and line == str(caught.value)
    return caught.value


def test_another_vocabulary_fails_naming_model_vocab_size_and_the_first_tensor(tmp_path):
    train(job(tmp_path))
    error = refused(job(tmp_path, {"preset": "minimal", "vocab_size": 512}))
    assert str(error) == (f"model.vocab_size: 512 here, unset in step-{STEPS:08d} "
                          "(encoders.embed.weight [512, 64] here, [256, 64] there)")
    assert [c.step for c in store.list_checkpoints(tmp_path)] == [STEPS], "the checkpoint stays as it was"


def test_another_entrypoint_fails_naming_model_entrypoint(tmp_path):
    train(job(tmp_path))
    error = refused(job(tmp_path, {"entrypoint": "user_models:small_lm"}))
    assert str(error).startswith(f"model.entrypoint: user_models:small_lm here, unset in step-{STEPS:08d} (")
    assert str(error).endswith(" here, absent there)"), "the first tensor of the user's model is not in it"


def test_a_resumable_change_warns_naming_each_field_and_resumes(tmp_path, caplog):
    train(job(tmp_path))
    with caplog.at_level(logging.WARNING, logger="brain_trainer.checkpoint"):
        result = train(job(tmp_path, steps=STEPS + 1, learning_rate=1e-3))
    assert result.step == STEPS + 1
    (warning,) = [r.getMessage() for r in caplog.records if "changed settings" in r.getMessage()]
    assert warning == (f"resuming step-{STEPS:08d} with changed settings: training.steps: {STEPS + 1} here, "
                       f"{STEPS} there; training.learning_rate: 0.001 here, 0.0003 there")


# -- the preset: CheckpointManager with tiny stand-ins for two presets' models --


def save_and_restore(root: Path, saved: tuple[TrainerConfig, nn.Module], resumed: tuple[TrainerConfig, nn.Module]):
    for step, (cfg, model) in enumerate((saved, resumed)):
        state = TrainState(model, torch.optim.AdamW(model.parameters()))
        ckpt = CheckpointManager(CheckpointConfig(dir=str(root), interval_steps=0, async_save=False), rank=0,
                                 world_size=1, config_hash=cfg.config_hash(), manifest_fields=manifest_fields(cfg, None))
        try:
            ckpt.restore(state)
            state.step = step + 1
            ckpt.finish(state)
        finally:
            ckpt.close(wait=False)


def test_another_preset_fails_naming_model_preset(tmp_path):
    minimal, big = job(tmp_path), job(tmp_path, {"preset": "1b"}, seq_len=16)
    with pytest.raises(CheckpointError) as caught:
        save_and_restore(tmp_path, (minimal, nn.Linear(4, 8)), (big, nn.Linear(4, 16)))
    assert str(caught.value) == "model.preset: 1b here, minimal in step-00000001 (weight [16, 4] here, [8, 4] there)"


def test_a_model_whose_code_changed_fails_naming_the_model(tmp_path):
    cfg = job(tmp_path)
    with pytest.raises(CheckpointError) as caught:
        save_and_restore(tmp_path, (cfg, nn.Linear(4, 8)), (cfg, nn.Linear(4, 8, bias=False)))
    assert str(caught.value) == "model: the model built here does not fit step-00000001 (bias absent here, [8] there)"


def test_tensors_that_fit_but_an_optimizer_state_that_does_not_name_the_checkpoint(tmp_path):
    model = nn.Linear(4, 8)
    state = TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))
    ckpt = CheckpointManager(CheckpointConfig(dir=str(tmp_path), interval_steps=0, async_save=False), rank=0,
                             world_size=1, config_hash="h")
    state.step = 1
    ckpt.finish(state)
    model = nn.Linear(4, 8)
    model(torch.ones(1, 4)).sum().backward()
    adamw = torch.optim.AdamW(model.parameters())
    adamw.step()  # AdamW's state (step, moments) that the SGD checkpoint lacks
    ckpt = CheckpointManager(CheckpointConfig(dir=str(tmp_path), interval_steps=0), rank=0, world_size=1,
                             config_hash="h")
    with pytest.raises(CheckpointError) as caught:
        ckpt.restore(TrainState(model, adamw))
    ckpt.close()
    assert str(caught.value).startswith("checkpoint.dir: step-00000001 does not load into this model/optimizer: "
                                        "RuntimeError: Missing key in checkpoint state_dict: optim.state.")


# -- the pure parts --


def test_recorded_settings_are_the_declared_ones_in_trainer_yaml_spelling(tmp_path):
    settings = recorded(job(tmp_path))
    assert settings["training.learning_rate"] == 3e-4 and settings["checkpoint.async"] is True
    assert not any(name.startswith("model.") for name in settings), "the model section is recorded whole"
    derived = ("checkpoint.dir", "metrics.port", "distributed.master_port", "distributed.num_nodes")
    assert not set(derived) & set(settings), "a laptop and a cluster differ there without changing the run"


def test_first_difference_and_the_config_hash_of_a_checkpoint_without_settings():
    assert first_difference({"a": (2,), "b": (3,)}, {"a": (2,), "b": (3,)}) is None
    assert first_difference({"a": (2,)}, {"a": (2,), "z": (1,)}) == ("z", None, (1,))
    assert changes({"config_hash": "old"}, {"settings": {}}, "new", "step-1") == \
        "step-1 was written with config old, this run has new"
    assert changes({"config_hash": "same"}, {}, "same", "step-1") is None
