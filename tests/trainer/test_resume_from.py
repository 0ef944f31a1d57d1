"""checkpoint.resume_from (docs/checkpoints.md, "Where a run starts"): the folder operations and the record
(one process, no torch), then real saves and restores on 2 gloo ranks: latest, an earlier step, none, restarts
of the same run that set nothing aside again, and a step that is not committed refused on every rank.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from brain_trainer.checkpoint import resume_from, store
from brain_trainer.checkpoint.cadence import Cadence
from brain_trainer.config import CheckpointConfig, TrainerConfig
from brain_trainer.contract import RUN_ID_ENV, step_dir_name
from brain_trainer.schema import ConfigError


def _commit(root: Path, step: int) -> Path:
    """A committed checkpoint of `step` with one small file (a real manifest, no torch)."""
    folder = store.tmp_dir(root, step)
    folder.mkdir(parents=True)
    (folder / "__0_0.distcp").write_bytes(bytes([step % 256]) * 100)
    store.commit(folder, root / step_dir_name(step), {"step": step})
    return root / step_dir_name(step)


def _cfg(root: Path, value) -> CheckpointConfig:
    return CheckpointConfig(dir=str(root), resume_from=value)


def _steps(root: Path) -> list[int]:
    return [c.step for c in store.list_checkpoints(root)]


@pytest.fixture
def root(tmp_path) -> Path:
    root = tmp_path / "ckpt"
    for step in (20, 40, 60):
        _commit(root, step)
    (root / (step_dir_name(50) + store.CORRUPT_SUFFIX)).mkdir()  # quarantined once
    return root


def test_set_aside_folders_are_invisible_to_listing_resuming_and_retention(root):
    assert [(s, p.name) for s, p in store.lineage(root)] == [
        (20, "step-00000020"), (40, "step-00000040"), (50, "step-00000050.corrupt"), (60, "step-00000060")]
    aside = store.set_aside(root, [root / step_dir_name(60), root / step_dir_name(40)], "test")
    assert aside.parent == root and aside.name.startswith(store.SET_ASIDE_PREFIX) and aside.name.endswith("-test")
    assert sorted(p.name for p in aside.iterdir()) == ["step-00000040", "step-00000060"]
    again = store.set_aside(root, [], "test")  # the same second: a folder of its own
    assert again != aside and store.set_aside_folders(root) == [aside, again]
    assert _steps(root) == [20] and store.latest_checkpoint(root) == root / step_dir_name(20)
    for step in (80, 100):
        _commit(root, step)
    (root / (step_dir_name(120) + store.TMP_SUFFIX)).mkdir()
    assert store.apply_retention(root, 1) == [root / step_dir_name(80), root / step_dir_name(20)]
    store.remove_stale(root)
    assert _steps(root) == [100]
    for folder in aside.iterdir():  # moved, never touched: the files still match their manifests
        manifest = store.read_manifest(folder)
        assert store.verify_files(folder, manifest["files"], manifest["files"]) == []


def test_none_sets_everything_aside_once_per_run(root):
    cfg = _cfg(root, "none")
    assert resume_from.start_point(root, cfg, "run-a") is None
    assert resume_from.apply(root, cfg, "run-a") is None
    [aside] = store.set_aside_folders(root)
    assert aside.name.endswith("-resume-from-none")
    assert sorted(p.name for p in aside.iterdir()) == ["step-00000020", "step-00000040", "step-00000050.corrupt",
                                                       "step-00000060"]
    assert _steps(root) == []
    _commit(root, 10)  # the run's own checkpoint; then it restarts
    assert not resume_from.pending(root, cfg, "run-a")
    assert resume_from.apply(root, cfg, "run-a") is None
    assert _steps(root) == [10] and len(store.set_aside_folders(root)) == 1
    assert resume_from.start_point(root, cfg, "run-a").step == 10
    # Another run (a new job) applies it again; so does this run with another value, then none again.
    assert resume_from.pending(root, cfg, "run-b")
    assert resume_from.apply(root, _cfg(root, "latest"), "run-a") is None
    assert _steps(root) == [10] and resume_from.pending(root, cfg, "run-a")
    assert json.loads((root / resume_from.RECORD).read_text()) == {"run-a": "latest"}


def test_a_step_sets_the_newer_ones_aside(root):
    cfg = _cfg(root, 40)
    assert resume_from.start_point(root, cfg, "r").step == 40
    assert resume_from.apply(root, cfg, "r") is None
    [aside] = store.set_aside_folders(root)
    assert aside.name.endswith("-resume-from-40")
    assert sorted(p.name for p in aside.iterdir()) == ["step-00000050.corrupt", "step-00000060"]
    assert _steps(root) == [40, 20]
    _commit(root, 80)  # the run went on; a restart resumes from its own newest
    assert resume_from.apply(root, cfg, "r") is None and _steps(root) == [80, 40, 20]
    # A quoted manifest value is the same step, already applied.
    assert not resume_from.pending(root, _cfg(root, "40"), "r")


def test_latest_moves_nothing_and_writes_no_record(root):
    assert resume_from.apply(root, _cfg(root, "latest"), "r") is None
    assert _steps(root) == [60, 40, 20] and not (root / resume_from.RECORD).exists()
    assert resume_from.start_point(root, _cfg(root, "latest"), "r").step == 60


def test_a_step_that_is_not_committed_is_refused_with_the_committed_ones(root):
    line = f"step 70 is not a committed checkpoint in {root}; committed: 20, 40, 60"
    assert resume_from.refusal(root, _cfg(root, 70), "r") == line
    assert resume_from.apply(root, _cfg(root, 70), "r") == line
    assert _steps(root) == [60, 40, 20] and store.set_aside_folders(root) == []
    empty = root.parent / "empty"
    assert resume_from.refusal(empty, _cfg(empty, 0), "r").endswith("; committed: none")


@pytest.mark.parametrize("value", ["soon", -1, "4 0", "Latest"])
def test_a_bad_value_names_the_field(value):
    with pytest.raises(ConfigError) as raised:
        TrainerConfig.from_dict({"checkpoint": {"resume_from": value}})
    assert str(raised.value) == f"checkpoint.resume_from: must be latest, none or a step >= 0, got {value!r}"


def test_good_values():
    for value, step in (("latest", None), ("none", None), (0, 0), (40, 40), ("40", 40)):
        assert TrainerConfig.from_dict({"checkpoint": {"resume_from": value}}).checkpoint.resume_step() == step


# -- real saves and restores on 2 gloo ranks --


def _phase(rank: int, world_size: int, root: Path, run: str, value, steps: int) -> dict:
    """One start of a run: restore with resume_from, train `steps` steps (saving every 2), finish."""
    import torch
    from torch import nn

    from brain_trainer.checkpoint import CheckpointManager, TrainState

    os.environ[RUN_ID_ENV] = run
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    state = TrainState(model, optim, torch.optim.lr_scheduler.LambdaLR(optim, lambda s: 1.0))
    cfg = CheckpointConfig(dir=str(root), interval_steps=2, keep_last=3, async_save=False, resume_from=value)
    ckpt = CheckpointManager(cfg, rank=rank, world_size=world_size, config_hash="h")
    try:
        restored = ckpt.restore(state)
    except ConfigError as exc:
        ckpt.close()
        return {"refused": str(exc)}
    cadence = Cadence(cfg)
    first = {"restored": restored, "sample_index": state.sample_index, "weight": model.weight.detach().sum().item()}
    for _ in range(steps):
        model(torch.ones(2, 4)).sum().backward()
        optim.step()
        optim.zero_grad()
        state.step += 1
        state.sample_index += 2 * world_size
        ckpt.after_step(state, save=cadence.due(state.step))
    ckpt.finish(state)
    return first


def _runs(rank: int, world_size: int, root: str) -> list[dict]:
    root = Path(root)
    return [
        _phase(rank, world_size, root, "a", "latest", 6),  # commits 2, 4, 6
        _phase(rank, world_size, root, "b", 4, 1),  # sets 6 aside, resumes from 4, commits 5
        _phase(rank, world_size, root, "b", 4, 0),  # a restart of run b: resumes from its own 5
        _phase(rank, world_size, root, "c", "none", 2),  # sets 2, 4, 5 aside, starts fresh, commits 2
        _phase(rank, world_size, root, "c", "none", 0),  # a restart of run c: resumes from its own 2
        _phase(rank, world_size, root, "d", 70, 0),  # refused on every rank, nothing moved
    ]


def test_resume_from_with_real_checkpoints_on_two_ranks(tmp_path):
    from harness import run_ranks

    root = tmp_path / "ckpt"
    results = run_ranks(_runs, 2, str(root))
    for rank, runs in enumerate(results):
        fresh, step4, restart_b, none, restart_c, refused = runs
        assert fresh["restored"] is None
        assert (step4["restored"], step4["sample_index"]) == (4, 16), rank
        assert (restart_b["restored"], restart_b["sample_index"]) == (5, 20), rank
        assert none["restored"] is None and none["weight"] == fresh["weight"], rank
        assert (restart_c["restored"], restart_c["sample_index"]) == (2, 8), rank
        assert refused == {"refused": f"checkpoint.resume_from: step 70 is not a committed checkpoint in {root}; "
                                      "committed: 2"}, rank
    assert _steps(root) == [2]
    first, second = store.set_aside_folders(root)
    assert first.name.endswith("-resume-from-4") and second.name.endswith("-resume-from-none")
    assert [p.name for p in first.iterdir()] == ["step-00000006"]
    assert sorted(p.name for p in second.iterdir()) == ["step-00000002", "step-00000004", "step-00000005"]
    for folder in [*first.iterdir(), *second.iterdir()]:
        manifest = store.read_manifest(folder)
        assert store.verify_files(folder, manifest["files"], manifest["files"]) == [], folder
    assert store.read_manifest(second / step_dir_name(5))["sample_index"] == 20
    assert json.loads((root / resume_from.RECORD).read_text()) == {"b": "4", "c": "none"}
