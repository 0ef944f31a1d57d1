"""brain_trainer: the runtime inside every worker (`python -m brain_trainer`).

The public contract classes are importable from here. They import torch, so
they load lazily: `import brain_trainer.config` stays torch-free for the
operator.
"""

from .config import DistributedConfig, TrainerConfig, load_config
from .lazy import lazy_exports
from .memory import choose_strategy, plan_memory, resolve_distributed
from .presets import MODEL_PRESETS, BrainAIConfig, param_count
from .schema import ConfigError
from .version import __version__

# name -> submodule that defines it (imported on first access; these need torch)
_LAZY = {
    "BrainAI": "model",
    "build_model": "model",
    "DDPWrapper": "ddp",
    "SingleDeviceWrapper": "ddp",
    "FSDPWrapper": "fsdp",
    "GradientAccumulator": "accumulation",
    "DistributedLauncher": "launcher",
    "RankAwareDataLoader": "data",
    "train": "train",
    "TrainResult": "train",
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
