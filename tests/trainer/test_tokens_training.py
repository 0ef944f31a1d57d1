"""data.source tokens in the training loop: prepare -> train on real gloo ranks -> held-out evaluation; exact resumes.

Issue 11, points 2 and 3: the model's vocabulary follows the dataset's
tokenizer, the held-out loss falls, evaluation gives the same number at any
world size, and a resume at another world size reads exactly the samples an
uninterrupted run would.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import Counter

import pytest
import torch
import torch.distributed as dist
from harness import run_ranks
from tokens_corpus import documents, stdlib_globs, stdlib_texts, split_texts, stream

from brain_trainer.checkpoint import store
from brain_trainer.checkpoint.sample_log import SAMPLE_LOG_ENV
from brain_trainer.config import TrainerConfig
from brain_trainer.contract import PROGRESS_FILE_ENV, Progress
from brain_trainer.data.loader import RankAwareSampler
from brain_trainer.data.tokens.dataset import TokenDataset
from brain_trainer.data.tokens.format import read_manifest
from brain_trainer.data.tokens.prepare import main as prepare
from brain_trainer.data.tokens.source import follow_vocabulary
from brain_trainer.data.tokens.tokenizer import load_dataset_tokenizer
from brain_trainer.loop.evaluation import Evaluator, eval_batches, rank_batches
from brain_trainer.loop.train import build_and_wrap, train
from brain_trainer.model.materialize import Initializer, build
from brain_trainer.schema import ConfigError

PACKAGES = ("json", "email")
SEED, VAL_FRACTION = 0, 0.2


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    """The stdlib's json and email packages, with a 512-id BPE trained on them."""
    out = tmp_path_factory.mktemp("tokens") / "bpe"
    assert prepare([*stdlib_globs(*PACKAGES), "--out", str(out), "--train-tokenizer", "--vocab-size", "512",
                    "--val-fraction", str(VAL_FRACTION), "--seed", str(SEED)]) == 0
    return out


@pytest.fixture(scope="module")
def byte_level(tmp_path_factory):
    out = tmp_path_factory.mktemp("tokens") / "bytes"
    assert prepare([*stdlib_globs("json"), "--out", str(out), "--val-fraction", "0"]) == 0
    return out


def job(data, tmp_path, **sections):
    """A small trainer config on the dataset folder `data`; `sections` override whole keys of each section."""
    tree = {
        "model": {"preset": "minimal"},
        "training": {"steps": 150, "micro_batch_size": 8, "seq_len": 64, "learning_rate": 3e-3, "warmup_steps": 10,
                     "log_interval": 10, "seed": SEED},
        "distributed": {"strategy": "ddp"},
        "data": {"source": "tokens", "path": str(data)},
        "checkpoint": {"dir": str(tmp_path / "checkpoints"), "interval_steps": 0},
        "metrics": {"port": 0},
    }
    for section, values in sections.items():
        tree[section] = {**tree.get(section, {}), **values}
    return TrainerConfig.from_dict(tree)


def _train(rank, world_size, cfg, env):
    os.environ.update(env)
    result = train(cfg)
    return result.step, result.eval_history, result.history


def test_prepare_then_two_ranks_train_and_the_held_out_loss_falls(bpe, tmp_path):
    cfg = job(bpe, tmp_path, training={"eval_interval": 10, "eval_steps": 6})
    progress = tmp_path / "progress.json"
    ranks = run_ranks(_train, 2, cfg, {PROGRESS_FILE_ENV: str(progress)}, timeout=900)
    assert ranks[0][:2] == ranks[1][:2], "every rank gets the same all-reduced held-out loss"
    step, evals, history = ranks[0]
    assert step == 150 and [s for s, _ in evals] == list(range(10, 151, 10))
    first, last = evals[0][1], evals[-1][1]
    assert last <= 0.8 * first, f"held-out loss fell only from {first:.3f} to {last:.3f}"
    assert history[-1][1] < history[0][1]
    doc = Progress.from_json(progress.read_text())
    assert doc.step == 150 and doc.eval_loss == pytest.approx(last)
    manifest = store.read_manifest(tmp_path / "checkpoints" / store.step_dir_name(150))
    assert manifest["model"]["vocab_size"] == read_manifest(bpe).tokenizer.vocab_size == 512, "the preset follows the tokenizer"


def test_the_dataset_tokenizer_decodes_a_sample_back_to_its_source(bpe):
    manifest = read_manifest(bpe)
    tokenizer = load_dataset_tokenizer(bpe, manifest.tokenizer)
    train_texts, _ = split_texts(stdlib_texts(*PACKAGES), SEED, VAL_FRACTION)
    ds = TokenDataset(bpe, 64)
    # the samples' inputs and last targets, in order, are the split's stream: its first document is a source file
    ids = [i for k in range(len(ds)) for i in ds[k][0].tolist() + ds[k][1][-1:].tolist()]
    first_end = ids.index(manifest.tokenizer.eot_id)
    assert tokenizer.decode(ids[:first_end]) == train_texts[0]
    x, _ = ds[len(ds) // 2]  # a sample from the middle decodes to a stretch of the corpus
    assert tokenizer.decode(x.tolist()) in "<|endoftext|>".join(train_texts)
    assert [tokenizer.decode(d) for d in documents(stream(bpe, "train"), manifest.tokenizer.eot_id)] == train_texts


MICRO, GLOBAL = 2, 12  # 3 accumulation steps on 2 ranks, 2 on 3: the same 12 samples per step


def _steps(sample_log) -> dict[int, list[int]]:
    by_step: dict[int, list[int]] = {}
    for line in sample_log.read_text().splitlines():
        record = json.loads(line)
        by_step.setdefault(record["step"], []).extend(record["samples"])
    return by_step


def test_a_resume_from_two_ranks_into_three_reads_the_uninterrupted_samples(byte_level, tmp_path):
    sample_log = tmp_path / "samples.jsonl"
    env = {SAMPLE_LOG_ENV: str(sample_log)}
    training = {"micro_batch_size": MICRO, "global_batch_size": GLOBAL, "seq_len": 16, "log_interval": 2}
    first = job(byte_level, tmp_path, training={**training, "steps": 6})
    assert [r[0] for r in run_ranks(_train, 2, first, env, timeout=600)] == [6, 6]
    resumed = job(byte_level, tmp_path, training={**training, "steps": 12})
    assert [r[0] for r in run_ranks(_train, 3, resumed, env, timeout=600)] == [12, 12, 12]

    sampler = RankAwareSampler(TokenDataset(byte_level, 16), num_replicas=1, rank=0, micro_batch_size=MICRO, seed=SEED)
    uninterrupted = list(sampler)[: 12 * GLOBAL]
    taken = _steps(sample_log)
    assert sorted(taken) == list(range(1, 13)), "each step recorded once: the 3-rank run started after step 6"
    for step, samples in taken.items():
        assert Counter(samples) == Counter(uninterrupted[(step - 1) * GLOBAL : step * GLOBAL]), f"step {step}"


def test_evaluation_is_the_same_at_any_world_size(byte_level, tmp_path):
    """5 micro-batches on 3 FSDP ranks (rank 2 joins its second round's gathers without data) = one process."""
    cfg = job(byte_level, tmp_path, model={"vocab_size": 257}, distributed={"strategy": "fsdp"},
              checkpoint={"enabled": False})
    held_out = TokenDataset(byte_level, 64)
    model = build(cfg.model, SEED)
    Initializer(SEED)(model, torch.device("cpu"))
    single = Evaluator(held_out, 4, 5, 0, 1, torch.device("cpu"), contextlib.nullcontext)(model)
    assert single.tokens == 5 * 4 * 64 and model.training, "evaluation leaves the model in training mode"
    results = run_ranks(_evaluate, 3, cfg, timeout=600)
    for loss, tokens in results:
        assert tokens == single.tokens and loss == pytest.approx(single.loss, rel=1e-5)


def _evaluate(rank, world_size, cfg):
    _, model, _ = build_and_wrap(cfg, cfg.resolved().distributed, rank, world_size, torch.device("cpu"))
    result = Evaluator(TokenDataset(cfg.data.path, 64), 4, 5, rank, world_size, torch.device("cpu"),
                       contextlib.nullcontext)(model)
    assert dist.is_initialized()
    return result.loss, result.tokens


def test_evaluation_batches_are_dealt_round_robin():
    batches = eval_batches(windows=22, micro_batch_size=4, eval_steps=10)  # the split holds 5.5 micro-batches
    assert batches == [range(0, 4), range(4, 8), range(8, 12), range(12, 16), range(16, 20), range(20, 22)]
    assert eval_batches(100, 4, 2) == [range(0, 4), range(4, 8)]
    dealt = [rank_batches(batches, r, 4) for r in range(4)]
    assert dealt == [[range(0, 4), range(16, 20)], [range(4, 8), range(20, 22)], [range(8, 12), None],
                     [range(12, 16), None]]


def test_the_preset_follows_the_dataset_vocabulary_and_a_hand_set_mismatch_is_refused(byte_level, tmp_path):
    cfg = job(byte_level, tmp_path)
    assert follow_vocabulary(cfg, 257).model.vocab_size == 257
    assert follow_vocabulary(job(byte_level, tmp_path, model={"vocab_size": 257}), 257).model.vocab_size == 257
    user = job(byte_level, tmp_path, model={"entrypoint": "user_models:small_lm"})
    assert follow_vocabulary(user, 257).model.vocab_size is None, "a user model keeps its own vocabulary"
    with pytest.raises(ConfigError) as exc:
        train(job(byte_level, tmp_path, model={"vocab_size": 300}))
    assert str(exc.value.errors[0]) == (
        f"model.vocab_size: must match the dataset's tokenizer (257 ids in {byte_level}), got 300; "
        "leave it unset to follow the dataset"
    )
    assert not dist.is_initialized(), "refused before any rendezvous"


def test_vocabulary_and_evaluation_settings_are_checked_across_sections():
    def errors(tree):
        with pytest.raises(ConfigError) as exc:
            TrainerConfig.from_dict(tree)
        return [str(e) for e in exc.value.errors]

    assert errors({"training": {"eval_interval": 10}}) == [
        "training.eval_interval: evaluates on a token dataset's validation split: needs data.source tokens, got synthetic"
    ]
    assert errors({"model": {"vocab_size": 100}, "data": {"source": "files", "path": "*.txt"}}) == [
        "model.vocab_size: must be >= 256 for byte-level data (data.source files), got 100"
    ]
    assert errors({"model": {"vocab_size": 300, "entrypoint": "m:f"}}) == [
        "model.vocab_size: resizes a preset; the model of model.entrypoint has its own vocabulary"
    ]
    assert errors({"data": {"source": "tokens"}}) == ["data.path: required when source is 'tokens'"]
