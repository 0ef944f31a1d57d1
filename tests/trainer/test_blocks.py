"""Activation checkpointing and torch.compile per block: the same losses as the plain model, bitwise, on CPU."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from brain_trainer.config.presets import preset_config
from brain_trainer.model.brain_ai import BrainAI
from brain_trainer.parallel.blocks import apply_block_options, block_names, checkpointed_blocks

STEPS = 2
# The minimal preset, shallower and narrower: what is compared is the blocks' plumbing, not the model's size.
SMALL = dict(d_model=32, ngram_buckets=512, reasoning_blocks=2, max_seq_len=64)


def losses(mode: str, every: int = 2, backend: str | None = None) -> list[float]:
    torch.manual_seed(0)
    model = BrainAI(preset_config("minimal", **SMALL))
    blocks = block_names(model)
    apply_block_options(model, checkpointed_blocks(blocks, mode, every), backend)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tokens = torch.randint(0, 256, (STEPS, 2, 17), generator=torch.Generator().manual_seed(1))
    out = []
    for batch in tokens:
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        out.append(loss.item())
    return out


def test_checkpointing_and_compiling_blocks_leave_the_losses_unchanged():
    plain = losses("none")
    assert plain[1] != plain[0]  # the steps changed the model: the comparison below is over two different states
    assert losses("full") == plain
    assert losses("selective", every=2) == plain
    # aot_eager: dynamo captures each block and AOTAutograd builds its backward, as inductor's would on CUDA,
    # without codegen, whose fused kernels round differently. Compiled inside checkpointed blocks: both at once.
    assert losses("full", backend="aot_eager") == plain


def test_selective_checkpointing_picks_every_kth_block_in_forward_order():
    model = BrainAI(preset_config("minimal", **SMALL))
    blocks = block_names(model)
    assert checkpointed_blocks(blocks, "selective", 3) == (blocks[2], blocks[5], blocks[8])
    assert blocks == ("encoders", "snn_core.blocks.0", "htm.blocks.0", "workspace.blocks.0", "reasoning.blocks.0",
                      "reasoning.blocks.1", "decision.blocks.0", "meta", "heads")
