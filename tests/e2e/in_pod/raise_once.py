"""A `model.entrypoint` for the in-pod restart test: the minimal BrainAI preset, except that rank 0 of a pod's
first attempt raises `RuntimeError: boom` at its FAIL_AT-th forward pass;
torchrun's restart of the workers (TORCHELASTIC_RESTART_COUNT 1) trains on."""

import os

from torch import nn

from brain_trainer.model.brain_ai import BrainAI

AT = int(os.environ["FAIL_AT"])


def build() -> nn.Module:
    model = BrainAI.from_preset("minimal")
    calls = 0

    def count(module: nn.Module, args: tuple) -> None:
        nonlocal calls
        calls += 1
        if calls == AT and os.environ["RANK"] == "0" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
            raise RuntimeError("boom")

    model.register_forward_pre_hook(count)
    return model
