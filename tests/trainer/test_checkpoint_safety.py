"""Checkpoints cannot run code (docs/security.md#checkpoints): real saves, hostile pickles.

Each hostile payload, once unpickled, creates a marker file; a sanity check
shows it does. Resume, model.init_from and export then read the tampered
checkpoint (its manifest's checksums fixed up, as an attacker who can write
the folder would): no marker, the file and the refused global named, a
resumed checkpoint moved aside (by one rank, once every rank has stopped reading it, all ranks agreeing) and
the previous one loaded. The training
state (progress, schedule, RNG) is JSON in the shard file, and a pickle
where it belongs is never unpickled; older checkpoints, which torch.save'd
it, still resume.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex

from harness import run_ranks

from brain_trainer.checkpoint import CheckpointManager, TrainState, shards, store
from brain_trainer.checkpoint import state as train_state
from brain_trainer.checkpoint.state import rng_key
from brain_trainer.config import CheckpointConfig
from brain_trainer.model import export as exporter
from brain_trainer.model.init_from import open_source
from brain_trainer.resilience.failures import Fatal
from brain_trainer.schema import ConfigError


class Payload:
    """Unpickled, runs exec: creates `marker`."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({str(self.marker)!r}, 'w').close()",)


def _state() -> TrainState:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return TrainState(model, optim, torch.optim.lr_scheduler.LambdaLR(optim, lambda step: 1.0))


class _RngAs(TrainState):
    """Saves `rng` in place of this rank's RNG states (the model and the rest as usual)."""

    def __init__(self, rng: object):
        fresh = _state()
        super().__init__(fresh.model, fresh.optimizer, fresh.scheduler)
        self.rng = rng

    def state_dict(self):
        return {**super().state_dict(), "rng": {f"rank{self.rank}": self.rng}}


class _Legacy(TrainState):
    """Saves as checkpoints did before the training state was JSON: torch.save'd plain values, the RNG item given."""

    def __init__(self, rng: object, scheduler: object = None):
        fresh = _state()
        super().__init__(fresh.model, fresh.optimizer, fresh.scheduler)
        self.rng = rng
        self.schedule = scheduler

    def state_dict(self):
        return {**super().state_dict(), "progress": {"step": self.step, "sample_index": self.sample_index},
                "scheduler": self.schedule or self.scheduler.state_dict(), "rng": {f"rank{self.rank}": self.rng}}


class _SavesAs(TrainState):
    """Saves `items` in place of its own (DCP torch.saves what is not JsonText)."""

    def __init__(self, **items: object):
        fresh = _state()
        super().__init__(fresh.model, fresh.optimizer, fresh.scheduler)
        self.items = items

    def state_dict(self):
        return {**super().state_dict(), **self.items}


def _json(value: object) -> shards.JsonText:
    return shards.JsonText(json.dumps(value))


def _manager(root: Path, rank: int = 0, world_size: int = 1) -> CheckpointManager:
    return CheckpointManager(CheckpointConfig(dir=str(root), interval_steps=0, keep_last=5, async_save=False),
                             rank=rank, world_size=world_size, config_hash="h")


def _save(root: Path, state: TrainState, step: int, rank: int = 0, world_size: int = 1) -> Path:
    state.step = state.sample_index = step
    _manager(root, rank, world_size).finish(state)
    return root / store.step_dir_name(step)


def _tamper_metadata(folder: Path, marker: Path) -> None:
    """.metadata replaced by a hostile pickle, the manifest's checksum fixed up: the CRC still verifies."""
    (folder / shards.METADATA_FILE).write_bytes(pickle.dumps(Payload(marker)))
    manifest = json.loads((folder / store.MANIFEST).read_text())
    manifest["files"][shards.METADATA_FILE] = store.file_digest(folder / shards.METADATA_FILE)
    (folder / store.MANIFEST).write_text(json.dumps(manifest))


def _restore(root: Path, caplog) -> tuple[TrainState, int | None]:
    state = _state()
    with caplog.at_level(logging.INFO, logger="brain_trainer"):
        step = _manager(root).restore(state)
    return state, step


def test_the_payload_runs_when_unpickled(tmp_path):
    pickle.loads(pickle.dumps(Payload(tmp_path / "ran")))
    assert (tmp_path / "ran").exists()


def test_a_hostile_metadata_is_named_moved_aside_and_the_previous_checkpoint_resumed(tmp_path, caplog):
    marker = tmp_path / "ran"
    _save(tmp_path / "ckpt", _state(), 2)
    hostile = _save(tmp_path / "ckpt", _state(), 4)
    _tamper_metadata(hostile, marker)

    state, step = _restore(tmp_path / "ckpt", caplog)

    assert not marker.exists()
    assert step == 2 and state.step == 2
    assert not hostile.exists() and hostile.with_name(hostile.name + store.CORRUPT_SUFFIX).is_dir()
    assert ("step-00000004/.metadata: refuses to unpickle builtins.exec (a checkpoint holds only data; "
            "see docs/security.md)") in caplog.text
    assert "moved to step-00000004.corrupt, falling back to the previous committed checkpoint" in caplog.text


class _ByGetattr:
    """Pickles as `getattr(owner, name)`: how Python 3.11.0-3.11.4 pickle an enum member."""

    def __init__(self, owner: object, name: str):
        self.owner, self.name = owner, name

    def __reduce__(self):
        return getattr, (self.owner, self.name)


def _unpickle_metadata(tmp_path: Path, obj: object) -> object:
    path = tmp_path / ".metadata"
    path.write_bytes(pickle.dumps(obj))
    with open(path, "rb") as file:
        return shards._MetadataUnpickler(file, path).load()


def test_an_enum_member_pickled_by_getattr_as_python_3_11_2_writes_it_is_read(tmp_path):
    member = next(iter(shards._MEM_FORMAT_ENCODING))
    assert pickle.dumps(member) != pickle.dumps(_ByGetattr(type(member), member.name))  # this Python pickles by value
    assert _unpickle_metadata(tmp_path, _ByGetattr(type(member), member.name)) is member


@pytest.mark.parametrize(("owner", "name"), [
    (shards._MEM_FORMAT_ENCODING, "__class__"),  # an admitted enum, but no member of it
    (torch.Size, "__init__"),  # an admitted class that is no enum
    (logging.Logger, "manager"),  # a class not admitted: refused before getattr is reached
])
def test_getattr_reaches_nothing_but_an_admitted_enums_members(tmp_path, owner, name):
    with pytest.raises(shards.RefusedCheckpoint, match="refuses to unpickle"):
        _unpickle_metadata(tmp_path, _ByGetattr(owner, name))


def test_a_hostile_item_is_refused_and_the_previous_checkpoint_overwrites_what_it_read(tmp_path, caplog):
    marker = tmp_path / "ran"
    good = _state()
    _save(tmp_path / "ckpt", good, 2)
    _save(tmp_path / "ckpt", _RngAs(Payload(marker)), 4)  # DCP torch.saves it: a pickle in the shard file

    state, step = _restore(tmp_path / "ckpt", caplog)

    assert not marker.exists()
    assert step == 2
    for name, value in good.model.state_dict().items():  # nothing of step 4's model left
        assert torch.equal(state.model.state_dict()[name], value), name
    assert ("step-00000004/__0_0.distcp: rng.rank0: holds a pickle where JSON belongs (not unpickled)"
            in caplog.text)
    assert (tmp_path / "ckpt" / "step-00000004.corrupt").is_dir()


def test_a_refused_load_with_nothing_older_fails_named_and_the_restart_starts_clean(tmp_path, caplog):
    marker = tmp_path / "ran"
    _save(tmp_path / "ckpt", _RngAs(Payload(marker)), 4)

    with pytest.raises(Fatal, match=r"__0_0.distcp: rng.rank0: holds a pickle where JSON belongs .*partly read"):
        _restore(tmp_path / "ckpt", caplog)
    assert not marker.exists()

    assert _restore(tmp_path / "ckpt", caplog)[1] is None  # the restart: the refused checkpoint is aside


def hostile_on_rank_one(rank: int, world_size: int, root: str, marker: str) -> tuple[int | None, bool]:
    _save(Path(root), _state(), 2, rank, world_size)
    _save(Path(root), _RngAs(Payload(Path(marker))) if rank == 1 else _state(), 4, rank, world_size)
    state = _state()
    step = _manager(Path(root), rank, world_size).restore(state)
    return step, Path(marker).exists()


def test_a_refusal_on_one_rank_moves_every_rank_to_the_previous_checkpoint(tmp_path):
    marker = tmp_path / "ran"
    assert run_ranks(hostile_on_rank_one, 2, str(tmp_path / "ckpt"), str(marker)) == [(2, False), (2, False)]
    assert not marker.exists() and (tmp_path / "ckpt" / "step-00000004.corrupt").is_dir()


# -- two ranks, one refusal: the move waits for every reader, and every rank goes on to the same candidate --

ACTED = "test/rank 0 acted on its refusal"  # a key of the harness's store, beside the process group's


def _peers() -> dist.TCPStore:
    """The store the ranks met in (the harness hosts it): a place to signal between them."""
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)


def _rank_0_signals_once_it_acts_on_a_refusal(peers: dist.TCPStore) -> None:
    """Rank 0, once its read of a .metadata was refused: ACTED as soon as it has moved the folder, or as it waits
    for its peers (any collective) before moving anything."""
    read, move = shards.saved_shapes, store.quarantine
    refused: list[Path] = []

    def saved_shapes(folder: Path):
        try:
            return read(folder)
        except shards.RefusedCheckpoint:
            refused.append(folder)
            raise

    def quarantine(path: Path) -> Path:
        moved = move(path)
        if refused:
            peers.set(ACTED, "moved")
        return moved

    def signalling(collective):
        def call(*args, **kwargs):
            if refused:
                peers.set(ACTED, "waits for its peers")
            return collective(*args, **kwargs)
        return call

    shards.saved_shapes, store.quarantine = saved_shapes, quarantine
    for name in ("all_gather_object", "broadcast_object_list", "barrier"):
        setattr(dist, name, signalling(getattr(dist, name)))


def _rank_1_reads_once_rank_0_acted(peers: dist.TCPStore, folder: Path) -> None:
    """Rank 1 starts reading `folder`'s .metadata only after rank 0 refused it and acted on that."""
    read = shards.saved_shapes

    def saved_shapes(path: Path):
        if path == folder:
            peers.wait([ACTED])
        return read(path)

    shards.saved_shapes = saved_shapes


def refused_while_rank_1_reads(rank: int, world_size: int, root: str, marker: str) -> int | None:
    _save(Path(root), _state(), 2, rank, world_size)
    hostile = _save(Path(root), _state(), 4, rank, world_size)
    if rank == 0:
        _tamper_metadata(hostile, Path(marker))
    dist.barrier()
    peers = _peers()
    if rank == 0:
        _rank_0_signals_once_it_acts_on_a_refusal(peers)
    else:
        _rank_1_reads_once_rank_0_acted(peers, hostile)
    return _manager(Path(root), rank, world_size).restore(_state())


def test_a_refused_checkpoint_is_moved_only_after_every_rank_stopped_reading_it(tmp_path):
    marker = tmp_path / "ran"
    assert run_ranks(refused_while_rank_1_reads, 2, str(tmp_path / "ckpt"), str(marker)) == [2, 2]
    assert not marker.exists()
    assert not (tmp_path / "ckpt" / "step-00000004").exists()
    assert (tmp_path / "ckpt" / "step-00000004.corrupt").is_dir()


def refused_by_rank_0_alone(rank: int, world_size: int, root: str) -> int | None:
    _save(Path(root), _state(), 2, rank, world_size)
    doubted = _save(Path(root), _state(), 4, rank, world_size)
    if rank == 0:  # rank 0's read of step 4's .metadata is refused, rank 1's is not
        read = shards.saved_shapes

        def saved_shapes(folder: Path):
            if folder == doubted:
                raise shards.RefusedCheckpoint(folder / shards.METADATA_FILE, "refused by rank 0 alone")
            return read(folder)

        shards.saved_shapes = saved_shapes
    return _manager(Path(root), rank, world_size).restore(_state())


def test_one_ranks_refusal_is_every_ranks_verdict(tmp_path):
    assert run_ranks(refused_by_rank_0_alone, 2, str(tmp_path / "ckpt"), timeout=60.0) == [2, 2]
    assert (tmp_path / "ckpt" / "step-00000004.corrupt").is_dir()


def _item_bytes(folder: Path, key: str) -> bytes:
    """The bytes of one item as they lie in its shard file, found through .metadata."""
    metadata = shards.read_metadata(folder / shards.METADATA_FILE)
    [info] = [info for index, info in metadata.storage_data.items() if index.fqn == key]
    return (folder / info.relative_path).read_bytes()[info.offset : info.offset + info.length]


def test_the_training_state_is_json_in_the_shard_file(tmp_path):
    state = _state()
    state.optimizer.step(), state.scheduler.step()
    folder = _save(tmp_path / "ckpt", state, 3)

    assert json.loads(_item_bytes(folder, "progress")) == {"step": 3, "sample_index": 3}
    assert json.loads(_item_bytes(folder, "scheduler")) == state.scheduler.state_dict()
    assert set(json.loads(_item_bytes(folder, rng_key(0)))) == {"python", "numpy", "torch", "cuda"}


def _scaled(scale: float) -> TrainState:
    fresh = _state()
    scaler = torch.amp.GradScaler("cpu", init_scale=scale)
    scaler.scale(torch.ones(()))  # the scale becomes a tensor, as in training
    return TrainState(fresh.model, fresh.optimizer, fresh.scheduler, scaler)


def test_the_grad_scaler_state_is_json_and_resumes_exactly(tmp_path, caplog):
    folder = _save(tmp_path / "ckpt", _scaled(1024.0), 2)
    assert json.loads(_item_bytes(folder, "scaler"))["scale"] == 1024.0

    state = _scaled(65536.0)
    with caplog.at_level(logging.INFO, logger="brain_trainer"):
        assert _manager(tmp_path / "ckpt").restore(state) == 2
    assert state.scaler.state_dict() == _scaled(1024.0).scaler.state_dict()


def test_a_pickle_where_the_schedule_belongs_is_never_unpickled(tmp_path, caplog):
    marker = tmp_path / "ran"
    good = _state()
    _save(tmp_path / "ckpt", good, 2)
    hostile = _save(tmp_path / "ckpt", _SavesAs(scheduler=Payload(marker)), 4)
    assert _item_bytes(hostile, "scheduler").startswith(b"PK")  # torch.save's pickle, where older checkpoints had it

    state, step = _restore(tmp_path / "ckpt", caplog)

    assert not marker.exists()
    assert step == 2 and state.scheduler.state_dict() == good.scheduler.state_dict()
    assert ("step-00000004/__0_0.distcp: scheduler: holds a pickle where JSON belongs (not unpickled) "
            "(a checkpoint holds only data; see docs/security.md)") in caplog.text
    assert hostile.with_name(hostile.name + store.CORRUPT_SUFFIX).is_dir()


def test_json_nested_deeper_than_the_parser_recurses_is_refused(tmp_path, caplog):
    _save(tmp_path / "ckpt", _state(), 2)
    _save(tmp_path / "ckpt", _SavesAs(scheduler=shards.JsonText("[" * 100_000 + "]" * 100_000)), 4)

    state, step = _restore(tmp_path / "ckpt", caplog)

    assert step == 2
    assert "step-00000004/__0_0.distcp: scheduler: holds JSON nested too deep" in caplog.text


@pytest.mark.parametrize(("items", "problem"), [
    ({"progress": _json({"step": "4", "sample_index": 4})}, "progress: holds no integer step and sample_index"),
    ({"scheduler": _json({"optimizer": None})}, "scheduler: names 'optimizer', which brain-train does not write"),
    ({"scheduler": _json({"last_epoch": "4"})}, "scheduler: last_epoch is a str, not a int"),
    ({"rng": {"rank0": _json({"python": []})}}, "rng.rank0: holds no RNG states (ValueError:"),
], ids=["progress", "scheduler-attribute", "scheduler-type", "rng"])
def test_json_that_is_not_the_state_brain_train_writes_is_refused(tmp_path, caplog, items, problem):
    _save(tmp_path / "ckpt", _state(), 2)
    _save(tmp_path / "ckpt", _SavesAs(**items), 4)

    state, step = _restore(tmp_path / "ckpt", caplog)

    assert step == 2 and state.step == 2
    assert f"step-00000004/__0_0.distcp: {problem}" in caplog.text
    assert (tmp_path / "ckpt" / "step-00000004.corrupt").is_dir()


def forged_rng_on_rank_one(rank: int, world_size: int, root: str) -> int | None:
    _save(Path(root), _state(), 2, rank, world_size)
    forged = _SavesAs(rng={"rank1": _json({"torch": 5})}) if rank == 1 else _state()
    _save(Path(root), forged, 4, rank, world_size)
    return _manager(Path(root), rank, world_size).restore(_state())


def test_state_refused_on_one_rank_moves_every_rank_to_the_previous_checkpoint(tmp_path):
    assert run_ranks(forged_rng_on_rank_one, 2, str(tmp_path / "ckpt")) == [2, 2]
    assert (tmp_path / "ckpt" / "step-00000004.corrupt").is_dir()


def test_an_older_checkpoint_resumes_exactly(tmp_path, caplog):
    saved = _Legacy(None)
    saved.optimizer.step(), saved.scheduler.step()
    torch.manual_seed(7), random.seed(7), np.random.seed(7)
    saved.rng = str(train_state._capture_rng())  # RNG states as torch.save'd JSON text, the rest plain values
    _save(tmp_path / "ckpt", saved, 4)
    assert "progress.step" in shards.saved_shapes(tmp_path / "ckpt" / "step-00000004")  # the older layout
    expected = _draws()

    torch.manual_seed(0), random.seed(0), np.random.seed(0)
    state, step = _restore(tmp_path / "ckpt", caplog)

    assert step == 4 and state.sample_index == 4
    assert state.scheduler.state_dict() == saved.scheduler.state_dict()
    assert _draws() == expected


def test_an_older_checkpoints_pickled_rng_state_is_never_unpickled(tmp_path, caplog):
    marker = tmp_path / "ran"
    _save(tmp_path / "ckpt", _Legacy(pickle.dumps(Payload(marker))), 4)  # how RNG states were saved at first

    state, step = _restore(tmp_path / "ckpt", caplog)

    assert not marker.exists()
    assert step == 4 and state.step == 4
    assert f"{rng_key(0)} is a pickle (an older checkpoint): not unpickled; rank 0 keeps its own RNG states" \
        in caplog.text


def test_an_older_checkpoints_plain_values_admit_no_code(tmp_path, caplog):
    marker = tmp_path / "ran"
    _save(tmp_path / "ckpt", _state(), 2)
    _save(tmp_path / "ckpt", _Legacy("{}", scheduler={**_state().scheduler.state_dict(), "last_epoch": Payload(marker)}), 4)

    state, step = _restore(tmp_path / "ckpt", caplog)

    assert not marker.exists()
    assert step == 2
    assert "step-00000004/__0_0.distcp: scheduler.last_epoch: refuses to unpickle builtins.exec" in caplog.text


def _draws() -> list[float]:
    return [*torch.rand(3).tolist(), random.random(), random.gauss(0, 1), float(np.random.normal())]


def test_rng_states_resume_exactly(tmp_path, caplog):
    state = _state()
    torch.manual_seed(7), random.seed(7), np.random.seed(7)
    random.gauss(0, 1), np.random.normal()  # cached gaussians are part of the states
    _save(tmp_path / "ckpt", state, 2)
    expected = _draws()

    torch.manual_seed(0), random.seed(0), np.random.seed(0)
    _restore(tmp_path / "ckpt", caplog)
    assert _draws() == expected


def test_init_from_and_export_refuse_a_hostile_metadata_and_move_nothing(tmp_path):
    marker = tmp_path / "ran"
    folder = _save(tmp_path / "ckpt", _state(), 2)
    _tamper_metadata(folder, marker)

    with pytest.raises(ConfigError, match=r"model\.init_from: .*step-00000002/\.metadata: refuses to unpickle "
                                          r"builtins\.exec \(a checkpoint holds only data"):
        open_source(str(folder), _state().model)
    with pytest.raises(exporter.ExportError, match=r"step-00000002/\.metadata: refuses to unpickle builtins\.exec"):
        exporter.export(folder, tmp_path / "out")

    assert not marker.exists()
    assert folder.is_dir() and not (tmp_path / "out").exists()


def test_metadata_naming_a_file_outside_its_folder_is_refused(tmp_path):
    forged = Metadata(state_dict_metadata={},
                      storage_data={MetadataIndex("model.w"): _StorageInfo("../../etc/passwd", 0, 10)})
    (tmp_path / shards.METADATA_FILE).write_bytes(pickle.dumps(forged))
    with pytest.raises(shards.RefusedCheckpoint, match="names '../../etc/passwd' as a shard"):
        shards.read_metadata(tmp_path / shards.METADATA_FILE)
