"""The training loop: torchrun end to end, world-size equivalence, and its pure helpers."""

import importlib
import json
import os
import re
import signal
import sysconfig
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from brain_trainer.checkpoint.sample_log import SAMPLE_LOG_ENV
from brain_trainer.config import DistributedConfig, TrainerConfig
from brain_trainer.contract import TERMINATION_LOG_ENV, Progress, eta_seconds, format_time, parse_termination
from brain_trainer.data.loader import ByteFileDataset, RankAwareDataLoader, SyntheticDataset
from brain_trainer.loop.optimizer import param_groups
from brain_trainer.loop.train import train
from brain_trainer.observe.progress import write_progress
from brain_trainer.parallel.run_layout import Ranks, resolve_strategy
from brain_trainer.schema import ConfigError
from harness import run_ranks
from processes import run, torchrun

LOG_LINE = re.compile(r"step (\d+)/(\d+) loss ([\d.]+) tokens/s ([\d.]+)")


def stdlib_glob() -> str:
    """Text present on every machine: the Python standard library's own sources."""
    return str(Path(sysconfig.get_paths()["stdlib"]) / "*.py")


def unigram_entropy(tokens: torch.Tensor) -> float:
    """Entropy (nats) of the byte frequencies in `tokens`: the least mean loss on them of any one distribution."""
    p = np.bincount(tokens.numpy(), minlength=256) / tokens.numel()
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def context_free_floor(dataset: ByteFileDataset, sample_log: Path, steps: range) -> float:
    """The least loss a model blind to context can log over `steps`: the mean of each step's target-byte entropy.

    Such a model gives every position one and the same next-byte distribution q, fixed within a step (its
    weights are); its loss on a step's targets is their cross entropy with q, never below their entropy.
    """
    samples: dict[int, list[int]] = {}
    for line in sample_log.read_text().splitlines():  # one line per rank and step
        record = json.loads(line)
        samples.setdefault(record["step"], []).extend(record["samples"])
    return float(np.mean([unigram_entropy(torch.cat([dataset[i][1] for i in samples[step]])) for step in steps]))


def test_torchrun_two_ranks_learn_the_stdlib_sources(tmp_path):
    """torchrun, 2 ranks: the loss falls below what any context-free model reaches; logs, progress, TensorBoard."""
    steps, seq_len = 160, 32
    config = {
        "model": {"preset": "minimal"},
        "training": {
            "steps": steps, "micro_batch_size": 8, "seq_len": seq_len, "learning_rate": 3e-3,
            "warmup_steps": 10, "log_interval": 5,
        },
        "distributed": {"strategy": "auto"},
        "data": {"source": "files", "path": stdlib_glob()},
        "checkpoint": {"dir": str(tmp_path / "checkpoints"), "interval_steps": 0},
        "metrics": {"port": 0, "tensorboard_dir": str(tmp_path / "tensorboard")},
    }
    cfg_path = tmp_path / "trainer.yaml"
    cfg_path.write_text(yaml.safe_dump(config))
    progress_path = tmp_path / "progress.json"
    proc = run(
        torchrun("-m", "brain_trainer", "--config", cfg_path), timeout=300,
        env={**os.environ, "BRAIN_PROGRESS_FILE": str(progress_path), SAMPLE_LOG_ENV: str(tmp_path / "samples.jsonl"),
             "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    logged = [(int(m[1]), float(m[3])) for m in LOG_LINE.finditer(proc.stdout)]
    assert [s for s, _ in logged] == list(range(5, steps + 1, 5)), "rank 0 alone logs, every log_interval steps"
    last = logged[-1][1]  # the mean loss of steps 156-160
    # A model that ignores context can learn at best the byte frequencies: over the corpus that costs their
    # entropy (3.15 nats, below 0.7 x ln 256 = 3.88), on the bytes scored at steps 156-160 no less than `floor`
    # (3.05). This run logs 2.45 (2.73 after 80 steps of micro-batches of 4: too near); 0.3 below both leaves it
    # 0.3 of slack, where its logged loss wanders by ~0.1 from one interval to the next.
    dataset = ByteFileDataset(stdlib_glob(), seq_len)
    corpus = unigram_entropy(dataset.tokens)
    floor = context_free_floor(dataset, tmp_path / "samples.jsonl", range(steps - 4, steps + 1))
    assert last < min(floor, corpus) - 0.3, (
        f"loss {last:.3f}; a context-free model: {floor:.3f} here, {corpus:.3f} over the corpus")
    doc = json.loads(progress_path.read_text())
    assert doc["step"] == doc["total_steps"] == steps
    assert doc["loss"] == pytest.approx(last, abs=1e-4) and doc["tokens_per_second"] > 0 and doc["eta_seconds"] == 0
    assert doc["last_checkpoint_step"] == steps, "the document is refreshed once the final save is committed"
    assert (tmp_path / "checkpoints" / f"step-{steps:08d}").is_dir()
    manifest = json.loads((tmp_path / "checkpoints" / f"step-{steps:08d}" / "manifest.json").read_text())
    assert manifest["model"] == {"preset": "minimal"} and "init_from" not in manifest
    for rank in (0, 1):  # every rank says what it holds once initialised
        assert re.search(rf"rank {rank} after init: parameters [\d.]+ MB, peak host memory [\d.]+ MB$", proc.stdout, re.M)

    # Rank 0 alone wrote TensorBoard scalars at every logging step: the logged loss, and the rest.
    assert len(list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))) == 1
    board = EventAccumulator(str(tmp_path / "tensorboard"))
    board.Reload()
    scalars = {tag: [(e.step, e.value) for e in board.Scalars(tag)] for tag in board.Tags()["scalars"]}
    assert sorted(scalars) == [
        "goodput/ratio", "train/grad_norm", "train/learning_rate", "train/loss", "train/tokens_per_second",
    ]
    assert [step for step, _ in scalars["train/loss"]] == [step for step, _ in logged]
    assert [value for _, value in scalars["train/loss"]] == pytest.approx([loss for _, loss in logged], abs=1e-4)
    assert all(value > 0 for tag in scalars for _, value in scalars[tag])
    lrs = [value for _, value in scalars["train/learning_rate"]]
    assert lrs[1] > lrs[-1], "warm-up, then cosine decay"


def _small_job(strategy, **training):
    return TrainerConfig.from_dict({
        "training": {"steps": 6, "seq_len": 16, "learning_rate": 2e-3, "warmup_steps": 2, "log_interval": 1, **training},
        "distributed": {"strategy": strategy},
        "data": {"source": "synthetic", "num_samples": 50},  # 50: epochs roll over mid-run
        "checkpoint": {"enabled": False},
        "metrics": {"port": 0},
    })


def _train_on_ranks(rank, world_size, training):
    torch.set_num_threads(1)
    result = train(_small_job("ddp", **training))
    loader = RankAwareDataLoader(SyntheticDataset(8, 4), DistributedConfig())  # rank and world from the group
    return result.step, [loss for _, loss in result.history], (loader.rank, loader.world_size)


def test_same_losses_at_any_world_size_and_accumulation(monkeypatch):
    """DDP on 2 ranks x micro-batch 2 = 1 unwrapped process x 4 = 1 x 1 x 4 accumulation: same samples, same updates."""
    two_ranks = run_ranks(_train_on_ranks, 2, {"micro_batch_size": 2})
    assert [r[2] for r in two_ranks] == [(0, 2), (1, 2)]
    assert two_ranks[0][:2] == two_ranks[1][:2], "every rank reports the same averaged loss"
    step, losses, _ = two_ranks[0]
    assert step == 6 and len(losses) == 6
    monkeypatch.setenv("RANK", "0")  # one process, without leaking launcher variables into other tests
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "0")
    for training in ({"micro_batch_size": 4}, {"micro_batch_size": 1, "global_batch_size": 4}):
        single = train(_small_job("single", **training))
        assert [loss for _, loss in single.history] == pytest.approx(losses, rel=1e-4), training


def test_a_failing_loop_gives_sigterm_back_and_says_why_before_it_cleans_up(tmp_path, monkeypatch):
    """The checkpoint manager holds SIGTERM while training; an error must not leave it swallowing the signal. The
    termination message is written before the cleanup: a peer pod's fail-fast may stop this one during it."""
    # One process; set through monkeypatch so that what train() exports does not leak into other tests.
    for key, value in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT="0").items():
        monkeypatch.setenv(key, value)

    def broken_loader(*args, **kwargs):
        raise RuntimeError("data went away")

    monkeypatch.setattr(importlib.import_module("brain_trainer.loop.assemble"), "RankAwareDataLoader", broken_loader)
    message = tmp_path / "termination-log"
    monkeypatch.setenv(TERMINATION_LOG_ENV, str(message))
    said_at_cleanup = []
    destroy = torch.distributed.destroy_process_group

    def destroy_and_look(*args, **kwargs):
        said_at_cleanup.append(parse_termination(message.read_text()) if message.exists() else None)
        destroy(*args, **kwargs)

    monkeypatch.setattr(torch.distributed, "destroy_process_group", destroy_and_look)
    cfg = TrainerConfig.from_dict({
        "training": {"steps": 2, "seq_len": 16},
        "checkpoint": {"dir": str(tmp_path / "checkpoints")},
        "metrics": {"port": 0},
    })
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(RuntimeError, match="data went away"):
        train(cfg)
    assert signal.getsignal(signal.SIGTERM) is before
    assert said_at_cleanup == [("error", "RuntimeError: data went away")]
    assert not torch.distributed.is_initialized(), "the process group train() created is destroyed"


def test_single_strategy_refuses_more_than_one_rank():
    cfg = TrainerConfig.from_dict({"distributed": {"strategy": "single"}})
    with pytest.raises(ConfigError) as exc:
        resolve_strategy(cfg, Ranks(0, 2, 2), torch.device("cpu"))
    assert exc.value.errors[0].path == "distributed.strategy" and "world size is 2" in str(exc.value)
    assert resolve_strategy(cfg, Ranks(0, 1, 1), torch.device("cpu")).strategy == "single"


def test_weight_decay_only_on_matrices():
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    decay, no_decay = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert {p.ndim for p in decay["params"]} == {2} and len(decay["params"]) == 2
    assert {p.ndim for p in no_decay["params"]} == {1} and len(no_decay["params"]) == 3


def _progress(**overrides):
    fields = dict(step=40, total_steps=100, loss=2.5, tokens_per_second=1234.5, eta_seconds=12.0,
                  last_checkpoint_step=None, updated_at="2026-01-02T03:04:05Z")
    return Progress(**{**fields, **overrides})


def test_progress_document_fields_and_eta():
    doc = json.loads(_progress(last_checkpoint_step=40).to_json())
    assert doc == {"step": 40, "total_steps": 100, "loss": 2.5, "tokens_per_second": 1234.5, "eta_seconds": 12.0,
                   "last_checkpoint_step": 40, "updated_at": "2026-01-02T03:04:05Z"}
    assert eta_seconds(40, 100, 0.5) == 30.0 and eta_seconds(100, 100, 0.5) == 0 and eta_seconds(120, 100, 1.0) == 0
    assert format_time(datetime(2026, 5, 6, 7, 8, 9, 999, tzinfo=timezone.utc)) == "2026-05-06T07:08:09Z"


def test_progress_file_is_replaced_atomically(tmp_path):
    path = tmp_path / "progress.json"
    write_progress(str(path), _progress(step=1))
    write_progress(str(path), _progress(step=2))
    assert json.loads(path.read_text())["step"] == 2
    assert [p.name for p in tmp_path.iterdir()] == ["progress.json"], "no temp file left behind"
    unserialisable = _progress(loss=object())
    with pytest.raises(TypeError):
        write_progress(str(path), unserialisable)
    assert json.loads(path.read_text())["step"] == 2 and len(list(tmp_path.iterdir())) == 1
