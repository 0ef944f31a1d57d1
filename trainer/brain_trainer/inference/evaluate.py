"""`braintrain eval CHECKPOINT --data DIR`: loss and perplexity on a prepared dataset's whole validation split.

The trainer's own evaluation (loop/evaluation.py), on every window of the
split: the job's settings as its checkpoint recorded them (sequence length,
micro-batch, precision), its model loaded as `model.initFrom` loads it, at any
layout: one process, or every rank of a `torchrun` (`torchrun --nproc-per-node
N -m brain_trainer.inference.evaluate ...`), with `--strategy`,
`--tensor-parallel` and `--pipeline-parallel` as a job sets them. The figure
equals the trainer's own evaluation of the same weights on the same windows.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import torch.distributed as dist

from ..checkpoint.compat import MODEL
from ..config import TrainerConfig
from ..data.errors import DataError
from ..data.tokens.dataset import TokenDataset
from ..data.tokens.source import follow_vocabulary, token_split
from ..loop.evaluation import EvalResult, held_out
from ..loop.wrap import build_and_wrap
from ..parallel.ddp import ensure_process_group, use_local_device
from ..parallel.launcher import DistributedLauncher
from ..parallel.run_layout import Ranks, RunLayout
from ..schema import ConfigError
from .eval_args import add_arguments
from .loading import LoadError, origin

# Settings of the job that do not apply to an evaluation: it trains nothing, saves nothing, serves no metrics, runs at
# a layout of its own (and its micro-batch need not divide the job's global batch).
NOT_EVALUATION = ("checkpoint.", "metrics.", "watchdog.", "distributed.", "training.global_batch_size")


@dataclass(frozen=True)
class EvalLayout:
    """How the evaluation runs: the job's distributed settings that a command line may set."""

    strategy: str = "auto"
    tensor_parallel: Optional[int] = None
    pipeline_parallel: Optional[int] = None


def _nested(flat: dict[str, Any]) -> dict[str, Any]:
    """{"training.seq_len": 16} -> {"training": {"seq_len": 16}}."""
    out: dict[str, Any] = {}
    for name, value in flat.items():
        *sections, key = name.split(".")
        node = out
        for section in sections:
            node = node.setdefault(section, {})
        node[key] = value
    return out


def eval_config(checkpoint: Path, manifest: dict[str, Any], data: str | Path, seq_len: Optional[int],
                micro_batch_size: Optional[int], layout: EvalLayout) -> TrainerConfig:
    """The job's config as its checkpoint recorded it, made into an evaluation of the checkpoint on `data`."""
    settings = {k: v for k, v in (manifest.get("settings") or {}).items() if not k.startswith(NOT_EVALUATION)}
    config = _nested(settings)
    training = config.setdefault("training", {})
    training.update({k: v for k, v in (("seq_len", seq_len), ("micro_batch_size", micro_batch_size)) if v})
    pipeline = layout.pipeline_parallel or 1
    return TrainerConfig.from_dict({
        **config,
        "model": {**(manifest.get(MODEL) or {}), "init_from": str(checkpoint)},
        "data": {**config.get("data", {}), "source": "tokens", "path": str(data)},
        "distributed": {"strategy": layout.strategy, "tensor_parallel": layout.tensor_parallel,
                        "pipeline_parallel": layout.pipeline_parallel,
                        "mixed_precision_policy": settings.get("distributed.mixed_precision_policy"),
                        # a pipeline runs its stages over at least as many micro-batches as it has stages
                        "gradient_accumulation_steps": pipeline},
        "checkpoint": {"enabled": False},
        "metrics": {"port": 0},
    })


def _evaluate_rank(job: tuple[TrainerConfig, TokenDataset]) -> EvalResult:
    cfg, dataset = job
    ranks = Ranks.from_environment()
    device = use_local_device()
    with contextlib.ExitStack() as cleanup:
        if ensure_process_group(cfg.distributed, ranks.rank, ranks.world_size):
            cleanup.callback(dist.destroy_process_group)
        layout = RunLayout.resolved(cfg, ranks, device)
        wrapper, model, _ = build_and_wrap(cfg, layout)
        # as the loop's (loop/assemble.py), over every window of the split
        evaluator = held_out(dataset, cfg.training.micro_batch_size, len(dataset), layout, wrapper)
        return evaluator(model, forward=wrapper.logits)


def evaluate(cfg: TrainerConfig) -> EvalResult:
    """The evaluation on every rank of this launch (one process when nothing launched it)."""
    cfg = cfg.resolved()
    dataset = token_split(cfg.data.path, cfg.training.seq_len, "validation")
    cfg = follow_vocabulary(cfg, dataset.vocab_size)
    return DistributedLauncher(cfg.distributed).launch(_evaluate_rank, (cfg, dataset))


def evaluate_checkpoint(checkpoint: str | Path, data: str | Path, seq_len: Optional[int] = None,
                        micro_batch_size: Optional[int] = None, layout: EvalLayout = EvalLayout()) -> EvalResult:
    found = origin(checkpoint)
    if found.manifest is None:
        raise LoadError(f"{checkpoint}: an export; evaluate a checkpoint, or the export with lm-evaluation-harness")
    return evaluate(eval_config(found.path, found.manifest, str(data), seq_len, micro_batch_size, layout))


def run(args: argparse.Namespace) -> int:
    layout = EvalLayout(args.strategy, args.tensor_parallel, args.pipeline_parallel)
    try:
        result = evaluate_checkpoint(args.checkpoint, args.data, args.seq_len, args.micro_batch_size, layout)
    except (LoadError, DataError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"eval loss {result.loss:.6f} perplexity {result.perplexity:.4f} ({result.tokens} tokens, "
              f"validation split of {args.data})")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m brain_trainer.inference.evaluate",
                                     description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
