"""Bytes each rank sends per optimizer step under a layout, term by term (torch-free: the planner and `braintrain
estimate` print them beside each option).

Collectives are counted as NCCL's ring algorithms move them: over n ranks an
all-gather or a reduce-scatter of S bytes sends S (n - 1) / n from each rank,
an all-reduce twice that. With m micro-batches per step, P the parameters a
rank holds (its stages' units, its tp share), N the ranks sharing their shard
and A = micro_batch x seq_len x d_model activation bytes:

    fsdp  all-gathers of P's parameters, per micro-batch: full_shard and hybrid_shard 2 (forward, backward),
          shard_grad_op 1 (kept from forward to backward); one reduce-scatter of P's gradients (fp32) per step,
          as the trainer's accumulation (and torch's pipeline stages) sync only the last micro-batch;
          hybrid_shard adds the all-reduce of the gradient shard across the node replicas; no_shard all-reduces
    ddp   one all-reduce of P's gradients per step
    tp    per split block and micro-batch, all-reduces of A over the tp group: reasoning 2 forward (attention,
          MLP) and 2 backward, decision 1 and 1 (its MLP); sequence parallelism's all-gather + reduce-scatter
          pairs move the same bytes
    pp    per micro-batch, point-to-point: A to the next stage from each stage but the last, A's gradient to the
          previous one from each stage but the first

Under a pipeline the gathers are an upper bound: torch's stages keep their
parameters gathered from the first backward to the step's end.
"""

from __future__ import annotations

from dataclasses import dataclass

REDUCE_BYTES = 4  # gradients are reduced and accumulated in fp32 (parallel/fsdp.py's reduce_dtype)
GATHERS_PER_MICRO_BATCH = {"full_shard": 2, "hybrid_shard": 2, "shard_grad_op": 1}
# all-reduces per split block and micro-batch, forward and backward (parallel/tensor.py's plans)
TP_ALL_REDUCES = {"reasoning": 4, "decision": 2}


@dataclass(frozen=True)
class StepCommunication:
    """Bytes one rank sends per optimizer step, by what sends them."""

    fsdp: int = 0
    ddp: int = 0
    tp: int = 0
    pp: int = 0

    @property
    def total(self) -> int:
        return self.fsdp + self.ddp + self.tp + self.pp

    def rows(self) -> list[tuple[str, int]]:
        """(term, bytes) for each term that sends anything."""
        terms = (("fsdp", self.fsdp), ("ddp", self.ddp), ("tensor parallel", self.tp), ("pipeline", self.pp))
        return [(name, size) for name, size in terms if size]


def ring(size: float, ranks: int) -> int:
    """Bytes each rank sends in a ring all-gather or reduce-scatter of `size` bytes over `ranks` ranks."""
    return int(size * (ranks - 1) / ranks)


def step_communication(*, strategy: str, sharding: str, params: int, param_bytes: int, shard: int, dp: int,
                       micro_batches: int, activation: int, split_blocks: dict[str, int], tensor_parallel: int,
                       sends: int) -> StepCommunication:
    """One rank's bytes per step (see the module docstring). `params`: what it holds; `shard`: ranks sharing its
    shard; `dp`: its data-parallel ranks; `activation`: A in bytes; `split_blocks`: the split blocks it runs, by
    stack; `sends`: boundary tensors it sends per micro-batch (its stages' activations and gradients)."""
    m = micro_batches
    fsdp = ddp = 0
    if strategy != "fsdp":
        ddp = 2 * ring(params * param_bytes, dp)
    elif sharding == "no_shard":
        fsdp = 2 * ring(params * REDUCE_BYTES, dp)
    else:
        fsdp = m * GATHERS_PER_MICRO_BATCH[sharding] * ring(params * param_bytes, shard)
        fsdp += ring(params * REDUCE_BYTES, shard)
        if dp > shard:  # hybrid_shard: the node replicas all-reduce their gradient shard
            fsdp += 2 * ring(params * REDUCE_BYTES / shard, dp // shard)
    tp = m * sum(TP_ALL_REDUCES[stack] * count for stack, count in split_blocks.items()) * 2 * ring(
        activation, tensor_parallel)
    return StepCommunication(fsdp=fsdp, ddp=ddp, tp=tp, pp=m * sends * activation)
