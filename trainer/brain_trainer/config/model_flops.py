"""Training FLOPs per token of BrainAI, term by term (pure, torch-free: `braintrain estimate` uses it).

The figure MFU is computed from: model FLOPs of one forward and backward
pass, as `torch.utils.flop_counter.FlopCounterMode` counts them on the real
model (model/flop_count.py, which a test holds to this formula exactly). Like
FlopCounterMode it counts matrix multiplies, attention and convolutions, 2
FLOPs per multiply-add: a projection of W weights costs 2W per token forward
and 4W backward (input and weight gradients). Attention adds, per layer and
token, 2 x 2 x keys x d_model forward (scores and the weighted sum, over every
key: FlopCounterMode does not halve causal attention) and twice that
backward. Not counted: elementwise work (norms, activations, the spiking
core's membrane steps, the recurrence's scan), embedding lookups, and
recomputation (activation checkpointing, a fused attention kernel's backward
recomputing its scores), as in PaLM's definition of MFU.

The usual 6 x parameters (Kaplan et al. 2020) leaves out attention and counts
the embeddings as if they were multiplied; docs/performance.md compares the two.
"""

from __future__ import annotations

from .presets import BrainAIConfig

FORWARD_BACKWARD = 3  # backward costs twice the forward: the input gradient and the weight gradient
FLOPS_PER_MULTIPLY_ADD = 2
SIX_N = 6  # FLOPs per parameter per token in the usual 6N convention


def projection_weights(cfg: BrainAIConfig) -> int:
    """Weights of BrainAI's matrix multiplies (nn.Linear), mirroring presets.module_param_counts without norms,
    embeddings, the convolution, biases and the per-channel or slot parameters."""
    d, f = cfg.d_model, cfg.ffn_hidden
    gated_mlp = 3 * d * f
    return (
        cfg.snn_blocks * 2 * d * d  # input current, output
        + cfg.htm_blocks * 4 * d * d  # fused (value, gate, output gate), output
        + cfg.workspace_blocks * 2 * d * d  # query, output
        + cfg.reasoning_blocks * (4 * d * d + gated_mlp)  # query, key, value, output, gated MLP
        + cfg.decision_blocks * gated_mlp
        + d * d + d  # meta: correction, confidence
        + d * cfg.vocab_size  # byte head
    )


def attention_keys(cfg: BrainAIConfig, seq_len: int) -> int:
    """Keys each token attends to, summed over the model's attention layers."""
    return cfg.reasoning_blocks * seq_len + cfg.workspace_blocks * cfg.n_slots


def training_flops_per_token(cfg: BrainAIConfig, seq_len: int) -> int:
    """Model FLOPs of one training token (forward and backward) at sequence length `seq_len`."""
    multiply_adds = (
        projection_weights(cfg)
        + cfg.d_model * cfg.conv_kernel  # depthwise causal convolution
        + 2 * attention_keys(cfg, seq_len) * cfg.d_model  # scores, then the weighted sum of values
    )
    return FORWARD_BACKWARD * FLOPS_PER_MULTIPLY_ADD * multiply_adds


def six_n_flops_per_token(parameters: int) -> int:
    """The 6N figure: for a model whose FLOPs cannot be counted (a user model that does not run on meta)."""
    return SIX_N * parameters
