"""A committed checkpoint's size, and what the asynchronous save stages of it per rank (torch-free)."""

from __future__ import annotations

from ..config.presets import BrainAIConfig, wrap_unit_params
from .bytes import ADAM_MOMENT_BYTES, MIB
from .question import model_config

STAGED_BYTES_PER_PARAM = 4 + ADAM_MOMENT_BYTES  # fp32 parameter and moments, as a checkpoint holds them
# A committed checkpoint beyond its tensors: DCP's .metadata, the manifest, the RNG and schedule states, pickle headers.
CHECKPOINT_EXTRA_BYTES = 1 * MIB


def checkpoint_bytes(n_params: int) -> int:
    """A committed checkpoint's size for a model of `n_params` parameters: each in fp32 with AdamW's two fp32
    moments (the staged copy's 12 bytes per parameter, whatever the strategy), plus CHECKPOINT_EXTRA_BYTES."""
    return n_params * STAGED_BYTES_PER_PARAM + CHECKPOINT_EXTRA_BYTES


def preset_checkpoint_bytes(model: BrainAIConfig | str) -> int:
    """`checkpoint_bytes` of a preset (or a BrainAIConfig)."""
    return checkpoint_bytes(sum(wrap_unit_params(model_config(model))))
