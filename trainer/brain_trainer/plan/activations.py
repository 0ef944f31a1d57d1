"""Activations a rank saves for backward, counted per block of BrainAI (torch-free; tests measure them with
saved-tensor hooks on the real model).

Attention is flash-style (scaled_dot_product_attention), so nothing grows
with seq_len squared; sequence parallelism divides a split block's tensors by
tp, all but its norms' all-gathered outputs (`GATHERED_UNITS`).
"""

from __future__ import annotations

from typing import Sequence

from ..config.presets import STACKS, BrainAIConfig, pipeline_unit_count
from .bytes import LOGIT_BYTES, PARAM_BYTES

# Per block of a stack that tensor parallelism splits: its norms, whose outputs its colwise linears save all-gathered
# (whole) under sequence parallelism (parallel/tensor.py); all else it saves is on its 1/tp sequence shard or heads.
GATHERED_UNITS = {"reasoning": 2, "decision": 1}


def block_units(cfg: BrainAIConfig, tensor_parallel: int = 1) -> dict[str, float]:
    """Activations one block of each stack saves for backward, per token and rank, in units of d_model elements.

        snn_core 4 + 3 * snn_steps    htm 20    workspace 5
        reasoning 10 + 4 * ffn_hidden / d_model    decision 3 + 4 * ffn_hidden / d_model

    With tensor_parallel tp > 1, sequence parallelism keeps a split block's
    tensors on its sequence shard or its heads, 1/tp of them, except its
    norms' outputs, which DTensor's colwise linears save all-gathered
    (GATHERED_UNITS): reasoning 2 + (8 + 4 * ffn_hidden / d_model) / tp,
    decision 1 + (2 + 4 * ffn_hidden / d_model) / tp. The other stacks are
    replicated: whole.
    """
    mlp = 4 * cfg.ffn_hidden / cfg.d_model
    units = {"snn_core": 4 + 3 * cfg.snn_steps, "htm": 20.0, "workspace": 5.0, "reasoning": 10 + mlp, "decision": 3 + mlp}
    for stack, whole in GATHERED_UNITS.items():
        units[stack] = whole + (units[stack] - whole) / tensor_parallel
    return units


def activation_units(cfg: BrainAIConfig, checkpointing: str, every: int = 2, tensor_parallel: int = 1,
                     held: Sequence[tuple[range, int]] = ()) -> float:
    """Saved activations per token and rank, in units of d_model elements.

    Counted from what each wrap unit keeps for backward (tests measure them
    with saved-tensor hooks on the real model, at tp 1 and 2): encoders 1,
    meta 4, heads 3, and each block of a stack its `block_units`.

    Attention is flash-style (scaled_dot_product_attention), so nothing grows
    with seq_len squared. Checkpointing acts on blocks (parallel/blocks.py: the leaf
    wrap units in forward order: encoders, every block, meta, heads): a
    checkpointed block keeps only its input (1 unit; a split block's 1/tp,
    its sequence shard), and one checkpointed block at a time is recomputed
    in full. `full` checkpoints every block, `selective` every `every`-th.

    `held`: under a pipeline, the (units, micro-batches in flight) of each
    stage one rank runs (units: indices into that forward order): what each
    keeps per micro-batch times its micro-batches, plus one recomputed block.
    Empty: the whole model, one micro-batch.
    """
    per_block = block_units(cfg, tensor_parallel)
    units, inputs = [1.0], [1.0]  # per leaf block, kept and kept when checkpointed: encoders, the stacks, meta, heads
    for name, attr in STACKS.items():
        units += [per_block[name]] * getattr(cfg, attr)
        inputs += [1 / tensor_parallel if name in GATHERED_UNITS else 1.0] * getattr(cfg, attr)
    units += [4.0, 3.0]
    inputs += [1.0, 1.0]
    blocks = range(len(units))
    chosen = set({"none": [], "full": blocks, "selective": blocks[every - 1 :: every]}[checkpointing])
    kept = [inputs[i] if i in chosen else units[i] for i in blocks]
    held = held or [(blocks, 1)]
    saved = sum(count * sum(kept[i] for i in run) for run, count in held)
    return saved + max((units[i] for run, _ in held for i in run if i in chosen), default=0.0)


def activation_bytes(
    cfg: BrainAIConfig, precision: str, micro_batch_size: int, seq_len: int, checkpointing: str, every: int = 2,
    tensor_parallel: int = 1, held: Sequence[tuple[range, int]] = (),
) -> int:
    """micro_batch * seq_len * (activation_units * d_model * element bytes + 2 * vocab * 4), per rank.

    The second term is the float32 logits and log-probabilities of the loss (the heads are replicated: whole
    at any tensor_parallel), kept by the stage that holds the heads (`held`, as activation_units) for each of its
    micro-batches in flight.
    """
    tokens = micro_batch_size * seq_len
    per_token = activation_units(cfg, checkpointing, every, tensor_parallel, held) * cfg.d_model * PARAM_BYTES[precision]
    heads = pipeline_unit_count(cfg) - 1
    losses = sum(count for run, count in held if heads in run) if held else 1
    return int(tokens * (per_token + losses * 2 * cfg.vocab_size * LOGIT_BYTES))
