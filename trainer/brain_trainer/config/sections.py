"""The trainer's configuration: a typed tree loaded from trainer.yaml.

Torch-free: the operator embeds these sections in the BrainTrainingJob spec
(camelCase there, snake_case in trainer.yaml: the same tree), renders them
into a ConfigMap, and its memory planner reads them. docs/architecture.md,
"One declaration per setting".
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator, Optional

import yaml

from ..contract import METRICS_PORT
from ..schema import ConfigError, FieldError, Names, from_dict, quoted, setting, to_dict, trainer_spelling
from ..uris import is_uri, place_problem, uri_problem
from . import kubeyaml
from .presets import MODEL_PRESETS, VOCAB_SIZE, pipeline_unit_count

PRESETS = tuple(MODEL_PRESETS)
STRATEGIES = ("auto", "single", "ddp", "fsdp")
FSDP_SHARDING = ("full_shard", "shard_grad_op", "no_shard", "hybrid_shard")
BACKENDS = ("auto", "nccl", "gloo")
PRECISIONS = ("fp32", "bf16", "fp16")
DATA_SOURCES = ("synthetic", "files", "tokens")
LR_SCALING = ("none", "linear")
ACTIVATION_CHECKPOINTING = ("none", "full", "selective")
# tensor and pipeline parallelism compose with FSDP2 over the data-parallel dimension of one mesh
TP_STRATEGIES = ("auto", "fsdp")
PIPELINE_SCHEDULES = ("1f1b", "gpipe", "interleaved-1f1b")
INTERLEAVED = "interleaved-1f1b"  # the schedule that runs several (virtual) stages per pipeline rank
# checkpoint.interval_steps chosen by the Young/Daly rule (checkpoint/cadence.py).
AUTO = "auto"
# checkpoint.resume_from: the newest committed checkpoint, or none (from scratch); else a committed step.
RESUME_LATEST, RESUME_NONE = "latest", "none"
ENTRYPOINT_PATTERN = r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*"


@dataclass
class ModelConfig:
    """Which network to train."""

    preset: str = setting("minimal", choices=PRESETS, help="BrainAI reference model size")
    entrypoint: Optional[str] = setting(
        None,
        pattern=ENTRYPOINT_PATTERN,
        help="package.module:function returning an nn.Module; replaces the preset",
    )
    init_from: Optional[str] = setting(
        None,
        help="start from these weights (optimizer and data position start fresh): a committed checkpoint folder, "
        "or a safetensors file or folder (model.safetensors, or an index with shards); the pods must see the path; "
        "or s3://bucket/prefix: a committed checkpoint step in an object store, or its checkpoint.dir (the newest)",
    )
    vocab_size: Optional[int] = setting(
        None,
        minimum=2,
        help="token ids the preset embeds and predicts; default: the dataset tokenizer's (data.source tokens), "
        "else 256 bytes; set by hand it must match the dataset's",
    )

    def check(self, name: Names) -> Iterator[tuple[str, str]]:
        problem = place_problem(self.init_from) if self.init_from else None
        if problem is not None:
            yield "init_from", problem


@dataclass
class TrainingConfig:
    """The optimisation loop."""

    steps: int = setting(200, minimum=1, help="optimizer steps in total")
    micro_batch_size: int = setting(8, minimum=1, help="sequences per rank per forward pass")
    global_batch_size: Optional[int] = setting(
        None,
        minimum=1,
        help="sequences per optimizer step over all ranks; derives gradient accumulation",
    )
    seq_len: int = setting(128, minimum=2, help="tokens per sequence")
    learning_rate: float = setting(3e-4, minimum=0, exclusive_minimum=True, help="peak learning rate")
    min_lr_ratio: float = setting(0.1, minimum=0, maximum=1, help="cosine decay floor as a fraction of the peak")
    warmup_steps: int = setting(10, minimum=0, help="linear warmup steps")
    lr_scaling: str = setting("none", choices=LR_SCALING, help="linear: scale the LR by effective batch / reference batch size")
    reference_batch_size: int = setting(256, minimum=1, help="batch at which the learning rate was tuned")
    weight_decay: float = setting(0.1, minimum=0)
    grad_clip: float = setting(1.0, minimum=0, help="max gradient norm; 0 disables clipping")
    seed: int = setting(0, minimum=0)
    log_interval: int = setting(10, minimum=1, help="steps between rank-0 log lines")
    compile: bool | str = setting(
        AUTO, choices=(AUTO,), help=f"torch.compile each block: true, false or {AUTO} (on CUDA, off on CPU); "
        "a compile that fails trains eager",
    )
    eval_interval: int = setting(
        0, minimum=0, help="steps between held-out evaluations on the validation split (data.source tokens), "
        "and one at the last step; 0: none",
    )
    eval_steps: int = setting(
        20, minimum=1, help="micro-batches each evaluation reads, dealt across the ranks: the same validation windows at any world size",
    )

    def compiles(self, device_type: str) -> bool:
        """Whether the blocks are compiled on this device: `auto` on CUDA only, where inductor's fused kernels
        pay for the compile (docs/model.md); on CPU it costs minutes of C++ builds for little."""
        return device_type == "cuda" if self.compile == AUTO else bool(self.compile)

    def logs_at(self, step: int) -> bool:
        """Whether optimizer step `step` is a logging step: every log_interval steps, and the last."""
        return step % self.log_interval == 0 or step == self.steps

    def check(self, name: Names) -> Iterator[tuple[str, str]]:
        if self.global_batch_size is not None and self.global_batch_size % self.micro_batch_size:
            yield (
                "global_batch_size",
                f"must be a multiple of {name('micro_batch_size')} ({self.micro_batch_size}), got {self.global_batch_size}",
            )


# The distributed settings a model preset recommends for the fields a job leaves unset.
RECOMMENDED_FIELDS = ("fsdp_sharding", "activation_checkpointing", "cpu_offload", "mixed_precision_policy")
# Under strategy auto the memory planner turns these on as rungs of its ladder: they start off.
PLANNED_FIELDS = {"activation_checkpointing": "none", "cpu_offload": False}


@dataclass
class DistributedConfig:
    """How the model is spread over ranks; unset fields take the model preset's recommendation.

    The seed's public contract, every field kept. Unset (null) fsdp_sharding, activation_checkpointing, cpu_offload and
    mixed_precision_policy take the model preset's recommendation (`resolved`).
    The world layout (num_nodes, node_rank, master_addr, master_port) serves a
    manual launch; under torchrun or SLURM their environment gives it.
    """

    strategy: str = setting("auto", choices=STRATEGIES, help="auto asks the memory planner")
    fsdp_sharding: Optional[str] = setting(None, choices=FSDP_SHARDING, help="default: the model preset's")
    gradient_accumulation_steps: int = setting(1, minimum=1, help="micro-batches per optimizer step")
    find_unused_parameters: bool = setting(False, help="DDP: allow parameters that get no gradient in a step")
    sync_batchnorm: bool = setting(True, help="synchronise BatchNorm statistics across ranks (CUDA only)")
    backend: str = setting("auto", choices=BACKENDS, help="auto: nccl when CUDA is available, else gloo")
    num_nodes: int = setting(1, minimum=1, derived=True, help="nodes of a manual launch")
    node_rank: int = setting(0, minimum=0, derived=True, help="this node's index in a manual launch")
    master_addr: str = setting("localhost", derived=True, help="rank 0's host in a manual launch")
    master_port: int = setting(29500, minimum=1, maximum=65535, derived=True, help="rank 0's port in a manual launch")
    activation_checkpointing: Optional[str] = setting(
        None,
        choices=ACTIVATION_CHECKPOINTING,
        help="recompute activations in backward, per block: none, full (every block) or selective "
        "(every k-th block, k: the setting below); default: the model preset's",
    )
    activation_checkpointing_every: int = setting(2, minimum=1, help="selective: checkpoint every k-th block")
    cpu_offload: Optional[bool] = setting(None, help="FSDP: keep sharded states in host memory; default: the model preset's")
    mixed_precision_policy: Optional[str] = setting(
        None, choices=PRECISIONS, help="fp32, bf16 or fp16; default: the model preset's"
    )
    timeout_seconds: int = setting(1800, minimum=1, help="collective timeout of the process group (init_process_group)")
    preflight_seconds: float = setting(
        60.0, minimum=0, help="before the first step every rank joins one small all-reduce and a barrier within this "
        "long, else the job fails as network-error naming the ranks missing; 0: no preflight"
    )

    tensor_parallel: Optional[int] = setting(
        None, minimum=1, help="ranks that split each reasoning and decision block's matmuls (attention heads, gated-MLP "
        "width); must divide nprocPerNode; data parallelism gets the rest: world size / tensorParallel; unset: 1, "
        "or under strategy auto the smallest that fits the device memory"
    )

    pipeline_parallel: Optional[int] = setting(
        None, minimum=1, help="pipeline stages the model is cut into at block boundaries, one group of ranks each; "
        "gradient accumulation becomes the pipeline's micro-batches (at least this many); unset: 1, or under strategy "
        "auto what the planner needs after tensorParallel"
    )
    pipeline_schedule: str = setting(
        "1f1b", choices=PIPELINE_SCHEDULES, help="the order of the micro-batches' forward and backward passes: 1f1b "
        "(one activation set per stage in flight), gpipe (all forwards, then all backwards) or interleaved-1f1b "
        "(virtualStages stages per rank: a smaller bubble, more messages)"
    )
    virtual_stages: Optional[int] = setting(
        None, minimum=1, help="stages per pipeline rank; interleaved-1f1b only; unset: 2 under interleaved-1f1b, else 1"
    )

    @property
    def tp(self) -> int:
        """The tensor-parallel degree: tensor_parallel, 1 when unset (auto's choice comes back set)."""
        return self.tensor_parallel or 1

    @property
    def pp(self) -> int:
        """The pipeline-parallel degree: pipeline_parallel, 1 when unset (auto's choice comes back set)."""
        return self.pipeline_parallel or 1

    @property
    def stages_per_rank(self) -> int:
        """Pipeline stages each pipeline rank runs: virtual_stages, else 2 under interleaved-1f1b, else 1."""
        if self.virtual_stages is not None:
            return self.virtual_stages
        return 2 if self.pipeline_schedule == INTERLEAVED else 1

    def check(self, name: Names) -> Iterator[tuple[str, str]]:
        if self.node_rank >= self.num_nodes:
            yield "node_rank", f"must be < {name('num_nodes')} ({self.num_nodes}), got {self.node_rank}"
        if self.tp > 1 and self.strategy not in TP_STRATEGIES:
            yield (
                "tensor_parallel",
                f"{self.tp} needs {name('strategy')} fsdp or auto (FSDP2 shards the data-parallel "
                f"dimension), got {self.strategy}",
            )
        if self.pp > 1 and self.strategy not in TP_STRATEGIES:
            yield (
                "pipeline_parallel",
                f"{self.pp} needs {name('strategy')} fsdp or auto (FSDP2 shards each stage over the data-parallel "
                f"dimension), got {self.strategy}",
            )
        if self.pp > 1 and self.mixed_precision_policy == "fp16":
            yield (
                "mixed_precision_policy",
                f"fp16 needs a gradient scaler around each micro-batch's backward, which the pipeline schedules of "
                f"{name('pipeline_parallel')} {self.pp} run themselves: use bf16",
            )
        if self.virtual_stages is not None and self.virtual_stages > 1 and self.pipeline_schedule != INTERLEAVED:
            yield (
                "virtual_stages",
                f"{self.virtual_stages} stages per rank need {name('pipeline_schedule')} {INTERLEAVED}, "
                f"got {self.pipeline_schedule}",
            )
        if self.virtual_stages == 1 and self.pipeline_schedule == INTERLEAVED:
            yield "virtual_stages", f"{INTERLEAVED} runs several stages per rank: needs >= 2, got 1"

    @classmethod
    def preset(cls, scale: str) -> "DistributedConfig":
        """The recommended settings for a model scale (minimal, 1b, 3b, 7b, 13b, 70b)."""
        if scale not in DISTRIBUTED_PRESETS:
            raise ConfigError([FieldError("model.preset", f"must be one of {', '.join(PRESETS)}; got {quoted(scale)}")])
        return replace(DISTRIBUTED_PRESETS[scale])

    def resolved(self, preset: str = "minimal") -> "DistributedConfig":
        """Unset fields filled with `preset`'s recommendation; idempotent.

        A preset's recommendation applies to an explicitly chosen strategy:
        under `auto` the planner adds checkpointing and offload when needed.
        """
        recommended = DISTRIBUTED_PRESETS[preset]
        filled = {
            field_name: PLANNED_FIELDS[field_name]
            if self.strategy == "auto" and field_name in PLANNED_FIELDS
            else getattr(recommended, field_name)
            for field_name in RECOMMENDED_FIELDS
            if getattr(self, field_name) is None
        }
        return replace(self, **filled) if filled else self

    def resolved_backend(self, cuda_available: bool) -> str:
        if self.backend == "auto":
            return "nccl" if cuda_available else "gloo"
        return self.backend


DISTRIBUTED_PRESETS: dict[str, DistributedConfig] = {
    name: DistributedConfig(**{"fsdp_sharding": "full_shard", "activation_checkpointing": "none", "cpu_offload": False,
                               "mixed_precision_policy": "fp32", **recommended})
    for name, recommended in {
        "minimal": {"strategy": "ddp"},
        "1b": {"strategy": "ddp", "mixed_precision_policy": "bf16"},
        "3b": {"strategy": "fsdp", "fsdp_sharding": "shard_grad_op", "mixed_precision_policy": "bf16"},
        "7b": {"strategy": "fsdp", "mixed_precision_policy": "bf16", "activation_checkpointing": "full"},
        "13b": {"strategy": "fsdp", "mixed_precision_policy": "bf16", "activation_checkpointing": "full"},
        "70b": {"strategy": "fsdp", "mixed_precision_policy": "bf16", "activation_checkpointing": "full"},
    }.items()
}


@dataclass
class DataConfig:
    """Where training sequences come from."""

    source: str = setting(
        "synthetic", choices=DATA_SOURCES,
        help="synthetic; files: a glob of text files read as bytes; tokens: a folder `braintrain prepare` made",
    )
    path: Optional[str] = setting(None, help="files: a glob of text files; tokens: the dataset folder, or its "
                                             "s3://bucket/prefix")
    num_workers: int = setting(0, minimum=0, help="DataLoader worker processes per rank")
    num_samples: int = setting(65536, minimum=1, help="sequences in the synthetic dataset (one epoch)")

    def check(self, name: Names) -> Iterator[tuple[str, str]]:
        if self.source in ("files", "tokens") and not self.path:
            yield "path", f"required when source is {self.source!r}"
        if self.path and self.source == "files" and is_uri(self.path):
            yield "path", f"source 'files' reads local files only, got {quoted(self.path)}"
        elif self.path and self.source == "tokens" and is_uri(self.path):
            problem = uri_problem(self.path)
            if problem is not None:
                yield "path", problem


@dataclass
class CheckpointConfig:
    """Sharded, atomically committed, resumable checkpoints."""

    dir: str = setting("checkpoints", derived=True, help="folder holding step-XXXXXXXX/ checkpoints (the checkpoint mount), "
                  "or s3://bucket/prefix (docs/checkpoints.md, \"On object storage\")")
    interval_steps: int | str = setting(
        50, help=f"steps between checkpoints; 0 saves only at the end; {AUTO}: Young/Daly's optimum from the measured "
        "checkpoint stall, the step time and mtbfMinutes"
    )
    mtbf_minutes: Optional[float] = setting(
        None, minimum=0, exclusive_minimum=True,
        help=f"mean time between failures for intervalSteps {AUTO}; default: the run's own (its wall time over its "
        "restarts) once it has restarted, else a day",
    )
    keep_last: int = setting(3, minimum=1, help="committed checkpoints to keep")
    async_save: bool = setting(True, key="async", help="save in the background; the loop stalls only for staging")
    preemption_vote_seconds: float = setting(1.0, minimum=0, help="seconds between the ranks' votes on whether one got SIGTERM; "
                                       "0 votes after every step")
    enabled: bool = setting(True, help="false: never save nor resume")
    resume_from: int | str = setting(
        RESUME_LATEST,
        help=f"where a run starts: {RESUME_LATEST} (the newest committed checkpoint), {RESUME_NONE} (from scratch) "
        "or a committed step; checkpoints in the way are moved aside into a set-aside-* folder, never deleted; "
        "applied once per run (its restarts continue from their own checkpoints)",
    )
    lease_seconds: float = setting(
        60.0, minimum=0, exclusive_minimum=True,
        help="a running job holds its checkpoint folder by renewing a lease every quarter of this; another job may take "
        "the folder once the lease is released (the job ended or was preempted) or this long after its last renewal",
    )

    def check(self, name: Names) -> Iterator[tuple[str, str]]:
        steps = self.interval_steps
        if isinstance(steps, str) and steps != AUTO or isinstance(steps, int) and steps < 0:
            yield "interval_steps", f"must be a number of steps >= 0 or {AUTO}, got {quoted(steps)}"
        problem = place_problem(self.dir)
        if problem is not None:
            yield "dir", problem
        if self.resume_from not in (RESUME_LATEST, RESUME_NONE) and self.resume_step() is None:
            yield "resume_from", f"must be {RESUME_LATEST}, {RESUME_NONE} or a step >= 0, got {quoted(self.resume_from)}"

    def local_folder(self) -> Optional[Path]:
        """checkpoint.dir as a local folder, for the run's side files (goodput ledger, profiles); None on a bucket."""
        return None if is_uri(self.dir) else Path(self.dir)

    def resume_step(self) -> Optional[int]:
        """The step `resume_from` names (a number, or its digits as text: a quoted manifest value), else None."""
        value = self.resume_from
        if isinstance(value, str) and value.isascii() and value.isdigit():
            return int(value)
        return value if isinstance(value, int) and value >= 0 else None


TRACKER_TYPES = ("mlflow", "wandb")
# which of a tracker's settings belong to which type (the others are refused)
TRACKER_FIELDS = {"mlflow": ("tracking_uri", "experiment"), "wandb": ("project", "entity", "offline")}


@dataclass
class TrackerConfig:
    """One experiment tracker rank 0 also logs to; credentials come from the environment (a Secret through the pod
    overlay), never from here."""

    type: str = setting("mlflow", choices=TRACKER_TYPES, help="mlflow or wandb (Weights & Biases)")
    tracking_uri: Optional[str] = setting(
        None, help="mlflow: the tracking server (http://...) or a local store (a path, sqlite:///...); "
        "default: MLFLOW_TRACKING_URI")
    experiment: Optional[str] = setting(None, help="mlflow: the experiment's name; default: MLflow's default experiment")
    project: Optional[str] = setting(None, help="wandb: the project; default: WANDB_PROJECT")
    entity: Optional[str] = setting(None, help="wandb: the team or user; default: WANDB_ENTITY or the key's own")
    offline: bool = setting(False, help="wandb: write the run to files only (`wandb sync` uploads them later)")
    run_name: Optional[str] = setting(None, help="the run's name; default: the job's name")
    tags: dict[str, str] = setting(default_factory=dict, help="added to the run's tags")
    settings: dict[str, str] = setting(
        default_factory=dict, help="the client's own settings: wandb.Settings fields for wandb, MLFLOW_* environment "
        "variables for mlflow")

    def check(self, name: Names) -> Iterator[tuple[str, str]]:
        for other, fields in TRACKER_FIELDS.items():
            for f in fields if other != self.type else ():
                value = getattr(self, f)
                if value not in (None, False):
                    yield f, f"is a {other} setting; this tracker is {self.type}, got {quoted(value)}"


@dataclass
class MetricsConfig:
    """What rank 0 reports: its endpoint (Prometheus metrics, the progress document), TensorBoard, the trackers."""

    port: int = setting(METRICS_PORT, minimum=0, maximum=65535, derived=True, help="rank 0 serves /metrics and /progress here; 0 disables")
    bind_address: str = setting(
        "127.0.0.1", derived=True,
        help="the address rank 0's endpoint listens on: this machine only by default (braintrain run); the operator "
        "writes 0.0.0.0 in a pod, whose NetworkPolicy says who may connect (docs/security.md)",
    )
    tensorboard_dir: Optional[str] = setting(
        None, help="rank 0 writes TensorBoard scalars (loss, eval loss, learning rate, tokens/s, gradient norm, MFU, goodput) "
        "into this folder; "
        "in a cluster, a path on a mounted volume such as the checkpoint claim"
    )
    peak_flops: Optional[float] = setting(
        None, minimum=0, exclusive_minimum=True,
        help="peak FLOP/s of one device, for the MFU metric; default: the bf16 dense figure of a known GPU, none on CPU",
    )
    trackers: list[TrackerConfig] = setting(
        default_factory=list, help="experiment trackers (MLflow, Weights & Biases) rank 0 also logs the TensorBoard "
        "scalars, the resolved config and the job's name, uid and restarts to; a failing tracker warns once and never "
        "stops training"
    )


PROFILER_ACTIVITIES = ("cpu", "cuda")


@dataclass
class ProfilingConfig:
    """A torch.profiler trace of a window of steps, every rank's beside the checkpoints."""

    start_step: Optional[int] = setting(
        None, minimum=1, help="the first optimizer step traced; unset: no profile (and no profiler: no overhead)")
    steps: int = setting(3, minimum=1, help="optimizer steps traced from startStep on")
    activities: list[str] = setting(
        default_factory=lambda: list(PROFILER_ACTIVITIES),
        help="what is traced: cpu (operators on the host), cuda (kernels; where CUDA is present)")
    memory: bool = setting(False, help="also record tensor allocations and frees (the trace's memory view)")
    record_shapes: bool = setting(False, help="also record each operator's input shapes")

    def check(self, name: Names) -> Iterator[tuple[str, str]]:
        for i, activity in enumerate(self.activities):
            if activity not in PROFILER_ACTIVITIES:
                yield f"activities[{i}]", f"must be one of {', '.join(PROFILER_ACTIVITIES)}, got {quoted(activity)}"


@dataclass
class WatchdogConfig:
    """The hang watchdog: a rank whose optimizer steps stop dumps its stacks and exits, so torchrun restarts the group."""

    enabled: bool = setting(True, help="watch every rank for a step that does not finish")
    step_time_factor: float = setting(
        10.0, minimum=1, help="a step is stalled after this many times the median step time (or floorSeconds if longer)"
    )
    floor_seconds: float = setting(300.0, minimum=0, exclusive_minimum=True, help="the shortest limit of a step")
    warmup_steps: int = setting(
        5, minimum=1, help="the first steps of every (re)start, which build, restore, compile: each gets startupSeconds"
    )
    startup_seconds: float = setting(
        1800.0, minimum=0, exclusive_minimum=True, help="the limit of each warm-up step, from the start to its end"
    )
    checkpoint_seconds: float = setting(
        1800.0, minimum=0, exclusive_minimum=True, help="the limit of a checkpoint save the loop waits for"
    )


@dataclass
class TrainerSections:
    """The sections trainer.yaml and a BrainTrainingJob's spec share, under the same names, with the rules across them."""

    model: ModelConfig = field(default_factory=ModelConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    data: DataConfig = field(default_factory=DataConfig)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    profiling: ProfilingConfig = field(default_factory=ProfilingConfig)

    def check(self, name: Names) -> Iterator[tuple[str, str]]:
        if self.model.entrypoint is None:
            longest = MODEL_PRESETS[self.model.preset].max_seq_len
            if self.training.seq_len > longest:
                yield (
                    "training.seq_len",
                    f"must be <= {longest} (the {self.model.preset} preset's max_seq_len), got {self.training.seq_len}",
                )
        if self.model.vocab_size is not None and self.model.entrypoint is not None:
            yield "model.vocab_size", f"resizes a preset; the model of {name('model.entrypoint')} has its own vocabulary"
        if self.model.vocab_size is not None and self.data.source != "tokens" and self.model.vocab_size < VOCAB_SIZE:
            yield (
                "model.vocab_size",
                f"must be >= {VOCAB_SIZE} for byte-level data ({name('data.source')} {self.data.source}), got {self.model.vocab_size}",
            )
        if self.training.eval_interval and self.data.source != "tokens":
            yield (
                "training.eval_interval",
                f"evaluates on a token dataset's validation split: needs {name('data.source')} tokens, got {self.data.source}",
            )
        tp = self.distributed.tp
        if self.model.entrypoint is None and tp > 1:
            model = MODEL_PRESETS[self.model.preset]
            if model.n_heads % tp:
                yield "distributed.tensor_parallel", f"{tp} does not divide the {self.model.preset} preset's {model.n_heads} attention heads"
            elif model.ffn_hidden % tp:
                yield "distributed.tensor_parallel", f"{tp} does not divide the {self.model.preset} preset's gated-MLP width {model.ffn_hidden}"
        if tp > 1 and self.training.seq_len % tp:
            # sequence parallelism (parallel/tensor.py) gives each tp rank an equal share of every sequence
            yield (
                "training.seq_len",
                f"must be a multiple of {name('distributed.tensor_parallel')} ({tp}), got {self.training.seq_len}",
            )
        stages = self.distributed.pp * self.distributed.stages_per_rank
        if self.model.entrypoint is not None and self.distributed.pp > 1:
            yield (
                "distributed.pipeline_parallel",
                f"cuts a model.preset's BrainAI at its block boundaries; the model of {name('model.entrypoint')} is "
                f"not cut, got {self.distributed.pp}",
            )
        if self.model.entrypoint is None and stages > 1:
            units = pipeline_unit_count(MODEL_PRESETS[self.model.preset])
            if stages > units:
                yield (
                    "distributed.pipeline_parallel",
                    f"{self.distributed.pp} ranks x {self.distributed.stages_per_rank} stages each = {stages} stages, "
                    f"more than the {self.model.preset} preset's {units} blocks to cut between",
                )
        if self.training.global_batch_size is not None and self.distributed.gradient_accumulation_steps != 1:
            yield (
                "distributed.gradient_accumulation_steps",
                f"set either {name('training.global_batch_size')} or {name('distributed.gradient_accumulation_steps')}, not both",
            )


@dataclass
class TrainerConfig(TrainerSections):
    """Everything `python -m brain_trainer --config FILE` needs."""

    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)

    def resolved(self) -> "TrainerConfig":
        """The config with the model preset's recommendations in the unset distributed fields; idempotent."""
        distributed = self.distributed.resolved(self.model.preset)
        return self if distributed is self.distributed else replace(self, distributed=distributed)

    def data_parallel(self, world_size: int) -> int:
        """Ranks reading different batches: the tensor-parallel ranks of a group, and the stages of a pipeline, read
        the same one."""
        return max(world_size // (self.distributed.tp * self.distributed.pp), 1)

    def accumulation_steps(self, world_size: int) -> int:
        """Micro-steps per optimizer step at this world size."""
        gbs = self.training.global_batch_size
        if gbs is None:
            return self.distributed.gradient_accumulation_steps
        per_step = self.training.micro_batch_size * self.data_parallel(world_size)
        if gbs % per_step:
            raise ConfigError(
                [
                    FieldError(
                        "training.global_batch_size",
                        f"must be a multiple of micro_batch_size x data-parallel ranks ({per_step}), got {gbs}",
                    )
                ]
            )
        return gbs // per_step

    def effective_batch_size(self, world_size: int) -> int:
        return self.training.micro_batch_size * self.accumulation_steps(world_size) * self.data_parallel(world_size)

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    def to_yaml(self) -> str:
        return kubeyaml.dump(self.to_dict())

    def config_hash(self) -> str:
        """A stable digest of the settings a user declares, recorded in checkpoint manifests.

        The manifest view: derived fields (checkpoint folder, metrics port, world
        layout) differ between a cluster and a laptop without changing the run.
        """
        canonical = json.dumps(to_dict(self, camel_case=True), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    @classmethod
    def from_dict(cls, data: Any) -> "TrainerConfig":
        """The trainer view; a key spelled as a manifest spells it (microBatchSize) means its snake_case field."""
        return from_dict(cls, trainer_spelling(cls, data))


def read_yaml(path: str | Path) -> Any:
    """The YAML document in `path` (read as kubectl reads it, kubeyaml); one ConfigError line when it cannot be read or parsed."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        problem = f"cannot read: {exc.strerror}"
    except UnicodeDecodeError as exc:
        problem = f"not UTF-8 text: {exc.reason} at byte {exc.start}"
    else:
        try:
            return kubeyaml.load(text)
        except yaml.YAMLError as exc:
            problem = f"not valid YAML: {' '.join(str(exc).split())}"  # one line, however long the mark
    raise ConfigError([FieldError("", f"{path}: {problem}")])


def load_config(path: str | Path) -> TrainerConfig:
    """Read and validate a trainer.yaml; raises ConfigError naming each bad field."""
    return TrainerConfig.from_dict(read_yaml(path))
