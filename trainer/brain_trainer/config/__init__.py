"""The trainer's configuration (torch-free; the operator's CRD is generated from it).

`sections` declares every setting once (docs/architecture.md, "One declaration
per setting"); `presets` names the model sizes; `kubeyaml` reads and writes
YAML by kubectl's rules.
"""

from .sections import (
    ACTIVATION_CHECKPOINTING,
    AUTO,
    BACKENDS,
    DATA_SOURCES,
    DISTRIBUTED_PRESETS,
    FSDP_SHARDING,
    LR_SCALING,
    PRECISIONS,
    PRESETS,
    RESUME_LATEST,
    RESUME_NONE,
    STRATEGIES,
    CheckpointConfig,
    DataConfig,
    DistributedConfig,
    MetricsConfig,
    ModelConfig,
    ProfilingConfig,
    TrackerConfig,
    TrainerConfig,
    TrainerSections,
    TrainingConfig,
    WatchdogConfig,
    load_config,
    read_yaml,
)

__all__ = [
    "ACTIVATION_CHECKPOINTING",
    "AUTO",
    "BACKENDS",
    "DATA_SOURCES",
    "DISTRIBUTED_PRESETS",
    "FSDP_SHARDING",
    "LR_SCALING",
    "PRECISIONS",
    "PRESETS",
    "RESUME_LATEST",
    "RESUME_NONE",
    "STRATEGIES",
    "CheckpointConfig",
    "DataConfig",
    "DistributedConfig",
    "MetricsConfig",
    "ModelConfig",
    "ProfilingConfig",
    "TrackerConfig",
    "TrainerConfig",
    "TrainerSections",
    "TrainingConfig",
    "WatchdogConfig",
    "load_config",
    "read_yaml",
]
