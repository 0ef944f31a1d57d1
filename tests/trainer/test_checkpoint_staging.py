"""Asynchronous saves stage into the project's own buffers (checkpoint/staging.py): they work on torch 2.11, whose
DCP DefaultStager breaks on its second save (pytorch/pytorch#183413, emulated here), and the buffers are allocated
after the first optimizer step, ahead of the first save, then reused by every save, the final blocking one included."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from harness import LogLines, run_ranks
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.fsdp import fully_shard

from brain_trainer.checkpoint import CheckpointManager, TrainState, load_model, store
from brain_trainer.checkpoint.cadence import Cadence
from brain_trainer.checkpoint.staging import Stager
from brain_trainer.config import CheckpointConfig

SAVES = 3  # asynchronous ones, every INTERVAL steps; then the final blocking save
INTERVAL = 2


def emulate_torch_2_11(monkeypatch: pytest.MonkeyPatch) -> None:
    """DefaultStager as torch 2.11.0 shipped it: `_stage` closes its StateDictStager after every stage."""
    stage = DefaultStager._stage

    def stage_then_close(self, state_dict, **kwargs):
        try:
            return stage(self, state_dict, **kwargs)
        finally:
            self._state_dict_stager.close()

    monkeypatch.setattr(DefaultStager, "_stage", stage_then_close)


def test_the_emulated_2_11_stager_fails_its_second_stage_as_2_11_does(monkeypatch):
    emulate_torch_2_11(monkeypatch)
    stager = DefaultStager(StagingOptions(False, False, False, False))
    state = {"model": {"w": torch.ones(3)}, "progress": {"step": 1}}
    assert torch.equal(stager.stage(state)["model"]["w"], torch.ones(3))
    with pytest.raises(KeyError, match="<class 'type'>"):
        stager.stage(state)


def _model_and_optim() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 13), nn.Tanh(), nn.Linear(13, 3))
    if dist.is_initialized():  # FSDP2: the state holds DTensors, staged with their mesh and placements
        for layer in (model[0], model[2]):
            fully_shard(layer)
        fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _full(model: nn.Module, optim: torch.optim.Optimizer) -> bytes:
    msd, osd = get_state_dict(model, optim, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    out = io.BytesIO()
    torch.save({"model": msd, "optim": osd}, out)  # a copy: AdamW's `step` tensors are live otherwise
    return out.getvalue()


def train_and_save(rank: int, world_size: int, root: str) -> dict:
    """SAVES asynchronous saves and the final one under the emulated 2.11 stager; each committed state, then each
    checkpoint loaded back into a fresh model, as full state dicts."""
    with pytest.MonkeyPatch.context() as patch:
        emulate_torch_2_11(patch)
        lines = LogLines()
        logging.getLogger("brain_trainer.checkpoint").addHandler(lines)
        logging.getLogger("brain_trainer.checkpoint").setLevel(logging.INFO)
        model, optim = _model_and_optim()
        state = TrainState(model, optim)
        cfg = CheckpointConfig(dir=root, interval_steps=INTERVAL, keep_last=SAVES + 1, async_save=True)
        ckpt = CheckpointManager(cfg, rank=rank, world_size=world_size, config_hash="h")
        assert ckpt.restore(state) is None
        cadence = Cadence(cfg)
        saved, counts = {}, {}
        for _ in range(SAVES * INTERVAL + 1):
            model(torch.randn(4, 6)).square().mean().backward()
            optim.step()
            optim.zero_grad()
            state.step += 1
            ckpt.after_step(state, save=cadence.due(state.step))
            if state.step == 1:  # no save yet: the buffers are being allocated in the staging thread
                stager = ckpt.stager
                stager.allocated.result()
                counts["warm"] = (stager.counts.ahead, stager.counts.in_saves)
            if cadence.due(state.step) or state.step == SAVES * INTERVAL + 1:
                saved[state.step] = _full(model, optim)
        ckpt.finish(state)
        counts["end"] = (stager.counts.ahead, stager.counts.in_saves)
        loaded = {}
        for step in saved:
            fresh, fresh_optim = _model_and_optim()
            load_model(Path(root) / store.step_dir_name(step), fresh, fresh_optim)
            loaded[step] = _full(fresh, fresh_optim)
        tensors = sum(1 for value in state.state_dict().values() for _ in _leaves(value))
        return {"saved": saved, "loaded": loaded, "counts": counts, "tensors": tensors, "lines": lines.messages}


def _leaves(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _leaves(item)


@pytest.mark.parametrize("world_size", [1, 2])
def test_three_async_saves_under_torch_2_11s_stager_commit_and_load_back_equal(tmp_path, world_size):
    root = str(tmp_path / "ckpt")
    if world_size == 1:
        out = train_and_save(0, 1, root)
    else:
        out = run_ranks(train_and_save, world_size, root)[0]
    steps = [INTERVAL * (i + 1) for i in range(SAVES)] + [SAVES * INTERVAL + 1]
    assert sorted(out["saved"]) == steps
    assert [c.step for c in store.list_checkpoints(Path(root))] == steps[::-1]
    for step in steps:
        assert out["loaded"][step] == out["saved"][step], f"step {step}"
    committed = [line for line in out["lines"] if " committed: " in line]
    assert len(committed) == len(steps) and all("the training loop blocked" in line for line in committed)


def test_staging_buffers_are_allocated_after_the_first_step_and_reused_by_every_save(tmp_path):
    out = train_and_save(0, 1, str(tmp_path / "ckpt"))
    tensors = out["tensors"]
    # After step 1, with no save yet, every buffer is allocated; no save allocates one, the first and the final
    # blocking one included (the staging thread ran the allocation before any save's copy).
    assert out["counts"] == {"warm": (tensors, 0), "end": (tensors, 0)}
    assert any("allocated ahead of the first save" in line for line in out["lines"])


def test_a_stage_copies_into_the_same_buffers_and_a_new_layout_gets_new_ones():
    stager = Stager(pin=False)
    try:
        state = {"model": {"w": torch.arange(6.0).reshape(2, 3), "b": torch.zeros(3)}, "progress": {"step": 1},
                 "groups": [{"lr": 0.1, "params": [0, 1]}]}
        stager.allocate(state).result()
        assert (stager.counts.ahead, stager.counts.in_saves) == (2, 0)
        first = stager.stage(state).result()
        state["model"]["w"] += 1
        state["progress"]["step"] = 2
        second = stager.stage_now(state)
        assert second["model"]["w"].data_ptr() == first["model"]["w"].data_ptr()  # the same buffer, copied again
        assert torch.equal(second["model"]["w"], torch.arange(1.0, 7.0).reshape(2, 3))
        assert second["model"]["w"].data_ptr() != state["model"]["w"].data_ptr()  # a copy, not the live tensor
        assert second["progress"] == {"step": 2} and second["groups"] == [{"lr": 0.1, "params": [0, 1]}]
        assert stager.counts.in_saves == 0
        state["model"]["b"] = torch.zeros(4)  # a layout no buffer fits
        assert torch.equal(stager.stage_now(state)["model"]["b"], torch.zeros(4))
        assert stager.counts.in_saves == 1
    finally:
        stager.close()
