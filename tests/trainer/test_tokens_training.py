"""data.source tokens in the training loop: prepare -> train on real gloo ranks -> held-out evaluation; exact resumes.

Issue 11, points 2 and 3: the model's vocabulary follows the dataset's
tokenizer, the held-out loss falls, evaluation gives its windows' true mean
token loss (computed apart, in one process) at any world size, and a resume at
another world size reads exactly the samples an uninterrupted run would.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import Counter

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from harness import run_ranks
from torch import nn
from tokens_corpus import documents, stdlib_globs, stdlib_texts, split_texts, stream

from brain_trainer.checkpoint import store
from brain_trainer.checkpoint.manager import load_model
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
from brain_trainer.loop.train import train
from brain_trainer.loop.wrap import build_and_wrap
from brain_trainer.model.brain_ai import build_model
from brain_trainer.model.materialize import Initializer, build
from brain_trainer.parallel import build_layout
from brain_trainer.parallel.pipeline import PipelineWrapper
from brain_trainer.parallel.run_layout import RunLayout
from brain_trainer.schema import ConfigError

PACKAGES = ("json", "email")
SEED, VAL_FRACTION, VOCAB = 0, 0.2, 512


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    """The stdlib's json and email packages, with a VOCAB-id BPE trained on them."""
    out = tmp_path_factory.mktemp("tokens") / "bpe"
    assert prepare([*stdlib_globs(*PACKAGES), "--out", str(out), "--train-tokenizer", "--vocab-size", str(VOCAB),
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


@torch.no_grad()
def summed_token_loss(model: nn.Module, windows: TokenDataset, count: int) -> tuple[float, int]:
    """(next-token cross entropy summed in float64, target tokens) over windows 0 .. count-1: one process, one window
    at a time, without the Evaluator: what a held-out evaluation of those windows must give."""
    was_training = model.training
    model.eval()
    total, tokens = 0.0, 0
    for i in range(count):
        x, y = windows[i]
        total += F.cross_entropy(model(x[None])[0].float(), y, reduction="sum").item()  # a Python float: float64
        tokens += y.numel()
    model.train(was_training)
    return total, tokens


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")  # load_model, here in one process
def test_prepare_then_two_ranks_train_and_the_held_out_loss_falls(bpe, tmp_path):
    """Two DDP ranks train on a prepared BPE dataset; the held-out loss falls and is the saved weights' true loss."""
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
    final = tmp_path / "checkpoints" / store.step_dir_name(150)
    manifest = store.read_manifest(final)
    assert manifest["model"]["vocab_size"] == read_manifest(bpe).tokenizer.vocab_size == VOCAB, "the preset follows it"

    # The last held-out loss is that of the step-150 weights on the first 6 x 8 validation windows, computed here.
    model = build_model(follow_vocabulary(cfg, VOCAB).model)
    load_model(final, model)
    total, tokens = summed_token_loss(model, TokenDataset(bpe, 64, "validation"), 6 * 8)
    assert last == pytest.approx(total / tokens, rel=1e-6)


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


PENALTY = 32.0  # nats: what RepeatGuesser's wrong guess costs, times (1 + the target's id)


class RepeatGuesser(nn.Module):
    """Certain that each token repeats: logit 0 for the input token, -PENALTY x (1 + b) for every other id b.

    So each next-token loss is an exact integer: 0 where the token repeats, else PENALTY x (1 + target).
    log-sum-exp is exactly 0 in float32: the other terms, at most VOCAB x e^-32 ~ 7e-12 together, vanish
    next to the 1 (float32 spacing there: 1.2e-7). A micro-batch's sum is an integer below 256 x 32 x VOCAB
    = 2**22, exact in float32; sums of such integers are exact in float64 in any order and grouping; the
    token count is an integer. The evaluation's loss, sum / count, therefore cannot depend on how the
    micro-batches are dealt to ranks, not even in its last bit: any difference is an arithmetic error.
    """

    def __init__(self, vocab_size: int = VOCAB):
        super().__init__()
        self.penalty = nn.Parameter(torch.empty(vocab_size))  # a parameter: FSDP gathers it in every forward

    def reset_parameters(self) -> None:
        nn.init.constant_(self.penalty, PENALTY)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        vocab = self.penalty.numel()
        cost = self.penalty * torch.arange(1, vocab + 1, device=tokens.device)  # PENALTY x (1 + b)
        return -cost * (1 - F.one_hot(tokens, vocab))  # (B, T, V)


def test_evaluation_is_the_mean_token_loss_of_its_windows_at_any_world_size(bpe, tmp_path):
    """On 1, 2 and 3 FSDP ranks the held-out loss is the validation windows' mean token loss, computed here.

    5 micro-batches of 4 windows: on 2 ranks rank 1, on 3 ranks rank 2, has none in the last round and
    joins its parameter gathers without data. RepeatGuesser's loss must match to the last bit (a mean of
    per-rank or per-batch means cannot); BrainAI's (seeded: bitwise the same weights at every world size)
    to float32 rounding: its per-batch and per-window float32 sums differ by ~2e-8 relative here.
    """
    cfgs = {name: job(bpe, tmp_path, model=model, training={"micro_batch_size": 4, "eval_steps": 5},
                      distributed={"strategy": "fsdp"}, checkpoint={"enabled": False})
            for name, model in (("guesser", {"entrypoint": f"{__name__}:RepeatGuesser"}),
                                ("brain_ai", {"vocab_size": VOCAB}))}
    windows = TokenDataset(bpe, 64, "validation")
    expected, evaluated = {}, {1: {}}  # (summed loss, tokens); by world size, (loss, tokens)
    for name, cfg in cfgs.items():
        model = build(cfg.model, SEED)
        Initializer(SEED)(model, torch.device("cpu"))
        result = _evaluator(cfg, 0, 1)(model)
        assert model.training, "evaluation leaves the model in training mode"
        evaluated[1][name] = (result.loss, result.tokens)
        expected[name] = summed_token_loss(model, windows, 5 * 4)
    counted = sum(PENALTY * float(((1 + y) * (y != x)).sum()) for x, y in (windows[i] for i in range(5 * 4)))
    assert expected["guesser"] == (counted, 5 * 4 * 64), "RepeatGuesser's token losses are the integers it promises"
    for world_size in (2, 3):
        ranks = run_ranks(_evaluate, world_size, cfgs, timeout=600)
        assert all(r == ranks[0] for r in ranks), "every rank gets the same all-reduced result"
        evaluated[world_size] = ranks[0]

    def by_world_size(name, value):
        return {world_size: value(results[name]) for world_size, results in evaluated.items()}

    total, tokens = expected["guesser"]
    assert by_world_size("guesser", lambda r: r) == {n: (total / tokens, tokens) for n in (1, 2, 3)}, "bit for bit"
    total, tokens = expected["brain_ai"]
    assert by_world_size("brain_ai", lambda r: r[1]) == {n: tokens for n in (1, 2, 3)}
    assert by_world_size("brain_ai", lambda r: r[0]) == pytest.approx({n: total / tokens for n in (1, 2, 3)}, rel=1e-6)


def _evaluator(cfg: TrainerConfig, rank: int, world_size: int) -> Evaluator:
    t = cfg.training
    return Evaluator(TokenDataset(cfg.data.path, t.seq_len, "validation"), t.micro_batch_size, t.eval_steps, rank,
                     world_size, torch.device("cpu"), contextlib.nullcontext)


def _evaluate(rank, world_size, cfgs):
    """(loss, tokens) of each config's model, built and sharded as training builds it."""
    assert dist.is_initialized()
    results = {}
    for name, cfg in cfgs.items():
        _, model, _ = build_and_wrap(cfg, RunLayout.from_environment(cfg.resolved().distributed, rank, world_size,
                                                                     torch.device("cpu")))
        result = _evaluator(cfg, rank, world_size)(model)
        results[name] = (result.loss, result.tokens)
    return results


def _evaluate_layout(rank, world_size, cfg):
    """(loss, tokens) of BrainAI split over 4 ranks, evaluated as the loop does: batches by data-parallel rank,
    counted by the first tp rank of each group (of its last pipeline stage), a pipeline's micro-batches at a time."""
    dist_cfg = cfg.resolved().distributed
    layout = build_layout(dist_cfg, world_size, world_size)
    wrapper, model, _ = build_and_wrap(cfg, RunLayout.from_environment(dist_cfg, rank, world_size, torch.device("cpu")))
    pipeline = wrapper if isinstance(wrapper, PipelineWrapper) else None
    t = cfg.training
    evaluator = Evaluator(TokenDataset(cfg.data.path, t.seq_len, "validation"), t.micro_batch_size, t.eval_steps,
                          layout.dp_rank(rank), layout.dp, torch.device("cpu"), contextlib.nullcontext,
                          counts=layout.tp_rank(rank) == 0 and (pipeline is None or pipeline.holds_last),
                          micro_batches=pipeline.steps.micro_batches if pipeline else 1)
    result = evaluator(model, forward=pipeline.logits if pipeline else None)
    return result.loss, result.tokens


@pytest.mark.parametrize("distributed, training", [
    ({"tensor_parallel": 2}, {}),
    # 2 micro-batches per pipeline pass: data-parallel rank 1's 2 batches and a filler pass
    ({"pipeline_parallel": 2}, {"global_batch_size": 16}),
], ids=["tp2 x dp2", "pp2 x dp2"])
def test_evaluation_under_tensor_and_pipeline_parallelism_counts_each_window_once(bpe, tmp_path, distributed, training):
    """5 micro-batches dealt to 2 data-parallel ranks: both tp ranks of a group, or both stages of a pipeline, run
    them; one rank counts them."""
    cfg = job(bpe, tmp_path, model={"vocab_size": VOCAB}, training={"micro_batch_size": 4, "eval_steps": 5, **training},
              distributed={"strategy": "fsdp", **distributed}, checkpoint={"enabled": False})
    model = build(cfg.model, SEED)
    Initializer(SEED)(model, torch.device("cpu"))
    total, tokens = summed_token_loss(model, TokenDataset(bpe, 64, "validation"), 5 * 4)
    ranks = run_ranks(_evaluate_layout, 4, cfg, timeout=600)
    assert all(r == ranks[0] for r in ranks)
    loss, counted = ranks[0]
    assert counted == tokens and loss == pytest.approx(total / tokens, rel=1e-5)


def _train_each(rank, world_size, cfgs):
    return [(result.eval_history, result.history) for result in map(train, cfgs)]


def test_the_loops_evaluation_under_a_pipeline_gives_data_parallels_losses(bpe, tmp_path):
    """pp2 x dp2 and dp4 train on the same global batches and evaluate at steps 2 and 3 in the loop: 3 micro-batches
    per evaluation dealt to 2 data-parallel ranks, so one pipeline runs a filler micro-batch beside its window."""
    runs = {"dp4": {}, "pp2 x dp2": {"pipeline_parallel": 2}}
    cfgs = [job(bpe, tmp_path / name.replace(" ", ""), model={"vocab_size": VOCAB},
                training={"steps": 3, "micro_batch_size": 2, "global_batch_size": 8, "seq_len": 16, "warmup_steps": 1,
                          "log_interval": 1, "eval_interval": 2, "eval_steps": 3},
                distributed={"strategy": "fsdp", **distributed}, checkpoint={"enabled": False})
            for name, distributed in runs.items()]
    (dp_evals, dp_losses), (pp_evals, pp_losses) = run_ranks(_train_each, 4, cfgs, timeout=600)[0]
    assert [step for step, _ in pp_evals] == [step for step, _ in dp_evals] == [2, 3]
    for (_, got), (_, want) in zip(pp_evals + pp_losses, dp_evals + dp_losses, strict=True):
        assert got == pytest.approx(want, rel=1e-4)


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
