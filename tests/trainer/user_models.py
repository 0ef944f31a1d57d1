"""User models for `model.entrypoint` tests (importable by spawned ranks: tests/ is on their path)."""

import torch
from torch import nn

from brain_trainer.config.presets import preset_config
from brain_trainer.model.brain_ai import BlockStack, Encoders, Heads, SpikingBlock, TransformerBlock

WIDTH = 32


def small_lm() -> nn.Module:
    """tokens -> logits from torch's own modules, each of which defines reset_parameters()."""
    return nn.Sequential(nn.Embedding(256, WIDTH), nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 256))


class Gain(nn.Module):
    """Holds a parameter but defines no reset_parameters(): cannot be initialised in place."""

    def __init__(self) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.ones(WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gain


def without_reset() -> nn.Module:
    return nn.Sequential(nn.Embedding(256, WIDTH), Gain(), nn.Linear(WIDTH, 256))


class Frequencies(nn.Module):
    """Computes a buffer when built, which to_empty() leaves unset; its reset_parameters() forgets it."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("freq", torch.arange(float(WIDTH)))
        self.proj = nn.Linear(WIDTH, WIDTH)

    def reset_parameters(self) -> None:
        self.proj.reset_parameters()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x * self.freq)


def forgets_a_buffer() -> nn.Module:
    return nn.Sequential(nn.Embedding(256, WIDTH), Frequencies(), nn.Linear(WIDTH, 256))


def brainai_blocks() -> nn.Module:
    """A smaller BrainAI of its own blocks, assembled by hand (what a user's entrypoint may do with them)."""
    cfg = preset_config("minimal", d_model=WIDTH, ngram_buckets=512, max_seq_len=64)
    return nn.Sequential(Encoders(cfg), BlockStack(SpikingBlock, 2, cfg), TransformerBlock(cfg), Heads(cfg))


class HostRead(nn.Module):
    """Looks at its input's values on the host (.item()): it trains, but cannot run on meta tensors."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * float(x.abs().max().item() > 0)


def data_dependent() -> nn.Module:
    return nn.Sequential(nn.Embedding(256, WIDTH), HostRead(), nn.Linear(WIDTH, 256))


def byte_lm() -> nn.Module:
    """small_lm over a byte-level token dataset's vocabulary: the 256 bytes and the end-of-text id."""
    return nn.Sequential(nn.Embedding(257, WIDTH), nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 257))
