"""Checkpoint library on real gloo ranks: FSDP2 round trip and resharding, retention,
damaged-checkpoint fallback, skipped uncommitted folders, single-shot save_model/load_model,
export to safetensors.

One save at world size 2, then one load per world size (1, 3, 4), each on its own copy.
"""

from __future__ import annotations

import copy
import io
import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from harness import LogLines, run_ranks
from safetensors.torch import load_file
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.fsdp import fully_shard

from brain_trainer.checkpoint import CheckpointManager, TrainState, latest_checkpoint, load_model, save_model
from brain_trainer.checkpoint import store
from brain_trainer.checkpoint.cadence import Cadence
from brain_trainer.config import CheckpointConfig
from brain_trainer.hf.export import main as export_main

STEPS, INTERVAL, KEEP = 6, 2, 2


def _model_and_optim() -> tuple[nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """FSDP2 full_shard under a process group; a plain module in a lone process."""
    torch.manual_seed(0)
    # Odd first dimensions: shards are uneven (and padded) at 3 and 4 ranks.
    model = nn.Sequential(nn.Linear(12, 37), nn.Tanh(), nn.Linear(37, 11), nn.Tanh(), nn.Linear(11, 5))
    if dist.is_initialized():
        for layer in (model[0], model[2], model[4]):
            fully_shard(layer)  # full_shard: reshard_after_forward=True is the default
        fully_shard(model)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda step: 1.0 / (1 + step))
    return model, optim, sched


def _full_state(model: nn.Module, optim: torch.optim.Optimizer) -> dict:
    """Unsharded model + optimizer state, for comparison only (collective)."""
    msd, osd = get_state_dict(model, optim, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return copy.deepcopy({"model": msd, "optim": osd})  # AdamW's `step` tensors are live otherwise


def _portable(obj) -> bytes:
    # Tensors returned as-is travel by shared file descriptors that die with the rank process.
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _unpack(blob: bytes):
    return torch.load(io.BytesIO(blob), weights_only=False)


def _cfg(root: Path) -> CheckpointConfig:
    return CheckpointConfig(dir=str(root), interval_steps=INTERVAL, keep_last=KEEP, async_save=True)


def save_at_two(rank: int, world_size: int, root: str) -> dict:
    model, optim, sched = _model_and_optim()
    state = TrainState(model, optim, sched)
    ckpt = CheckpointManager(_cfg(Path(root)), rank=rank, world_size=world_size, config_hash="h")
    assert ckpt.restore(state) is None
    cadence = Cadence(ckpt.cfg)
    full = {}
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(STEPS):
        loss = model(torch.randn(8, 12, generator=gen)).square().mean()
        loss.backward()
        optim.step()
        optim.zero_grad()
        sched.step()
        state.step += 1
        state.sample_index += 8 * world_size
        ckpt.after_step(state, save=cadence.due(state.step))
        if state.step in (STEPS - INTERVAL, STEPS):
            full[state.step] = _full_state(model, optim)
    ckpt.finish(state)
    save_model(Path(root).parent / "single", model, optim)
    return _portable({"full": full, "lr": optim.param_groups[0]["lr"], "rng": torch.rand(3)})


def load_elsewhere(rank: int, world_size: int, root: str, damage: str) -> bytes:
    """Resume at this world size; then damage the newest checkpoint and resume again."""
    logger = logging.getLogger("brain_trainer.checkpoint")
    keep = LogLines()
    logger.addHandler(keep)
    logger.setLevel(logging.INFO)
    try:
        return _portable(_load_elsewhere(rank, world_size, root, damage, keep.messages))
    finally:
        logger.removeHandler(keep)


def _load_elsewhere(rank: int, world_size: int, root: str, damage: str, logs: list[str]) -> dict:
    model, optim, sched = _model_and_optim()
    state = TrainState(model, optim, sched)
    ckpt = CheckpointManager(_cfg(Path(root)), rank=rank, world_size=world_size, config_hash="h")
    out = {"first": ckpt.restore(state), "sample_index": state.sample_index, "lr": optim.param_groups[0]["lr"],
           "last_epoch": sched.last_epoch, "full_first": _full_state(model, optim)}
    ckpt.close()
    if rank == 0:
        shard = Path(root) / store.step_dir_name(STEPS) / "__1_0.distcp"
        data = bytearray(shard.read_bytes())
        if damage == "truncate":
            shard.write_bytes(data[: len(data) // 2])
        else:
            data[len(data) // 2] ^= 0xFF
            shard.write_bytes(bytes(data))
    if dist.is_initialized():
        dist.barrier()
    model, optim, sched = _model_and_optim()
    state = TrainState(model, optim, sched)
    ckpt = CheckpointManager(_cfg(Path(root)), rank=rank, world_size=world_size, config_hash="h")
    out.update(second=ckpt.restore(state), full_second=_full_state(model, optim), logs=logs)
    ckpt.close()
    # The single-shot API used by FSDPWrapper.save/load_distributed_checkpoint.
    model, optim, _ = _model_and_optim()
    load_model(Path(root).parent / "single", model, optim)
    out["full_single"] = _full_state(model, optim)
    if rank == 0:
        out["rng"] = torch.rand(3)  # rank 0's RNG continues where the saving rank 0 left off
    return out


def _assert_same(a, b, where: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            _assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, dict]:
    base = tmp_path_factory.mktemp("saved")
    root = base / "ckpt"
    rank0 = _unpack(run_ranks(save_at_two, 2, str(root))[0])
    return root, rank0


def test_save_is_sharded_committed_and_retained(saved):
    root, _ = saved
    names = sorted(p.name for p in root.iterdir())
    # keep_last=2 of the checkpoints at steps 2, 4, 6; nothing uncommitted left behind; the run's lease.
    assert names == ["lease-00000001.json", *(store.step_dir_name(s) for s in (STEPS - INTERVAL, STEPS))]
    manifest = store.read_manifest(root / names[-1])
    assert manifest["step"] == STEPS and manifest["world_size"] == 2 and manifest["sample_index"] == STEPS * 16
    assert {"torch_version", "config_hash", "time"} <= manifest.keys()
    assert latest_checkpoint(root) == root / names[-1]
    # Each rank wrote its own shard; neither holds the whole state (no full gather on one rank).
    shard_sizes = [manifest["files"][f"__{r}_0.distcp"]["size"] for r in (0, 1)]
    assert all(size < 0.7 * sum(shard_sizes) for size in shard_sizes)


@pytest.mark.parametrize("world_size,damage", [(1, "flip"), (3, "truncate"), (4, "flip")])
def test_resume_at_other_world_size_exact_and_falls_back_when_damaged(saved, tmp_path, world_size, damage):
    root, reference = saved
    copy = tmp_path / "ckpt"
    shutil.copytree(root, copy)
    shutil.copytree(root.parent / "single", tmp_path / "single")
    if world_size == 4:  # a folder that looks like a newer checkpoint but never committed
        (copy / store.step_dir_name(STEPS + INTERVAL)).mkdir()
    if world_size == 1:  # a lone process with no process group, plain nn.Module (like export)
        with torch.random.fork_rng():
            out = _unpack(load_elsewhere(0, 1, str(copy), damage))
    else:
        out = _unpack(run_ranks(load_elsewhere, world_size, str(copy), damage)[0])

    assert out["first"] == STEPS and out["sample_index"] == STEPS * 16
    _assert_same(out["full_first"], reference["full"][STEPS], "step 6")
    assert out["lr"] == reference["lr"] and out["last_epoch"] == STEPS
    _assert_same(out["full_single"], reference["full"][STEPS], "save_model")

    assert out["second"] == STEPS - INTERVAL
    _assert_same(out["full_second"], reference["full"][STEPS - INTERVAL], "fallback step 4")
    damaged = [m for m in out["logs"] if "is damaged" in m]
    assert len(damaged) == 1 and "__1_0.distcp" in damaged[0]
    assert ("truncated" if damage == "truncate" else "corrupted") in damaged[0]
    assert (copy / (store.step_dir_name(STEPS) + store.CORRUPT_SUFFIX)).is_dir()
    assert latest_checkpoint(copy) == copy / store.step_dir_name(STEPS - INTERVAL)
    if world_size == 4:
        assert any("skipping" in m and "not committed" in m for m in out["logs"])
    if world_size == 1:
        assert torch.equal(out["rng"], reference["rng"])



def test_export_writes_safetensors_loadable_without_process_group(saved, tmp_path, capsys):
    root, reference = saved
    out = tmp_path / "exported"
    assert export_main([str(root), str(out), "--dtype", "bf16"]) == 0
    exported = load_file(out / "model.safetensors")
    expected = reference["full"][STEPS]["model"]
    assert exported.keys() == expected.keys()
    assert all(exported[k].dtype == torch.bfloat16 and torch.equal(exported[k], expected[k].bfloat16()) for k in expected)
    model = nn.Sequential(nn.Linear(12, 37), nn.Tanh(), nn.Linear(37, 11), nn.Tanh(), nn.Linear(11, 5))
    model.load_state_dict(load_file(out / "model.safetensors"))  # a plain module, no process group
    assert json.loads((out / "config.json").read_text())["source"]["step"] == STEPS

    assert export_main([str(tmp_path / "nowhere"), str(tmp_path / "x")]) == 1
    assert "neither a committed checkpoint" in capsys.readouterr().err
    damaged = tmp_path / "damaged"
    shutil.copytree(root / store.step_dir_name(STEPS), damaged)
    (damaged / "__0_0.distcp").write_bytes(b"")
    assert export_main([str(damaged), str(tmp_path / "y")]) == 1
    assert "__0_0.distcp: 0 bytes" in capsys.readouterr().err and not list(tmp_path.glob("y*"))
