"""The trainer names its torch at start and refuses one outside the supported range (version.TORCH_REQUIREMENT)
with one config-error line, before any work."""

from __future__ import annotations

import logging

import torch
import yaml

from brain_trainer.__main__ import main
from brain_trainer.contract import CONFIG_ERROR, TERMINATION_LOG_ENV
from brain_trainer.version import TORCH_REQUIREMENT


def _config(tmp_path):
    path = tmp_path / "trainer.yaml"
    path.write_text(yaml.safe_dump({"model": {"preset": "minimal"}, "training": {"steps": 1},
                                    "checkpoint": {"dir": str(tmp_path / "ckpt")}}))
    return str(path)


def test_a_torch_outside_the_range_fails_as_config_error_before_any_work(tmp_path, monkeypatch, caplog):
    termination = tmp_path / "termination-log"
    monkeypatch.setenv(TERMINATION_LOG_ENV, str(termination))
    monkeypatch.setattr(torch, "__version__", "2.10.2+cu128")
    with caplog.at_level(logging.INFO):
        assert main(["--config", _config(tmp_path)]) == CONFIG_ERROR
    assert f"on torch 2.10.2+cu128 (supported: {TORCH_REQUIREMENT})" in caplog.text
    message = termination.read_text()
    assert message.startswith("brain.ai/config-error: torch 2.10.2+cu128 is not supported") and "\n" not in message
    assert TORCH_REQUIREMENT in message
    assert not (tmp_path / "ckpt").exists()  # nothing ran: no lease, no checkpoint folder
