"""What a run needs decided before it starts, torch-free, so the trainer and the operator ask alike: bytes per rank
(memory.py, activations.py, host.py, checkpoint_size.py), the strategy `auto` picks (ladder.py, resolve.py), the
parallel layout (layout.py), the pipeline's stage cut (stages.py, pipeline.py) and the bytes each rank sends per step
(comms.py). A run's settings reach them as one `PlanQuestion`, built once from its config (question.py)."""

from .bytes import GIB
from .checkpoint_size import checkpoint_bytes, preset_checkpoint_bytes
from .choice import StrategyChoice
from .host import HostPlan, plan_host_memory
from .ladder import InsufficientMemoryError, choose_strategy, first_fit, plan_ladder
from .layout import Layout, build_layout
from .memory import MemoryPlan, plan_for, plan_memory
from .question import PlanQuestion, planned_model, unplanned_strategy
from .resolve import rank_estimate, resolve_distributed
from .stages import stage_plan

__all__ = [
    "GIB",
    "HostPlan",
    "InsufficientMemoryError",
    "Layout",
    "MemoryPlan",
    "PlanQuestion",
    "StrategyChoice",
    "build_layout",
    "checkpoint_bytes",
    "choose_strategy",
    "first_fit",
    "plan_for",
    "plan_host_memory",
    "plan_ladder",
    "plan_memory",
    "planned_model",
    "preset_checkpoint_bytes",
    "rank_estimate",
    "resolve_distributed",
    "stage_plan",
    "unplanned_strategy",
]
