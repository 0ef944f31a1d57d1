"""Held-out evaluation: the mean next-token loss on the validation split, computed by all ranks together.

Every evaluation reads the same windows, the first `training.eval_steps` x
`micro_batch_size` of the split (all of them when it is shorter), as
micro-batches dealt round-robin to the ranks. Each rank sums its token
losses and counts its tokens; one all-reduce gives the exact mean over those
windows, so the number does not depend on the world size. Ranks with no
micro-batch left in a round still run a forward pass (on micro-batch 0,
counted as nothing): FSDP gathers parameters inside every forward, and all
ranks must take part in each gather. Under tensor parallelism the micro-batches
are dealt by data-parallel rank; the tp ranks of a group run the same ones
together and only the first of them counts them (`counts`). Under pipeline
parallelism the stages of a pipeline run them together too, `micro_batches`
at a time (one pass of the schedule, every micro-batch padded to the
training's shape, which the stages' buffers have), and only the last stage
sees logits.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from ..config import TrainingConfig
from ..contract import perplexity
from ..parallel.ddp import ProcessGroupUser
from ..parallel.run_layout import RunLayout


@dataclass(frozen=True)
class EvalResult:
    loss: float  # mean next-token cross entropy over the evaluated tokens (nats)
    tokens: int  # target tokens evaluated, over all ranks

    @property
    def perplexity(self) -> float:
        return perplexity(self.loss)


def eval_batches(windows: int, micro_batch_size: int, eval_steps: int) -> list[range]:
    """The window indices of each evaluation micro-batch: the first eval_steps x micro_batch_size windows."""
    count = min(windows, eval_steps * micro_batch_size)
    return [range(start, min(start + micro_batch_size, count)) for start in range(0, count, micro_batch_size)]


def rank_batches(batches: list[range], rank: int, world_size: int) -> list[Optional[range]]:
    """`rank`'s micro-batches, round-robin, one per round; None where the rank only joins the round's forward pass."""
    rounds = -(-len(batches) // world_size)
    return [batches[j] if (j := q * world_size + rank) < len(batches) else None for q in range(rounds)]


def due(step: int, training: TrainingConfig) -> bool:
    """Whether an evaluation follows this optimizer step: every eval_interval steps and after the last."""
    return bool(training.eval_interval) and (step % training.eval_interval == 0 or step == training.steps)


# (tokens, targets) of one pass -> logits, or None on a pipeline rank without the last stage
Forward = Callable[[Tensor, Tensor], Optional[Tensor]]


class Evaluator:
    """This rank's part of every evaluation on `dataset` (the validation split)."""

    def __init__(self, dataset: Dataset, micro_batch_size: int, eval_steps: int, rank: int, world_size: int,
                 device: torch.device, autocast: Callable[[], contextlib.AbstractContextManager], *,
                 counts: bool = True, micro_batches: int = 1):
        """`rank` and `world_size` are data-parallel; `counts`: whether this rank's sums enter the all-reduce;
        `micro_batches`: how many one forward pass takes (a pipeline's), each padded to `micro_batch_size`."""
        self.dataset = dataset
        self.counts = counts
        self.device = device
        self.autocast = autocast  # a factory of the loop's autocast context: evaluation computes as training does
        batches = eval_batches(len(dataset), micro_batch_size, eval_steps)
        self.filler = batches[0]
        self.padded_to = micro_batch_size if micro_batches > 1 else None
        mine = rank_batches(batches, rank, world_size)
        mine += [None] * (-len(mine) % micro_batches)  # every data-parallel rank has as many: they pad alike
        self.passes = [mine[i : i + micro_batches] for i in range(0, len(mine), micro_batches)]

    def _batch(self, indices: range) -> tuple[torch.Tensor, torch.Tensor]:
        rows = list(indices)
        if self.padded_to is not None:
            rows += [self.filler[0]] * (self.padded_to - len(rows))
        # a dataset that fetches a batch at once (a bucket's: one round trip) gets the batch, as the DataLoader does
        fetch = getattr(self.dataset, "__getitems__", None)
        xs, ys = zip(*(fetch(rows) if fetch else [self.dataset[i] for i in rows]))
        return torch.stack(xs).to(self.device), torch.stack(ys).to(self.device)

    @torch.no_grad()
    def __call__(self, model: nn.Module, forward: Optional[Forward] = None) -> EvalResult:
        """Evaluate `model` (through `forward` when given: a pipeline's)."""
        was_training = model.training
        model.eval()
        forward = forward or (lambda x, _: model(x))
        totals = torch.zeros(2, dtype=torch.float64, device=self.device)  # summed loss, tokens
        for batches in self.passes:
            x, y = (torch.cat(parts) for parts in zip(*(self._batch(indices or self.filler) for indices in batches)))
            with self.autocast():
                logits = forward(x, y)
            # the rows of the micro-batches this rank counts: none for a filler, not the padding
            rows = [at * len(x) // len(batches) + i for at, indices in enumerate(batches) if indices is not None
                    for i in range(len(indices))]
            if rows and logits is not None and self.counts:
                counted = torch.tensor(rows, device=self.device)
                loss = F.cross_entropy(logits[counted].flatten(0, 1).float(), y[counted].flatten(), reduction="sum")
                tokens = torch.tensor(float(y[counted].numel()), dtype=torch.float64, device=self.device)
                totals += torch.stack([loss.double(), tokens])
        if dist.is_initialized():
            dist.all_reduce(totals)
        model.train(was_training)
        loss_sum, tokens = totals.tolist()
        return EvalResult(loss=loss_sum / tokens, tokens=int(tokens))


def held_out(dataset: Dataset, micro_batch_size: int, eval_steps: int, layout: RunLayout,
             wrapper: ProcessGroupUser) -> Evaluator:
    """The evaluation at this rank's place in the run's layout: windows dealt by data-parallel rank, each counted
    once (by the last stage's first tp rank), computed as the wrapper trains (its autocast, its micro-batches)."""
    counts = layout.layout.tp_rank(layout.rank) == 0 and wrapper.holds_last
    return Evaluator(dataset, micro_batch_size, eval_steps, layout.dp_rank, layout.layout.dp, layout.device,
                     wrapper.steps.autocast, counts=counts, micro_batches=wrapper.micro_batches_per_pass)
