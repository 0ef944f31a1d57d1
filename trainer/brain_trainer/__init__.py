"""brain_trainer: the runtime inside every worker (`python -m brain_trainer`).

The public contract classes are importable from here. They import torch, so
they load lazily: `import brain_trainer.config` stays torch-free for the
operator.
"""

from .config import DistributedConfig, TrainerConfig, load_config
from .config.presets import MODEL_PRESETS, BrainAIConfig, param_count
from .lazy import lazy_exports
from .plan import choose_strategy, plan_memory, resolve_distributed
from .schema import ConfigError
from .version import __version__

# name -> submodule that defines it (imported on first access; these need torch)
_LAZY = {
    "BrainAI": "model.brain_ai",
    "build_model": "model.brain_ai",
    "DDPWrapper": "parallel.ddp",
    "SingleDeviceWrapper": "parallel.ddp",
    "FSDPWrapper": "parallel.fsdp",
    "GradientAccumulator": "loop.accumulation",
    "DistributedLauncher": "parallel.launcher",
    "RankAwareDataLoader": "data.loader",
    "train": "loop.train",
    "TrainResult": "loop.train",
}

__all__ = [
    "__version__",
    "BrainAIConfig",
    "ConfigError",
    "DistributedConfig",
    "MODEL_PRESETS",
    "TrainerConfig",
    "choose_strategy",
    "load_config",
    "param_count",
    "plan_memory",
    "resolve_distributed",
    *_LAZY,
]


__getattr__ = lazy_exports(__name__, _LAZY, globals())
