"""Checkpoints in the real training loop (`python -m brain_trainer`), killed with real signals.

- uninterrupted: a 2-rank torchrun job, the reference;
- SIGKILL: the same job under torchrun --max-restarts=1; rank 0 is killed after the checkpoint
  at step 4 committed, while the one at step 8 has all its shards written but no commit. torchrun
  restarts the group, which resumes from step 4 and ends with the reference's parameters and
  samples (issue 3, points 2 and 4);
- SIGTERM: 2 plain processes (hand-set environment, FSDP2); rank 1 alone gets SIGTERM. Both ranks
  finish the step, commit a checkpoint and exit 75 with the termination message; one process
  then resumes it at world size 1 and continues the same global sample sequence (points 3, 5).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import torch
import yaml
from processes import Finished, run, start, torchrun
from safetensors.torch import load_file

from brain_trainer import contract
from brain_trainer.checkpoint import store
from brain_trainer.data.loader import RankAwareSampler, SyntheticDataset
from brain_trainer.model.export import export
from brain_trainer.parallel.launcher import held_port

HERE = Path(__file__).parent
MICRO, SEQ, SAMPLES, SEED = 2, 16, 4096, 0


def write_config(tmp: Path, name: str, steps: int, strategy: str) -> Path:
    config = {
        "model": {"preset": "minimal"},
        "training": {"steps": steps, "micro_batch_size": MICRO, "global_batch_size": 2 * MICRO, "seq_len": SEQ,
                     "warmup_steps": 2, "log_interval": 4, "seed": SEED},
        "distributed": {"strategy": strategy, "fsdp_sharding": "full_shard"},
        "data": {"source": "synthetic", "num_samples": SAMPLES},
        "checkpoint": {"dir": str(tmp / name), "interval_steps": 4, "keep_last": 2},
        "metrics": {"port": 0},
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def env(sample_log: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "BRAIN_SAMPLE_LOG": str(sample_log), **extra}


# torchrun shares its rendezvous TCPStore with the workers by default, and a restarted group can
# then read the dead group's gloo addresses (pytorch/pytorch#135712): restarts need it off.
NO_SHARED_STORE = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def steps_taken(sample_log: Path) -> dict[int, list[int]]:
    """Each step's samples, by the last attempt that took it, ranks in order (the global order)."""
    by_step: dict[int, tuple[str, dict[int, list[int]]]] = {}
    for line in sample_log.read_text().splitlines():
        rec = json.loads(line)
        attempt, ranks = by_step.get(rec["step"], (rec["attempt"], {}))
        if attempt != rec["attempt"]:  # a later attempt redid this step: the earlier one was lost
            attempt, ranks = rec["attempt"], {}
        ranks[rec["rank"]] = rec["samples"]
        by_step[rec["step"]] = (attempt, ranks)
    return {step: [i for rank in sorted(ranks) for i in ranks[rank]] for step, (_, ranks) in sorted(by_step.items())}


def global_stream(count: int) -> list[int]:
    """The dataset indices a single process reads first, i.e. the global sample sequence."""
    sampler = RankAwareSampler(SyntheticDataset(SAMPLES, SEQ, SEED), num_replicas=1, rank=0,
                               micro_batch_size=MICRO, seed=SEED)
    return list(sampler)[:count]


def final_model(root: Path, tmp: Path) -> dict[str, torch.Tensor]:
    out = tmp / f"{root.name}-export"
    assert export(root, out) == (root / store.step_dir_name(12), 1)
    return load_file(out / "model.safetensors")


def logged_run(cmd: list[str], log: Path, **kw) -> Finished:
    proc = run(cmd, timeout=240, cwd=HERE, **kw)
    log.write_text(proc.stdout + proc.stderr)
    return proc


def test_sigkill_after_a_checkpoint_and_before_a_commit_resumes_exactly(tmp_path):
    reference_log, killed_log = tmp_path / "reference.jsonl", tmp_path / "killed.jsonl"
    proc = logged_run(torchrun("-m", "brain_trainer", "--config", write_config(tmp_path, "reference", 12, "ddp")),
                      tmp_path / "reference.out", env=env(reference_log, **NO_SHARED_STORE))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    killed = write_config(tmp_path, "killed", 12, "ddp")
    with start(torchrun("--max-restarts", "1", HERE / "hold_commit.py", "--config", killed), timeout=240, cwd=HERE,
               env=env(killed_log, HOLD_COMMIT_STEP="8", **NO_SHARED_STORE)) as job:
        for line in job.lines():
            if line.startswith("holding commit of step 8 in pid "):
                pending = tmp_path / "killed" / (store.step_dir_name(8) + store.TMP_SUFFIX)
                assert (pending / ".metadata").is_file() and not (pending / store.MANIFEST).exists()
                assert store.latest_checkpoint(tmp_path / "killed") == tmp_path / "killed" / store.step_dir_name(4)
                os.kill(int(line.split()[-1]), signal.SIGKILL)
        code = job.wait()
    text = job.output
    (tmp_path / "killed.out").write_text(text)
    assert code == 0, text[-4000:]
    assert "removing uncommitted checkpoint" in text and store.step_dir_name(8) + store.TMP_SUFFIX in text
    assert f"resumed from {tmp_path / 'killed' / store.step_dir_name(4)}: step 4" in text
    assert "torchrun restart count 1" in text

    ref, got = final_model(tmp_path / "reference", tmp_path), final_model(tmp_path / "killed", tmp_path)
    assert ref.keys() == got.keys()
    worst = max((ref[k].float() - got[k].float()).abs().max().item() for k in ref)
    assert worst <= 1e-6, f"max |delta| {worst}"
    assert steps_taken(killed_log) == steps_taken(reference_log)
    taken = [i for samples in steps_taken(killed_log).values() for i in samples]
    assert taken == global_stream(12 * 2 * MICRO), "a sample was skipped or repeated"


def test_sigterm_commits_exits_preempted_and_resumes_at_one_rank(tmp_path):
    steps, sample_log = 24, tmp_path / "samples.jsonl"
    cfg = write_config(tmp_path, "ckpt", steps, "fsdp")
    root = tmp_path / "ckpt"

    def worker(rank: int, port: int):
        return start([sys.executable, "-m", "brain_trainer", "--config", cfg], timeout=240, cwd=HERE,
                     env=env(sample_log, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                             MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                             BRAIN_TERMINATION_LOG=str(tmp_path / f"term{rank}")))

    # Held until rank 0's store listens on it: nobody takes it in between.
    with held_port() as port, worker(0, port) as rank0, worker(1, port) as rank1:
        workers = [rank0, rank1]
        committed = f"checkpoint {root / store.step_dir_name(4)} committed"
        assert any(committed in line for line in rank0.lines()), "no first checkpoint:\n" + rank0.output[-3000:]
        assert rank1.poll() is None, "rank 1 ended before the first checkpoint"
        rank1.send_signal(signal.SIGTERM)
        codes = [w.wait() for w in workers]
    outputs = [w.output for w in workers]
    assert codes == [contract.PREEMPTED] * 2, outputs[0][-3000:]
    latest = store.latest_checkpoint(root)
    stopped = store.read_manifest(latest)["step"]
    assert all(contract.parse_termination((tmp_path / f"term{r}").read_text())
               == (contract.PREEMPTED_REASON, f"SIGTERM: step {stopped} committed, exiting to be restarted")
               for r in range(2))
    assert 4 < stopped < steps and store.read_manifest(latest)["sample_index"] == stopped * 2 * MICRO
    assert f"SIGTERM: saving step {stopped} before exiting with code {contract.PREEMPTED}" in outputs[0]
    assert sorted(steps_taken(sample_log)) == list(range(1, stopped + 1))

    proc = logged_run([sys.executable, "-m", "brain_trainer", "--config", str(cfg)], tmp_path / "resumed.out",
                      env=env(sample_log))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"step {stopped}, global sample index {stopped * 2 * MICRO}, saved at world size 2, now 1" in proc.stdout
    taken = steps_taken(sample_log)
    assert sorted(taken) == list(range(1, steps + 1))
    assert [i for samples in taken.values() for i in samples] == global_stream(steps * 2 * MICRO)
