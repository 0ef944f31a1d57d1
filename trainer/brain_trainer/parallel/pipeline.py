"""Pipeline parallelism for BrainAI (`torch.distributed.pipelining`), composed with tensor parallelism and FSDP2.

Each pipeline rank keeps only the units of its own stages (plan/stages.py cuts the
chain; stage s runs on pipeline rank s mod pp). The whole BrainAI is built on
the meta device as for every other layout, then every unit of another rank's
stages is replaced by a parameterless `nn.Identity`: the kept blocks keep their
qualified names (`reasoning.blocks.3.q.weight`), so the seeded initialisation
(model/seeded_init.py) gives them the values any other layout gives them, and
checkpoints, which DCP writes and reads by name, move between layouts.

Per stage, in the order FSDPWrapper does it for the whole model: tensor
parallelism over the mesh's "tp" dimension (tensor.py), activation
checkpointing and compile per block, `fully_shard` per unit over the
data-parallel dimensions, then the stage module (`StageModule`) as the root:
the root is what `PipelineStage` calls, so FSDP2's lazy initialisation runs and
the stage's gradient sync waits for the last micro-batch (PipelineStage
handles an FSDPModule so). The mesh is the run's ("pp", dp..., "tp",
`run_layout.RunLayout.mesh`), pp outermost as `Layout` numbers the ranks; the
stages' activations and gradients travel point to point on its "pp" dimension.

One optimizer step is one schedule step over the step's micro-batches: the
schedule splits the concatenated batch again, and divides the accumulated
gradients by their count (`scale_grads`), so a step's gradients are the mean
over the global batch, as without a pipeline.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Optional

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from ..config import DistributedConfig
from ..config.presets import BrainAIConfig
from ..config.sections import INTERLEAVED
from ..schema import ConfigError, FieldError
from .blocks import Backend, apply_block_options
from .ddp import Materialize, ProcessGroupUser, all_reduce_weighted_mean
from .fsdp import shard_options, sharding_policy
from ..plan.layout import Layout
from .run_layout import RunLayout
from ..plan.stages import Stage, stage_plan
from .step import Accumulates, Batch, StepSettings
from .tensor import apply_tensor_parallel

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, INTERLEAVED: ScheduleInterleaved1F1B}


class StageModule(nn.Module):
    """One pipeline stage: its units applied in forward order (the first stage's take tokens, the last's give logits).

    The units stay children of the BrainAI they came from too: that model part,
    not this module, names the parameters in the optimizer and the checkpoints."""

    def __init__(self, units: list[nn.Module], autocast: Callable[[], contextlib.AbstractContextManager]):
        super().__init__()
        self.units = nn.ModuleList(units)
        self.autocast = autocast  # the schedule calls forward: the stage computes in the loop's precision itself

    def forward(self, x: Tensor) -> Tensor:
        with self.autocast():
            for unit in self.units:
                x = unit(x)
        return x


def prune(model: nn.Module, names: list[str]) -> None:
    """Replace the submodules `names` of `model` by parameterless placeholders, in place (every other name stays)."""
    for name in names:
        model.set_submodule(name, nn.Identity())


class PipelineWrapper(ProcessGroupUser):
    """Runs this rank's stages of BrainAI in a pipeline schedule, each stage sharded by FSDP2 (and split by TP)."""

    def __init__(self, model: nn.Module, config: DistributedConfig, *, steps: StepSettings,
                 compile_backend: Optional[Backend] = None, run_layout: Optional[RunLayout] = None):
        super().__init__(config, compile_backend=compile_backend, run_layout=run_layout, steps=steps)
        self.model = model
        self.layout: Optional[Layout] = None
        self.mesh: Optional[DeviceMesh] = None
        self.stages: list[Stage] = []  # this rank's, in forward order
        self.whole: dict[str, tuple[int, ...]] = {}  # the whole model's tensors' shapes, by name (its state dict)
        self.whole_parameters: tuple[str, ...] = ()  # the whole model's parameters' names, in order
        self.schedule = None
        self._pipeline_stages: list[PipelineStage] = []

    @property
    def pipeline_group(self) -> dist.ProcessGroup:
        """The ranks of this rank's pipeline: one per stage group, all holding this rank's dp and tp coordinates."""
        self._require_setup()
        return self.run_layout.pp_group

    @property
    def micro_batches_per_pass(self) -> int:
        return self.steps.micro_batches

    @property
    def holds_first(self) -> bool:
        return any(stage.index == 0 for stage in self.stages)

    @property
    def holds_last(self) -> bool:
        return any(stage.index == self.layout.stages - 1 for stage in self.stages)

    def setup(self, rank: int, world_size: int, *, materialize: Optional[Materialize] = None) -> nn.Module:
        """Cut, split and shard in place; returns this rank's model part (the BrainAI holding only its stages'
        units), materialised and initialised by `materialize` when given (else it stays on meta)."""
        run = self.join_process_group(rank, world_size)
        device, layout = run.device, run.layout
        self.layout = layout
        cfg = getattr(self.model, "cfg", None)
        if not isinstance(cfg, BrainAIConfig):
            raise ConfigError([FieldError("distributed.pipeline_parallel",
                                          f"cuts a BrainAI at its block boundaries; got a {type(self.model).__name__}")])
        plan = stage_plan(cfg, self.steps.seq_len, layout.pp, layout.stages_per_rank, layout.tp)
        self.stages = [stage for stage in plan if stage.rank == layout.pp_rank(rank)]
        self.whole = {name: tuple(tensor.shape) for name, tensor in self.model.state_dict().items()}
        self.whole_parameters = tuple(name for name, _ in self.model.named_parameters())
        checkpointed = self.checkpointed_blocks(self.model)  # every k-th block of the whole model, as without stages
        kept = [name for stage in self.stages for name in stage.names]
        prune(self.model, [unit.name for stage in plan for unit in stage.units if unit.name not in kept])

        policy = sharding_policy(self.config, tuple(kept), world_size // layout.pp, run.ranks.local_world_size,
                                 tuple(name for name in checkpointed if name in kept))
        self.mesh = run.mesh
        if layout.tp > 1:
            apply_tensor_parallel(self.model, run.tp_mesh)
        apply_block_options(self.model, policy.checkpointed, self.compile_backend)
        options = shard_options(policy, run.dp_mesh)
        modules = dict(self.model.named_modules())
        roots = []
        for stage in self.stages:
            units = [modules[name] for name in stage.names]
            for unit in units:
                fully_shard(unit, reshard_after_forward=policy.reshard_after_forward, **options)
            # None lets FSDP keep the root gathered after forward, as FSDPWrapper's root
            roots.append(fully_shard(StageModule(units, self.steps.autocast), reshard_after_forward=None, **options))
        if materialize is not None:
            materialize(self.model, torch.device("cpu") if policy.cpu_offload else device)
        group = run.pp_group
        self._pipeline_stages = [PipelineStage(root, stage.index, layout.stages, device, group=group)
                                 for root, stage in zip(roots, self.stages)]
        schedule = SCHEDULES[self.config.pipeline_schedule]
        looped = schedule is ScheduleInterleaved1F1B
        self.schedule = schedule(self._pipeline_stages if looped else self._pipeline_stages[0],
                                 self.steps.micro_batches, loss_fn=self.steps.loss_fn, scale_grads=True)
        return self.ready(self.model)

    def train_step(self, batches: Iterator[Batch], accumulator: Accumulates, losses: Tensor) -> int:
        """One schedule step over the optimizer step's micro-batches, concatenated (the schedule splits them again,
        and runs their backward passes itself). Adds their losses to `losses` on the last stage; returns how many
        it added (none on the other stages)."""
        micro_batches = accumulator.accumulation_steps
        x, y = (torch.cat(parts).to(self.run_layout.device)
                for parts in zip(*(next(batches) for _ in range(micro_batches))))
        loss = self.step(x, y)
        if loss is None:
            return 0
        losses += loss * micro_batches  # the schedule's loss is the mean over the micro-batches
        return micro_batches

    def all_reduce_loss(self, total: float, count: int) -> float:
        """Only the last stage's ranks hold losses: the mean of theirs, on every rank."""
        return all_reduce_weighted_mean(total, count)

    def step(self, x: Tensor, y: Tensor) -> Optional[Tensor]:
        """Forward and backward of one optimizer step's micro-batches, concatenated along the batch; the gradients
        are left in the parameters. Returns the mean of the micro-batches' losses on the last stage, else None."""
        losses: list[Tensor] = []
        self.schedule.step(*self._inputs(x), target=y, losses=losses, return_outputs=False)
        return torch.stack(losses).detach().mean() if self.holds_last else None

    @torch.no_grad()
    def logits(self, x: Tensor, y: Tensor) -> Optional[Tensor]:
        """Forward only, of micro_batches equal micro-batches concatenated: their logits on the last stage, else None
        (the schedule computes the loss of targets `y` on its way too)."""
        output = self.schedule.eval(*self._inputs(x), target=y)
        return output if self.holds_last else None

    def _inputs(self, x: Tensor) -> tuple[Tensor, ...]:
        return (x,) if self.holds_first else ()  # only the first stage reads tokens; the others receive activations

    def _require_setup(self) -> DeviceMesh:
        if self.mesh is None:
            raise RuntimeError("PipelineWrapper.setup() must run first")
        return self.mesh
