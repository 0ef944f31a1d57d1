"""Weights in and out: export a 2-rank FSDP checkpoint to safetensors, start other jobs from it (and from the
checkpoint itself) at 3 ranks, and every way a bad model.init_from or export is refused."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
import yaml
from harness import run_ranks
from processes import run
from safetensors.torch import load_file
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from brain_trainer.checkpoint import save_model, shards, store
from brain_trainer.config import ModelConfig, TrainerConfig
from brain_trainer.config.presets import preset_config
from brain_trainer.contract import CONFIG_ERROR
from brain_trainer.loop.train import train
from brain_trainer.loop.wrap import build_and_wrap
from brain_trainer.hf.export import main as export_main
from brain_trainer.model import export as exporter
from brain_trainer.model.brain_ai import BrainAI
from brain_trainer.model.init_from import open_source
from brain_trainer.model.materialize import Initializer, build
from brain_trainer.parallel.run_layout import RunLayout
from brain_trainer.schema import ConfigError

FULL_SHARD = {"strategy": "fsdp", "fsdp_sharding": "full_shard"}
STEPS_A = 2


def job(checkpoint_dir: str | None, steps: int = 1, init_from: str | None = None,
        distributed: dict = FULL_SHARD) -> TrainerConfig:
    return TrainerConfig.from_dict({
        "model": {"preset": "minimal", **({"init_from": init_from} if init_from else {})},
        "training": {"steps": steps, "micro_batch_size": 2, "seq_len": 16, "warmup_steps": 0, "log_interval": 1},
        "distributed": distributed,
        "data": {"source": "synthetic", "num_samples": 64},
        "checkpoint": {"dir": checkpoint_dir, "interval_steps": 0} if checkpoint_dir else {"enabled": False},
        "metrics": {"port": 0},
    })


def digests(state: dict) -> dict[str, str]:
    return {name: hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest() for name, t in state.items()}


def train_job_a(rank: int, world_size: int, root: str) -> None:
    torch.set_num_threads(1)
    train(job(root, steps=STEPS_A))


def start_from(rank: int, world_size: int, sources: dict[str, str], job_b: str) -> dict | None:
    """The weights at step 0 when starting from each source, then a 1-step job B from the checkpoint."""
    torch.set_num_threads(1)
    out = {}
    for name, path in sources.items():
        cfg = job(None, init_from=path).resolved()
        _, model, _ = build_and_wrap(cfg, RunLayout.from_environment(cfg.distributed, rank, world_size, torch.device("cpu")))
        out[name] = digests(get_model_state_dict(model, options=StateDictOptions(full_state_dict=True)))
    out["steps_of_b"] = train(job(job_b, init_from=sources["checkpoint"])).step
    return out if rank == 0 else None


def start_tp_from(rank: int, world_size: int, sources: dict[str, str]) -> dict | None:
    """The weights at step 0 of a tp2 x dp2 job starting from each source (rowwise weights: column boxes)."""
    out = {}
    for name, path in sources.items():
        cfg = job(None, init_from=path, distributed={**FULL_SHARD, "tensor_parallel": 2}).resolved()
        _, model, _ = build_and_wrap(cfg, RunLayout.from_environment(cfg.distributed, rank, world_size, torch.device("cpu")))
        out[name] = digests(get_model_state_dict(model, options=StateDictOptions(full_state_dict=True)))
    return out if rank == 0 else None


@pytest.fixture(scope="module")
def job_a(tmp_path_factory) -> Path:
    """The committed step-2 checkpoint of a 2-rank full_shard job."""
    root = tmp_path_factory.mktemp("job-a")
    run_ranks(train_job_a, 2, str(root))
    return root / store.step_dir_name(STEPS_A)


def test_export_then_start_from_it_at_3_ranks(job_a, tmp_path):
    saved = shards.load_prefix(job_a, "model")
    single, sharded = tmp_path / "single", tmp_path / "sharded"
    assert export_main([str(job_a), str(single)]) == 0
    assert export_main([str(job_a.parent), str(sharded), "--max-shard-size", "300KB"]) == 0  # the newest one

    exported = load_file(single / "model.safetensors")
    assert exported.keys() == saved.keys() and all(torch.equal(exported[k], saved[k]) for k in saved)
    config = json.loads((single / "config.json").read_text())
    assert config["preset"] == "minimal" and config["dimensions"]["d_model"] == 64
    assert config["parameters"] == sum(t.numel() for t in saved.values()) and config["source"]["step"] == STEPS_A

    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and files == [f"model-{i:05d}-of-{len(files):05d}.safetensors" for i in range(1, len(files) + 1)]
    assert index["metadata"]["total_size"] == sum(t.numel() * 4 for t in saved.values())
    pieces = {}
    for name in files:
        piece = load_file(sharded / name)
        biggest = max(t.numel() * 4 for t in piece.values())
        assert len(piece) == 1 or sum(t.numel() * 4 for t in piece.values()) <= 300_000 or biggest > 300_000
        pieces.update(piece)
    assert pieces.keys() == saved.keys() and all(torch.equal(pieces[k], saved[k]) for k in saved)
    assert set(index["weight_map"]) == set(saved)

    job_b = tmp_path / "job-b"
    out = run_ranks(start_from, 3, {"safetensors": str(single), "sharded": str(sharded), "checkpoint": str(job_a)},
                    str(job_b))[0]
    expected = digests(saved)
    assert out["safetensors"] == expected and out["sharded"] == expected and out["checkpoint"] == expected
    assert out["steps_of_b"] == 1, "weights only: job B counts its own steps from 0"
    manifest = store.read_manifest(job_b / store.step_dir_name(1))
    origin = store.read_manifest(job_a)
    assert manifest["init_from"] == {"path": str(job_a), "step": STEPS_A, "config_hash": origin["config_hash"]}
    assert manifest["model"] == {"preset": "minimal", "init_from": str(job_a)} and manifest["world_size"] == 3


def test_a_tensor_parallel_job_starts_from_exported_weights_and_a_checkpoint(job_a, tmp_path):
    single = tmp_path / "single"
    assert export_main([str(job_a), str(single)]) == 0
    out = run_ranks(start_tp_from, 4, {"safetensors": str(single), "checkpoint": str(job_a)})[0]
    expected = digests(shards.load_prefix(job_a, "model"))
    assert out["safetensors"] == expected and out["checkpoint"] == expected


def test_export_refuses_a_non_empty_target_and_leaves_nothing_complete_after_a_failure(job_a, tmp_path, monkeypatch,
                                                                                        capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert export_main([str(job_a), str(out)]) == 1
    assert "exists and is not empty; pass --force" in capsys.readouterr().err and (out / "notes.txt").exists()
    assert export_main([str(job_a), str(out), "--force"]) == 0
    assert (out / "model.safetensors").is_file() and not (out / "notes.txt").exists()

    def broken(folder, batch):
        raise OSError("disk full")

    monkeypatch.setattr(exporter, "read_tensors", broken)
    with pytest.raises(OSError, match="disk full"):
        exporter.export(job_a, tmp_path / "fresh")
    with pytest.raises(OSError, match="disk full"):
        exporter.export(job_a, out, force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no fresh, no .tmp left
    assert load_file(out / "model.safetensors")  # the previous export, intact


def _meta(**overrides) -> nn.Module:
    with torch.device("meta"):
        return BrainAI(preset_config("minimal", **overrides))


def test_bad_init_from_is_one_line_naming_the_field_the_file_and_the_tensor(job_a, tmp_path):
    exported = tmp_path / "exported"
    assert export_main([str(job_a), str(exported)]) == 0

    def refused(path, model=None) -> str:
        with pytest.raises(ConfigError) as caught:
            open_source(str(path), model or _meta())
        (error,) = caught.value.errors
        assert error.path == "model.init_from"
        return str(error)

    assert refused(tmp_path / "nowhere") == f"model.init_from: {tmp_path / 'nowhere'}: does not exist " \
                                            "(the pods must see it: the checkpoint volume or a data volume)"
    uncommitted = tmp_path / (store.step_dir_name(STEPS_A) + store.TMP_SUFFIX)
    shutil.copytree(job_a, uncommitted)
    (uncommitted / store.MANIFEST).unlink()
    assert "not committed (no manifest.json)" in refused(uncommitted)
    narrow = refused(exported, _meta(d_model=32))
    assert f"{exported / 'model.safetensors'}: tensor 'encoders.embed.weight' has shape [256, 64], " \
           "the model's is [256, 32]" in narrow
    assert f"{job_a}: tensor 'encoders.embed.weight' has shape [256, 64]" in refused(job_a, _meta(d_model=32))
    assert "has no tensor 'reasoning.blocks.2.attn_norm.weight' (the model's is [64])" in refused(exported, _meta(reasoning_blocks=3))
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes((exported / "model.safetensors").read_bytes()[:-100])
    assert "truncated" in refused(truncated) and str(truncated) in refused(truncated)

    damaged = tmp_path / "damaged"
    shutil.copytree(job_a, damaged)
    shard = sorted(damaged.glob("*.distcp"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    model = build(ModelConfig(), 0)
    source = open_source(str(damaged), model)  # names and shapes are fine: the damage shows when it is read
    Initializer(0)(model, torch.device("cpu"))
    with pytest.raises(ConfigError, match=rf"model.init_from: checkpoint {damaged} is damaged: {shard.name}: checksum"):
        source.load_into(model)


def test_the_trainer_refuses_a_bad_init_from_before_training(tmp_path):
    config = job(None, init_from=str(tmp_path / "missing")).to_dict()
    config["distributed"] = {"strategy": "single"}
    path = tmp_path / "trainer.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "OMP_NUM_THREADS": "1"}
    done = run([sys.executable, "-m", "brain_trainer", "--config", str(path)], timeout=300, env=env)
    assert done.returncode == CONFIG_ERROR, done.stdout + done.stderr
    assert done.stderr.strip() == f"error: model.init_from: {tmp_path / 'missing'}: does not exist " \
                                  "(the pods must see it: the checkpoint volume or a data volume)"
    assert "step 1/" not in done.stdout


EXPORT_PEAK = """
import sys
from pathlib import Path
from brain_trainer.hf import export

def status(key):
    line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith(key + ":"))
    return int(line.split()[1]) * 1024

export.main(sys.argv[1:3])  # a small one first: every lazy import and first-use buffer
Path("/proc/self/clear_refs").write_text("5")  # Linux: the peak resident set (VmHWM) starts again from now
base = status("VmRSS")
export.main(sys.argv[3:])
print(status("VmHWM") - base)
"""


def test_export_streams_one_shard_and_one_tensor_at_a_time(tmp_path):
    tensors, rows = 16, 2048
    big = nn.Sequential(*(nn.Linear(rows, rows, bias=False) for _ in range(tensors)))  # 16 x 16.8 MB
    save_model(tmp_path / "big", big)
    save_model(tmp_path / "small", nn.Linear(4, 4))
    del big
    tensor_bytes, shard_bytes = rows * rows * 4, 2 * rows * rows * 4
    done = run(
        [sys.executable, "-c", EXPORT_PEAK, str(tmp_path / "small"), str(tmp_path / "small-out"), str(tmp_path / "big"),
         str(tmp_path / "big-out"), "--max-shard-size", str(shard_bytes)],
        timeout=300,
        # glibc returns every buffer over 1 MiB to the system when it is freed: the peak is what was live at once
        env={**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": str(1 << 20)},
    )
    assert done.returncode == 0, done.stderr
    growth = int(done.stdout.split()[-1])
    # one file's tensors, plus one tensor: the copy DCP reads a tensor into before it fills the batch
    assert growth <= shard_bytes + tensor_bytes + 8e6, (growth, shard_bytes, tensor_bytes)
    assert len(list((tmp_path / "big-out").glob("model-*.safetensors"))) == tensors // 2
