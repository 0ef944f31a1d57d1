"""How the model is spread over ranks: the launcher (torchrun, SLURM, a manual launch), the DDP, FSDP2 and pipeline wrappers,
per-block checkpointing and compile. The planner that picks between them, and the layout they share, are plan/'s
(torch-free); its names stay importable from here.

Importing this package is torch-free; each torch name loads its module on first use.
"""

from ..lazy import lazy_exports
from ..plan import Layout, build_layout, choose_strategy, plan_memory, resolve_distributed

_LAZY = {
    "DistributedLauncher": "launcher",
    "DDPWrapper": "ddp",
    "SingleDeviceWrapper": "ddp",
    "FSDPWrapper": "fsdp",
    "PipelineWrapper": "pipeline",
}

__all__ = ["Layout", "build_layout", "choose_strategy", "plan_memory", "resolve_distributed", *_LAZY]

__getattr__ = lazy_exports(__name__, _LAZY, globals())
