"""BrainAI architecture dimensions, the named presets and their exact parameter counts.

Torch-free: the memory planner (and through it the operator) sizes models
from these numbers without building them. `param_count` mirrors the modules in
model.py term by term; a test checks it against the real module on the meta
device, so keep the two in step.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterator

from ..schema import ConfigError, FieldError, Names, from_dict, quoted, setting, to_dict

VOCAB_SIZE = 256  # byte-level by default: every byte is a token, no tokenizer to ship
NGRAM_ORDERS = (2, 3)  # the encoder also embeds the hashed bigram and trigram ending at each byte
FFN_MULTIPLE = 32  # the gated-MLP width is rounded up to this, for matmul-friendly shapes


@dataclass
class BrainAIConfig:
    """The dimensions of one BrainAI model."""

    d_model: int = setting(64, minimum=1, help="width of the residual stream")
    n_heads: int = setting(2, minimum=1, help="attention heads in workspace and reasoning blocks")
    ffn_ratio: float = setting(8 / 3, minimum=0, exclusive_minimum=True, help="gated-MLP hidden width / d_model")
    ngram_buckets: int = setting(12288, minimum=1, help="rows of the encoder's hashed byte-bigram/trigram embedding")
    conv_kernel: int = setting(4, minimum=1, help="taps of the encoder's causal depthwise convolution")
    snn_blocks: int = setting(1, minimum=1, help="spiking blocks in snn_core")
    snn_steps: int = setting(4, minimum=1, help="integrate-and-fire simulation steps per token")
    snn_surrogate_slope: float = setting(
        5.0, minimum=0, exclusive_minimum=True, help="sharpness of the spike surrogate gradient"
    )
    htm_blocks: int = setting(1, minimum=1, help="gated linear recurrence blocks in htm")
    workspace_blocks: int = setting(1, minimum=1, help="slot-attention blocks in workspace")
    n_slots: int = setting(16, minimum=1, help="learned workspace slots")
    reasoning_blocks: int = setting(2, minimum=1, help="causal self-attention blocks in reasoning")
    decision_blocks: int = setting(1, minimum=1, help="gated-MLP blocks in decision")
    max_seq_len: int = setting(512, minimum=1, help="longest sequence the model accepts")
    vocab_size: int = setting(VOCAB_SIZE, minimum=2, help="token ids embedded and predicted: 256 bytes, or a tokenizer's vocabulary")

    def check(self, name: Names) -> Iterator[tuple[str, str]]:
        if self.d_model % self.n_heads:
            yield "n_heads", f"must divide {name('d_model')} ({self.d_model}), got {self.n_heads}"

    @property
    def ffn_hidden(self) -> int:
        width = int(self.ffn_ratio * self.d_model)
        return -(-width // FFN_MULTIPLE) * FFN_MULTIPLE


MODEL_PRESETS: dict[str, BrainAIConfig] = {
    "minimal": BrainAIConfig(),
    "1b": BrainAIConfig(
        d_model=2048, n_heads=16, n_slots=64, htm_blocks=2, reasoning_blocks=18, decision_blocks=1, max_seq_len=2048
    ),
    "3b": BrainAIConfig(
        d_model=3072, n_heads=24, n_slots=64, htm_blocks=2, reasoning_blocks=24, decision_blocks=1, max_seq_len=4096
    ),
    "7b": BrainAIConfig(
        d_model=4096, n_heads=32, n_slots=128, htm_blocks=2, reasoning_blocks=32, decision_blocks=2, max_seq_len=4096
    ),
    # Llama 2's 13B and 70B widths and depths; heads and MLP width divide by 8 (a node's tensorParallel)
    "13b": BrainAIConfig(
        d_model=5120, n_heads=40, n_slots=128, htm_blocks=2, reasoning_blocks=40, decision_blocks=2, max_seq_len=4096
    ),
    "70b": BrainAIConfig(
        d_model=8192, n_heads=64, n_slots=256, htm_blocks=2, reasoning_blocks=80, decision_blocks=4, max_seq_len=4096
    ),
}

NOMINAL_PARAMS = {"minimal": 1_000_000, "1b": 1_000_000_000, "3b": 3_000_000_000, "7b": 7_000_000_000,
                  "13b": 13_000_000_000, "70b": 70_000_000_000}


def preset_config(name: str, **overrides: Any) -> BrainAIConfig:
    """A preset, with fields overridden; bad names or values raise ConfigError naming the field."""
    if name not in MODEL_PRESETS:
        raise ConfigError([FieldError("model.preset", f"must be one of {', '.join(MODEL_PRESETS)}; got {quoted(name)}")])
    if not overrides:
        return replace(MODEL_PRESETS[name])
    return from_dict(BrainAIConfig, {**to_dict(MODEL_PRESETS[name]), **overrides}, path="model")


# the modules built as stacks of identical blocks, and the config field that counts them
STACKS = {
    "snn_core": "snn_blocks",
    "htm": "htm_blocks",
    "workspace": "workspace_blocks",
    "reasoning": "reasoning_blocks",
    "decision": "decision_blocks",
}


def module_param_counts(cfg: BrainAIConfig) -> dict[str, int]:
    """Parameters of each top-level BrainAI module, term by term as model.py builds them."""
    d, f, v = cfg.d_model, cfg.ffn_hidden, cfg.vocab_size
    norm = d  # RMSNorm: one weight per channel
    gated_mlp = 3 * d * f  # gate, up, down projections, no biases
    return {
        # byte and hashed n-gram embeddings, depthwise causal conv (weights and bias)
        "encoders": (v + cfg.ngram_buckets) * d + d * cfg.conv_kernel + d,
        # norm, input and output projections, per-channel leak and threshold
        "snn_core": cfg.snn_blocks * (norm + 2 * d * d + 2 * d),
        # norm, fused (value, gate, output-gate) projection, output projection
        "htm": cfg.htm_blocks * (norm + 3 * d * d + d * d),
        # norm, query and output projections, slot keys and values
        "workspace": cfg.workspace_blocks * (norm + 2 * d * d + 2 * cfg.n_slots * d),
        # two norms, query, key, value and output projections, gated MLP
        "reasoning": cfg.reasoning_blocks * (2 * norm + 4 * d * d + gated_mlp),
        "decision": cfg.decision_blocks * (norm + gated_mlp),
        # norm, correction projection, confidence head (weight and bias)
        "meta": norm + d * d + d + 1,
        # final norm, untied byte head
        "heads": norm + d * v,
    }


def split_block_params(cfg: BrainAIConfig) -> dict[str, int]:
    """Parameters per block that tensor parallelism splits over its ranks (parallel/tensor.py, `Block.COLWISE` and
    `Block.ROWWISE`): reasoning's query, key, value and output projections and gated MLP, decision's gated MLP.
    Everything else (norms included) is replicated across the tp group."""
    d, f = cfg.d_model, cfg.ffn_hidden
    return {"reasoning": 4 * d * d + 3 * d * f, "decision": 3 * d * f}


def wrap_unit_params(cfg: BrainAIConfig, tensor_parallel: int = 1) -> list[int]:
    """Parameters of each FSDP wrap unit in BrainAI.wrap_units() order, leaving out the stacks (they own none);
    with `tensor_parallel` ranks, what one tp rank holds of each (the split parameters divided by it)."""
    counts = module_param_counts(cfg)
    split = split_block_params(cfg)
    blocks = {name: getattr(cfg, attr) for name, attr in STACKS.items()}
    units: list[int] = []
    for name, count in counts.items():
        n = blocks.get(name, 1)
        whole = split.get(name, 0)
        units.extend([count // n - whole + whole // tensor_parallel] * n)
    return units


def pipeline_unit_count(cfg: BrainAIConfig) -> int:
    """Units a pipeline can cut BrainAI between (plan/stages.py): every block of a stack, encoders, meta, heads."""
    return len(module_param_counts(cfg)) - len(STACKS) + sum(getattr(cfg, attr) for attr in STACKS.values())


def largest_tensor_params(cfg: BrainAIConfig) -> int:
    """Elements of BrainAI's largest single parameter tensor (initialisation and initFrom handle one at a time)."""
    d = cfg.d_model
    return max(
        max(cfg.vocab_size, cfg.ngram_buckets) * d,  # byte and n-gram embeddings, byte head
        3 * d * d,  # fused recurrence projection
        cfg.ffn_hidden * d,  # gated-MLP projections
        cfg.n_slots * d,  # workspace slots
    )


def param_count(cfg: BrainAIConfig | str) -> int:
    """Exact number of parameters of BrainAI(cfg), without building it."""
    if isinstance(cfg, str):
        cfg = preset_config(cfg)
    return sum(module_param_counts(cfg).values())
