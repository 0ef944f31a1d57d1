"""Decoding with BrainAI's own state: each new token costs one position's work, not a pass over the whole prefix.

`extend(model, tokens, state)` returns the logits of `tokens` (B, T) as if the
model had run on everything `state` has seen followed by them, and updates
`state`. What each module keeps:

    encoders   the last tokens its n-grams reach back to and the last rows its causal convolution reads
    htm        each recurrent block's state h_t (B, D): the recurrence itself, continued
    reasoning  each attention block's keys and values (a KV cache; it grows with the sequence)
    others     nothing: spiking, slot-attention, decision, meta and head blocks work on each position alone

A module of another kind (a user's model built from other blocks) is a
TypeError: without its state, it would be decoded wrongly. A first `extend`
from an empty state computes exactly what `model(tokens)` computes.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..config.presets import NGRAM_ORDERS
from .brain_ai import (BlockStack, DecisionBlock, Encoders, Heads, Meta, RecurrentBlock, SlotAttentionBlock,
                       SpikingBlock, TransformerBlock, gated_scan)


class DecodingState:
    """What BrainAI's modules keep between `extend` calls, by module name; `seen`: positions consumed so far."""

    def __init__(self) -> None:
        self.seen = 0
        self.layers: dict[str, Any] = {}

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen


def _last(t: torch.Tensor, n: int) -> torch.Tensor:
    """The last n positions of t (B, T, ...): none when n is 0."""
    return t[:, t.shape[1] - min(n, t.shape[1]) :]


def _encoders(module: Encoders, tokens: torch.Tensor, state: DecodingState, name: str) -> torch.Tensor:
    before_tokens, before_rows = state.layers.get(name, (None, None))
    x = module.embedded(tokens, before_tokens)
    out = module.convolved(x, before_rows)
    history = tokens if before_tokens is None else torch.cat([before_tokens, tokens], dim=1)
    rows = x if before_rows is None else torch.cat([before_rows, x], dim=1)
    state.layers[name] = (_last(history, max(NGRAM_ORDERS) - 1), _last(rows, module.conv.kernel_size[0] - 1))
    return out


def _recurrent(module: RecurrentBlock, x: torch.Tensor, state: DecodingState, name: str) -> torch.Tensor:
    log_a, written, out_gate = module.gates(x)
    h = gated_scan(log_a, written)
    before = state.layers.get(name)
    if before is not None:  # h_t also carries the state before these positions, decayed since
        h = h + torch.exp(torch.cumsum(log_a, dim=1)) * before.unsqueeze(1)
    state.layers[name] = h[:, -1]
    return module.read(x, h, out_gate)


def _attention(module: TransformerBlock, x: torch.Tensor, state: DecodingState, name: str) -> torch.Tensor:
    q, k, v = module.heads(x)
    past = state.layers.get(name)
    if past is None:
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        new, total = q.shape[2], k.shape[2]
        # new position i sees every earlier one and the new ones up to itself
        mask = None if new == 1 else torch.ones(new, total, dtype=torch.bool, device=q.device).tril(total - new)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    state.layers[name] = (k, v)
    return module.mix(x, y)


def _stack(module: BlockStack, x: torch.Tensor, state: DecodingState, name: str) -> torch.Tensor:
    for i, block in enumerate(module.blocks):
        x = _extend_module(block, x, state, f"{name}.{i}")
    return x


STATEFUL: dict[type, Callable[[Any, torch.Tensor, DecodingState, str], torch.Tensor]] = {
    Encoders: _encoders, RecurrentBlock: _recurrent, TransformerBlock: _attention, BlockStack: _stack,
}
POSITIONWISE = (SpikingBlock, SlotAttentionBlock, DecisionBlock, Meta, Heads)


def _extend_module(module: nn.Module, x: torch.Tensor, state: DecodingState, name: str) -> torch.Tensor:
    step = STATEFUL.get(type(module))
    if step is not None:
        return step(module, x, state, name)
    if isinstance(module, POSITIONWISE):
        return module(x)
    raise TypeError(f"{name}: {type(module).__name__} has no decoding state here; decode by running the whole "
                    "sequence instead")


def extend(model: nn.Module, tokens: torch.Tensor, state: Optional[DecodingState] = None) -> torch.Tensor:
    """Logits (B, T, V) of `tokens` (B, T) following what `state` has seen; `state` is updated (a new one if None).

    `model` is BrainAI, or a module holding BrainAI's modules under the same names (the export's wrapper).
    """
    state = DecodingState() if state is None else state
    total = state.seen + tokens.shape[1]
    if total > model.cfg.max_seq_len:
        raise ValueError(f"sequence length {total} exceeds max_seq_len {model.cfg.max_seq_len}")
    x = tokens
    for name, module in model.named_children():  # registration order is forward order (BrainAI)
        x = _extend_module(module, x, state, name)
    state.seen = total
    return x
