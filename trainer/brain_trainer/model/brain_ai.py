"""BrainAI: the reference model, a byte-level causal language model.

tokens [B, T] (bytes) -> logits [B, T, 256] for the next byte. The residual
stream passes through eight named modules, in this order:

    encoders   byte and hashed n-gram embeddings + causal depthwise convolution
    snn_core   leaky integrate-and-fire spiking blocks (surrogate gradient)
    htm        gated linear recurrence, computed in parallel (chunked, log space)
    workspace  tokens read from a bank of learned slots (cross-attention)
    reasoning  causal self-attention transformer blocks (most parameters)
    decision   gated-MLP blocks
    meta       a per-token confidence that gates a correction of the stream
    heads      final norm + byte head

Every module is causal, so logits at t depend on tokens <= t only; every
parameter takes part in every forward pass (DDP without unused-parameter
search); there is no dropout, so runs are reproducible. Parameter counts are
mirrored exactly by presets.param_count.
"""

from __future__ import annotations

import importlib
import math
import inspect
from typing import Any, Callable, ClassVar, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from ..config.presets import NGRAM_ORDERS, BrainAIConfig, preset_config
from ..schema import ConfigError, FieldError

INIT_STD = 0.02
HASH_MULTIPLIER = 2654435761  # Knuth's multiplicative hash constant
# n-gram ids are cut to 31 bits before hashing, so the product stays below int64 overflow for any vocabulary
# (a no-op for bytes: their trigram ids stay below 2**31).
HASH_INPUT = 2**31
SCAN_CHUNK = 16
MAX_LOG_DECAY = 4.0  # SCAN_CHUNK * MAX_LOG_DECAY = 64 < 88, where exp overflows float32


def _init_linear(layer: nn.Linear, std: float = INIT_STD) -> None:
    nn.init.normal_(layer.weight, mean=0.0, std=std)
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)


class Block(nn.Module):
    """A module of BrainAI's: its `reset_parameters` initialises all of its tensors, its children's included, as
    BrainAI does (BrainAI's own, or any model a `model.entrypoint` builds from these blocks: `reset_block`)."""

    RESIDUAL_ADDS: ClassVar[int] = 0  # projections it adds into the residual stream (their init is depth-scaled)
    # Tensor parallelism (parallel/tensor.py): linears split by output rows, then those split by input columns,
    # that take the split activations back; a block naming none is replicated.
    COLWISE: ClassVar[tuple[str, ...]] = ()
    ROWWISE: ClassVar[tuple[str, ...]] = ()


class GatedMLP(Block):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.gate = nn.Linear(d_model, hidden, bias=False)
        self.up = nn.Linear(d_model, hidden, bias=False)
        self.down = nn.Linear(hidden, d_model, bias=False)

    def reset_parameters(self, out_std: float) -> None:
        _init_linear(self.gate)
        _init_linear(self.up)
        _init_linear(self.down, out_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Encoders(Block):
    """Byte embedding, hashed n-gram embeddings and a causal depthwise convolution.

    The n-gram table gives each position the bigram and trigram that end at
    it (both hashed into its `ngram_buckets` rows, as in byte-level models
    such as BLT): context that costs lookups, not matmuls.
    """

    def __init__(self, cfg: BrainAIConfig):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.bos = cfg.vocab_size  # the positions before the first token in n-gram ids (one past the last id)
        self.ngram = nn.Embedding(cfg.ngram_buckets, cfg.d_model)
        self.conv = nn.Conv1d(cfg.d_model, cfg.d_model, cfg.conv_kernel, groups=cfg.d_model)

    def reset_parameters(self) -> None:
        nn.init.normal_(self.embed.weight, std=1.0)
        nn.init.normal_(self.ngram.weight, std=1.0)
        nn.init.normal_(self.conv.weight, std=INIT_STD)
        nn.init.zeros_(self.conv.bias)

    def ngram_ids(self, tokens: torch.Tensor, order: int) -> torch.Tensor:
        """Bucket of the `order` tokens ending at each position (B, T); before the start counts as `bos`."""
        T = tokens.shape[1]
        padded = F.pad(tokens, (order - 1, 0), value=self.bos)  # (B, T + order - 1)
        ids = torch.full_like(tokens, order)  # the order is mixed in so bigrams and trigrams hash apart
        for i in range(order):
            ids = ids * (self.bos + 1) + padded[:, i : i + T]
        return (ids % HASH_INPUT * HASH_MULTIPLIER) % 2**32 % self.ngram.num_embeddings

    def embedded(self, tokens: torch.Tensor, before: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Token and n-gram embeddings (B, T, D); `before`: the tokens that precede these (decoding), else none."""
        T = tokens.shape[1]
        history = tokens if before is None else torch.cat([before, tokens], dim=1)
        x = self.embed(tokens)  # (B, T, D)
        for order in NGRAM_ORDERS:
            x = x + self.ngram(self.ngram_ids(history, order)[:, -T:])  # (B, T, D)
        return x

    def convolved(self, x: torch.Tensor, before: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x plus its causal convolution; `before`: the embedded rows that precede x (at most kernel - 1), else none."""
        T = x.shape[1]
        rows = x if before is None else torch.cat([before, x], dim=1)
        # left padding only: output t sees positions t-k+1 .. t
        window = F.pad(rows.transpose(1, 2), (self.conv.kernel_size[0] - 1 - (rows.shape[1] - T), 0))  # (B, D, T+k-1)
        return x + self.conv(window).transpose(1, 2)  # (B, T, D)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.convolved(self.embedded(tokens))  # (B, T, D)


class Spike(torch.autograd.Function):
    """Heaviside step forward; fast-sigmoid surrogate 1/(1+slope|v|)^2 backward.

    The true derivative is zero almost everywhere, which would stop learning
    at the first spiking layer.
    """

    @staticmethod
    def forward(ctx: Any, v: torch.Tensor, slope: float) -> torch.Tensor:
        ctx.save_for_backward(v)
        ctx.slope = slope
        return (v > 0).to(v.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (v,) = ctx.saved_tensors
        return grad / (1 + ctx.slope * v.abs()).pow(2), None


class SpikingBlock(Block):
    """Leaky integrate-and-fire neurons driven by each token for `snn_steps` steps.

    The membrane integrates a constant input current with a learned leak per
    channel, fires when it crosses a learned threshold and resets by
    subtraction; the firing rate over the steps is projected back into the
    residual stream. The steps simulate neuron dynamics within one token, so
    causality is untouched.
    """

    RESIDUAL_ADDS = 1

    def __init__(self, cfg: BrainAIConfig):
        super().__init__()
        self.steps = cfg.snn_steps
        self.slope = cfg.snn_surrogate_slope
        self.norm = nn.RMSNorm(cfg.d_model)
        self.current = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.leak_logit = nn.Parameter(torch.empty(cfg.d_model))  # membrane keeps sigmoid(leak_logit) per step
        self.threshold = nn.Parameter(torch.empty(cfg.d_model))

    def reset_parameters(self, out_std: float) -> None:
        self.norm.reset_parameters()
        # unit-scale currents, so a fair share of neurons fires at initialisation
        _init_linear(self.current, 1.0 / math.sqrt(self.current.in_features))
        _init_linear(self.out, out_std)
        nn.init.constant_(self.leak_logit, 2.0)  # leak factor ~0.88
        nn.init.constant_(self.threshold, 1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        current = self.current(self.norm(x))  # (B, T, D)
        leak = torch.sigmoid(self.leak_logit)  # (D,)
        membrane = torch.zeros_like(current)
        rate = torch.zeros_like(current)
        for _ in range(self.steps):
            membrane = leak * membrane + current
            spikes = Spike.apply(membrane - self.threshold, self.slope)  # (B, T, D) in {0, 1}
            membrane = membrane - spikes * self.threshold
            rate = rate + spikes
        return x + self.out(rate / self.steps)


def gated_scan(log_a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """h_t = a_t * h_{t-1} + b_t along dim 1 (h_{-1} = 0), for all t at once; b > 0.

    Unrolled, h_t = sum_{s<=t} exp(A_t - A_s) b_s with A = cumsum(log a).
    Within chunks of SCAN_CHUNK steps this is exp(A_t) * cumsum(exp(-A_s) b_s),
    which cannot overflow because log a >= -MAX_LOG_DECAY bounds the
    exponents by SCAN_CHUNK * MAX_LOG_DECAY; the state carried across chunks
    is the same recurrence over chunks, solved in log space with
    logcumsumexp (on T / SCAN_CHUNK positions only: it is slow on CPU).

    log_a, b: (B, T, D) float32 -> h: (B, T, D)
    """
    B, T, D = b.shape
    pad = -T % SCAN_CHUNK  # trailing padding cannot reach earlier outputs
    log_a = F.pad(log_a, (0, 0, 0, pad)).view(B, -1, SCAN_CHUNK, D)  # (B, N, C, D)
    b = F.pad(b, (0, 0, 0, pad)).view(B, -1, SCAN_CHUNK, D)  # (B, N, C, D)
    decay = torch.cumsum(log_a, dim=2)  # (B, N, C, D), log decay since the chunk start
    local = torch.exp(decay) * torch.cumsum(torch.exp(-decay) * b, dim=2)  # (B, N, C, D), state from this chunk
    chunk_decay = torch.cumsum(decay[:, :, -1], dim=1)  # (B, N, D), log decay since the sequence start
    chunk_end = local[:, :, -1].clamp_min(torch.finfo(b.dtype).tiny)  # (B, N, D), > 0 for the log
    carried = torch.exp(chunk_decay + torch.logcumsumexp(torch.log(chunk_end) - chunk_decay, dim=1))  # (B, N, D)
    entering = F.pad(carried[:, :-1], (0, 0, 1, 0))  # (B, N, D), state before each chunk
    h = local + torch.exp(decay) * entering.unsqueeze(2)  # (B, N, C, D)
    return h.view(B, -1, D)[:, :T]


class RecurrentBlock(Block):
    """A gated linear recurrence h_t = a_t * h_{t-1} + (1 - a_t) * v_t over the sequence (see gated_scan).

    Forget gate a_t = exp(-MAX_LOG_DECAY * sigmoid(-g_t)) lies in
    (exp(-MAX_LOG_DECAY), 1); the written value v_t = sigmoid(.) is positive
    so the scan can work in log space. Runs in float32 whatever the autocast
    dtype; the read-out is gated by silu of a third projection.
    """

    RESIDUAL_ADDS = 1

    def __init__(self, cfg: BrainAIConfig):
        super().__init__()
        self.norm = nn.RMSNorm(cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)  # value, forget gate, output gate
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def reset_parameters(self, out_std: float) -> None:
        self.norm.reset_parameters()
        _init_linear(self.proj)
        _init_linear(self.out, out_std)

    def gates(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(log a_t, (1 - a_t) * v_t, the output gate), each (B, T, D) float32."""
        value, gate, out_gate = self.proj(self.norm(x)).float().chunk(3, dim=-1)  # 3 x (B, T, D)
        log_a = -MAX_LOG_DECAY * torch.sigmoid(-gate)  # (B, T, D), log a_t
        return log_a, -torch.expm1(log_a) * torch.sigmoid(value), out_gate

    def read(self, x: torch.Tensor, state: torch.Tensor, out_gate: torch.Tensor) -> torch.Tensor:
        return x + self.out((state * F.silu(out_gate)).to(x.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        log_a, written, out_gate = self.gates(x)
        return self.read(x, gated_scan(log_a, written), out_gate)  # the state is in (0, 1)


class SlotAttentionBlock(Block):
    """Each token queries a bank of learned slots (keys and values) with multi-head attention.

    The slots do not depend on the input, so every position may read all of
    them without breaking causality.
    """

    RESIDUAL_ADDS = 1

    def __init__(self, cfg: BrainAIConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.norm = nn.RMSNorm(cfg.d_model)
        self.query = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.slot_keys = nn.Parameter(torch.empty(cfg.n_slots, cfg.d_model))
        self.slot_values = nn.Parameter(torch.empty(cfg.n_slots, cfg.d_model))
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def reset_parameters(self, out_std: float) -> None:
        self.norm.reset_parameters()
        _init_linear(self.query)
        nn.init.normal_(self.slot_keys, std=INIT_STD)
        nn.init.normal_(self.slot_values, std=INIT_STD)
        _init_linear(self.out, out_std)

    def _slots(self, slots: torch.Tensor, batch: int) -> torch.Tensor:
        n_slots, d = slots.shape
        heads = slots.view(n_slots, self.n_heads, d // self.n_heads).transpose(0, 1)  # (H, S, hd)
        return heads.unsqueeze(0).expand(batch, -1, -1, -1)  # (B, H, S, hd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        q = self.query(self.norm(x)).view(B, T, self.n_heads, D // self.n_heads).transpose(1, 2)  # (B, H, T, hd)
        k = self._slots(self.slot_keys.to(q.dtype), B)  # (B, H, S, hd)
        v = self._slots(self.slot_values.to(q.dtype), B)  # (B, H, S, hd)
        read = F.scaled_dot_product_attention(q, k, v)  # (B, H, T, hd)
        return x + self.out(read.transpose(1, 2).reshape(B, T, D))


class TransformerBlock(Block):
    """Pre-norm causal self-attention followed by a gated MLP."""

    RESIDUAL_ADDS = 2  # the attention's output and the MLP's
    COLWISE = ("q", "k", "v", "mlp.gate", "mlp.up")  # whole heads per rank
    ROWWISE = ("attn_out", "mlp.down")

    def __init__(self, cfg: BrainAIConfig):
        super().__init__()
        self.head_dim = cfg.d_model // cfg.n_heads
        self.attn_norm = nn.RMSNorm(cfg.d_model)
        # Separate projections, so that tensor parallelism splits each by whole heads (parallel/tensor.py).
        self.q = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.k = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.v = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.attn_out = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.mlp_norm = nn.RMSNorm(cfg.d_model)
        self.mlp = GatedMLP(cfg.d_model, cfg.ffn_hidden)

    def reset_parameters(self, out_std: float) -> None:
        self.attn_norm.reset_parameters()
        for projection in (self.q, self.k, self.v):
            _init_linear(projection)
        _init_linear(self.attn_out, out_std)
        self.mlp_norm.reset_parameters()
        self.mlp.reset_parameters(out_std)

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values (B, H, T, hd) of the stream x."""
        B, T, _ = x.shape
        h = self.attn_norm(x)
        # -1 heads: all of them, or this rank's share under tensor parallelism
        q, k, v = (proj(h).view(B, T, -1, self.head_dim).transpose(1, 2) for proj in (self.q, self.k, self.v))
        return q, k, v

    def mix(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The stream after the attention's read y (B, H, T, hd) and the MLP."""
        B, T, _ = x.shape
        x = x + self.attn_out(y.transpose(1, 2).reshape(B, T, -1))
        return x + self.mlp(self.mlp_norm(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.heads(x)
        return self.mix(x, F.scaled_dot_product_attention(q, k, v, is_causal=True))


class DecisionBlock(Block):
    """Pre-norm gated MLP."""

    RESIDUAL_ADDS = 1
    COLWISE = ("mlp.gate", "mlp.up")
    ROWWISE = ("mlp.down",)

    def __init__(self, cfg: BrainAIConfig):
        super().__init__()
        self.norm = nn.RMSNorm(cfg.d_model)
        self.mlp = GatedMLP(cfg.d_model, cfg.ffn_hidden)

    def reset_parameters(self, out_std: float) -> None:
        self.norm.reset_parameters()
        self.mlp.reset_parameters(out_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class BlockStack(Block):
    """Blocks of one kind applied in sequence; each block is its own FSDP wrap unit."""

    def __init__(self, block: Callable[[BrainAIConfig], nn.Module], count: int, cfg: BrainAIConfig):
        super().__init__()
        self.blocks = nn.ModuleList(block(cfg) for _ in range(count))

    def reset_parameters(self, out_std: float) -> None:
        for block in self.blocks:
            if isinstance(block, Block):  # a pipeline rank's placeholder for another rank's block holds nothing
                block.reset_parameters(out_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


class Meta(Block):
    """Self-monitoring: a per-token confidence in (0, 1) scales a correction of the stream.

    x + sigmoid(w . norm(x) + b) * W norm(x): where the model is unsure the
    correction is damped, where it is confident it is applied in full.
    """

    RESIDUAL_ADDS = 1

    def __init__(self, cfg: BrainAIConfig):
        super().__init__()
        self.norm = nn.RMSNorm(cfg.d_model)
        self.correction = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.confidence = nn.Linear(cfg.d_model, 1)

    def reset_parameters(self, out_std: float) -> None:
        self.norm.reset_parameters()
        _init_linear(self.correction, out_std)
        _init_linear(self.confidence)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        confidence = torch.sigmoid(self.confidence(h))  # (B, T, 1)
        return x + confidence * self.correction(h)


class Heads(Block):
    """Final norm and the output head over the vocabulary (not tied to the embedding: each FSDP unit owns its weights)."""

    def __init__(self, cfg: BrainAIConfig):
        super().__init__()
        self.norm = nn.RMSNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def reset_parameters(self) -> None:
        self.norm.reset_parameters()
        _init_linear(self.lm_head)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(x))  # (B, T, V)


class BrainAI(nn.Module):
    """The BrainAI byte-level language model: tokens (B, T) -> logits (B, T, 256)."""

    def __init__(self, cfg: BrainAIConfig):
        super().__init__()
        self.cfg = cfg
        # registration order is forward order: wrap_units() and the FSDP prefetch rely on it
        self.encoders = Encoders(cfg)
        self.snn_core = BlockStack(SpikingBlock, cfg.snn_blocks, cfg)
        self.htm = BlockStack(RecurrentBlock, cfg.htm_blocks, cfg)
        self.workspace = BlockStack(SlotAttentionBlock, cfg.workspace_blocks, cfg)
        self.reasoning = BlockStack(TransformerBlock, cfg.reasoning_blocks, cfg)
        self.decision = BlockStack(DecisionBlock, cfg.decision_blocks, cfg)
        self.meta = Meta(cfg)
        self.heads = Heads(cfg)
        # Counted once over the whole model: a pipeline rank that keeps only its stages' blocks initialises them as
        # the whole model does (parallel/pipeline.py replaces the others by placeholders).
        self.out_std = residual_out_std(self)
        self.init_weights()

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> "BrainAI":
        """Build a preset (minimal, 1b, 3b, 7b, 13b, 70b), optionally with fields of BrainAIConfig overridden."""
        return cls(preset_config(name, **overrides))

    @torch.no_grad()
    def init_weights(self) -> None:
        """(Re)initialise every parameter; use after `to_empty()` on a meta-built model."""
        for module in self.children():
            if isinstance(module, Block):  # not a pipeline placeholder
                reset_block(module, self.out_std)

    def wrap_units(self) -> list[nn.Module]:
        """FSDP wrap units in forward order: every block of a stack, then the stack; the other modules as they are.

        Shard each in this order, then the root.
        """
        units: list[nn.Module] = []
        for module in self.children():
            if isinstance(module, BlockStack):
                blocks = [block for block in module.blocks if isinstance(block, Block)]
                if not blocks:
                    continue  # every block is another pipeline rank's
                units.extend(blocks)
            if isinstance(module, Block):  # a pipeline placeholder (nn.Identity) is no unit
                units.append(module)
        return units

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        B, T = tokens.shape
        if T > self.cfg.max_seq_len:
            raise ValueError(f"sequence length {T} exceeds max_seq_len {self.cfg.max_seq_len}")
        x = self.encoders(tokens)  # (B, T, D)
        x = self.snn_core(x)
        x = self.htm(x)
        x = self.workspace(x)
        x = self.reasoning(x)
        x = self.decision(x)
        x = self.meta(x)
        return self.heads(x)  # (B, T, V)


def _entrypoint_error(value: str, message: str) -> ConfigError:
    return ConfigError([FieldError("model.entrypoint", f"{message}; got {value!r}")])


def _load_entrypoint(value: str) -> nn.Module:
    module_name, _, attr_path = value.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise _entrypoint_error(value, f"cannot import module {module_name!r} ({exc})") from exc
    for attr in attr_path.split("."):
        if not hasattr(target, attr):
            raise _entrypoint_error(value, f"module {module_name!r} has no attribute {attr_path!r}")
        target = getattr(target, attr)
    if not callable(target):
        raise _entrypoint_error(value, f"{attr_path!r} is not callable")
    try:
        model = target()
    except Exception as exc:
        raise _entrypoint_error(value, f"calling {attr_path}() raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(model, nn.Module):
        raise _entrypoint_error(value, f"{attr_path}() must return a torch.nn.Module, returned {type(model).__name__}")
    return model


def residual_out_std(model: nn.Module) -> float:
    """The init std of the projections that write into `model`'s residual stream.

    GPT-2 style, INIT_STD / sqrt(2 x the additions into the stream, counted over the model's blocks), so
    that the stream's variance does not grow with depth.
    """
    adds = sum(module.RESIDUAL_ADDS for module in model.modules() if isinstance(module, Block))
    return INIT_STD / math.sqrt(2 * max(adds, 1))


def reset_block(block: Block, out_std: float) -> None:
    """Initialise `block` and all below it as BrainAI does; `out_std` for the blocks that write into the stream."""
    if "out_std" in inspect.signature(block.reset_parameters).parameters:
        block.reset_parameters(out_std)
    else:
        block.reset_parameters()


def build_model(model_cfg: ModelConfig) -> nn.Module:
    """The network a job trains: the user's entrypoint when set, else the BrainAI preset.

    Builds on the current default device, so `with torch.device("meta"):`
    gives a model without storage.
    """
    if model_cfg.entrypoint:
        return _load_entrypoint(model_cfg.entrypoint)
    if model_cfg.vocab_size is not None:
        return BrainAI.from_preset(model_cfg.preset, vocab_size=model_cfg.vocab_size)
    return BrainAI.from_preset(model_cfg.preset)
