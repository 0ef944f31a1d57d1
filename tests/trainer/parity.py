"""Shared pieces of the data-parallel parity tests: data, loss, a single-process reference.

A distributed run splits each global batch into contiguous per-rank slices;
the single-process reference trains on the whole global batch. With mean
losses and averaged gradients the two must agree step by step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from brain_trainer.model.brain_ai import BrainAI

SEQ_LEN = 16
LR = 5e-3
STEPS = 5


def global_batches(steps: int, batch: int, seed: int = 0) -> list[Tensor]:
    """`steps` batches of shape (batch, SEQ_LEN + 1): byte-counting sequences from random starts.

    Counting is learnable within a few steps, so the losses compared actually move.
    """
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(steps):
        start = torch.randint(0, 256, (batch, 1), generator=generator)
        batches.append((start + torch.arange(SEQ_LEN + 1)) % 256)
    return batches


def rank_slice(tokens: Tensor, rank: int, world_size: int) -> Tensor:
    per_rank = tokens.shape[0] // world_size
    return tokens[rank * per_rank : (rank + 1) * per_rank]


def lm_loss(model: nn.Module, tokens: Tensor) -> Tensor:
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def minimal_model(seed: int = 0) -> BrainAI:
    torch.manual_seed(seed)
    return BrainAI.from_preset("minimal")


def optimizer_for(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.1)


def reference_losses(batches: list[Tensor]) -> list[float]:
    """Loss per optimizer step of one process training on whole global batches."""
    model = minimal_model()
    optimizer = optimizer_for(model)
    losses = []
    for tokens in batches:
        loss = lm_loss(model, tokens)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def reference_gradients(tokens: Tensor) -> dict[str, Tensor]:
    """Gradients of the fresh model's loss on one whole batch."""
    model = minimal_model()
    lm_loss(model, tokens).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def max_abs_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b), (a, b)
    return max(abs(x - y) for x, y in zip(a, b))
