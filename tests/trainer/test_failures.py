"""Failures that explain themselves (issue 18): the trainer classifies what killed it, writes
`brain.ai/<reason>: <line>` as its termination message and exits with the reason's code; the operator
reads the reason back into its status condition and WorkerFailed event.

- classify: a table of real exceptions, torch's and DCP's wrappers included;
- a full checkpoint volume on 2 gloo ranks: the check before a save (nothing written) and an ENOSPC
  injected in the shard writer (the half-written folder removed): storage-full with the figures,
  every committed checkpoint intact, no .tmp left, and the next start removes a stale .tmp;
- a reason that fails the job (BRAIN_FAIL_FAST) stops torchrun from restarting the workers in the pod;
- real `python -m brain_trainer` processes: out-of-memory (a MemoryError raised in a step on rank 1 of
  2, under torchrun), collective-timeout (rank 1 of 2 SIGKILLed, a short timeout), config-error and
  data-error (bad inputs): each message, fed to the operator's pure plan as a failed pod's
  termination message, names the reason in the status condition and the event.
"""

from __future__ import annotations

import errno
import os
import shutil
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import yaml
from harness import run_ranks
from processes import Finished, run, torchrun
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException

from brain_operator.reconcile import plan
from brain_operator.backends import render
from brain_operator.spec import parse_job
from brain_trainer import contract
from brain_trainer.checkpoint import CheckpointManager, TrainState, store
from brain_trainer.config import CheckpointConfig
from brain_trainer.data.errors import DataError
from brain_trainer.resilience.failures import UNNAMED_FAILURE, Fatal, begin_attempt, classify
from brain_trainer.schema import ConfigError, FieldError

HERE = Path(__file__).parent
NOW = datetime(2026, 11, 24, 12, 0, tzinfo=timezone.utc)


def enospc(path="/ckpt/__0_0.distcp"):
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)


@pytest.mark.parametrize("exc, reason, line", [
    (enospc(), "storage-full", "No space left on device writing /ckpt/__0_0.distcp"),
    (CheckpointException("save failed", {1: (enospc(), None)}), "storage-full",
     "No space left on device writing /ckpt/__0_0.distcp"),
    (OSError(errno.EDQUOT, "quota"), "storage-full", "Disk quota exceeded"),
    (MemoryError(), "out-of-memory", "MemoryError"),
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB\nmore"), "out-of-memory",
     "CUDA out of memory. Tried to allocate 2 GiB"),
    (ConfigError([FieldError("training.steps", "must be >= 1, got 0"), FieldError("x", "y")]), "config-error",
     "training.steps: must be >= 1, got 0 (and 1 more)"),
    (DataError("no files match '/nope/*.txt'", field="data.path"), "data-error",
     "data.path: no files match '/nope/*.txt'"),
    (DataError("/data/train-0.bin: checksum mismatch"), "data-error", "/data/train-0.bin: checksum mismatch"),
    (dist.DistBackendError("[gloo] Connection closed by peer [127.0.0.1]:4242"), "collective-timeout",
     "DistBackendError: [gloo] Connection closed by peer [127.0.0.1]:4242"),
    (RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer"), "collective-timeout",
     "RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer"),
    (Fatal("stalled", "no step for 600 s"), "stalled", "no step for 600 s"),
    (KeyError("model.blocks.0"), "error", "KeyError: 'model.blocks.0'"),
    (ValueError("first line\nsecond line"), "error", "ValueError: first line"),
], ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else None)
def test_classify(exc, reason, line):
    assert classify(exc) == (reason, line)


# -- a full checkpoint volume, on 2 gloo ranks --


def _saves(rank: int, world_size: int, root: str, full: str) -> dict:
    """Save at steps 1, 2, 3 (keep_last 2); the third does not fit: by the check (`check`: the volume reports
    1000 bytes free) or by an ENOSPC from the shard writer (`write`: an asynchronous save)."""
    torch.manual_seed(0)
    model = nn.Linear(64, 64)
    optim = torch.optim.AdamW(model.parameters())
    state = TrainState(model, optim)
    cfg = CheckpointConfig(dir=root, interval_steps=1, keep_last=2, async_save=full == "write")
    ckpt = CheckpointManager(cfg, rank=rank, world_size=world_size, config_hash="full")
    ckpt.restore(state)
    real_write, real_usage = store.ChecksummingWriter.write, shutil.disk_usage

    def write(self, data):
        name = self._raw.name  # the shard file being written
        if store.step_dir_name(3) in name and self.checksum.size > 100:  # part of the shard is on disk already
            raise enospc(name)
        return real_write(self, data)

    def disk_usage(path):
        usage = real_usage(path)
        return usage._replace(free=1000) if state.step == 3 else usage

    store.ChecksummingWriter.write, shutil.disk_usage = (write, real_usage) if full == "write" else (real_write, disk_usage)
    try:
        for _ in range(3):
            model(torch.ones(2, 64)).sum().backward()
            optim.step()
            optim.zero_grad()
            state.step += 1
            ckpt.after_step(state, save=True)
        ckpt.finish(state)
    except Fatal as failed:
        return {"reason": failed.reason, "line": failed.line}
    finally:
        store.ChecksummingWriter.write, shutil.disk_usage = real_write, real_usage
        ckpt.close(wait=False)
    return {"reason": None}


@pytest.mark.parametrize("full", ["check", "write"])
def test_a_save_that_does_not_fit_fails_storage_full_and_keeps_what_was_committed(tmp_path, full):
    root = tmp_path / "ckpt"
    ranks = run_ranks(_saves, 2, str(root), full)
    # Every rank fails alike: the check is rank 0's verdict for all, DCP gathers every rank's write error.
    assert [r["reason"] for r in ranks] == ["storage-full"] * 2
    line = ranks[0]["line"]
    assert "the checkpoint of step 3 needs" in line and " free in " in line and "checkpoint.keep_last=2" in line
    if full == "write":
        assert line.startswith(f"No space left on device writing {store.tmp_dir(root, 3)}/")
    committed = store.list_checkpoints(root)
    assert [c.step for c in committed] == [2, 1]
    for c in committed:
        assert store.verify_files(c.path, c.manifest["files"], c.manifest["files"]) == []
    assert not list(root.glob("*" + contract.TMP_SUFFIX))


def test_a_stale_tmp_is_removed_at_the_next_start(tmp_path):
    root = tmp_path / "ckpt"
    stale = store.tmp_dir(root, 7)
    stale.mkdir(parents=True)
    (stale / "__0_0.distcp").write_bytes(b"half a shard")
    model = nn.Linear(4, 4)
    ckpt = CheckpointManager(CheckpointConfig(dir=str(root)), rank=0, world_size=1, config_hash="stale")
    assert ckpt.restore(TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))) is None
    ckpt.close()
    assert not stale.exists()


# -- real trainer processes, and what the operator makes of their messages --


def trainer_yaml(tmp: Path, **sections) -> Path:
    config = {
        "model": {"preset": "minimal"},
        "training": {"steps": 20, "micro_batch_size": 2, "seq_len": 16, "log_interval": 5},
        "distributed": {"strategy": "ddp", "timeout_seconds": 20},
        "data": {"source": "synthetic", "num_samples": 512},
        "checkpoint": {"dir": str(tmp / "ckpt"), "interval_steps": 10},
        "metrics": {"port": 0},
    }
    for name, values in sections.items():
        config[name] = {**config[name], **values}
    path = tmp / "trainer.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def launch(tmp: Path, argv: list[str], **env: str) -> tuple[Finished, str]:
    log = tmp / "termination-log"
    proc = run(argv, timeout=300, cwd=HERE,
               env={**os.environ, "OMP_NUM_THREADS": "1", contract.TERMINATION_LOG_ENV: str(log), **env})
    return proc, log.read_text()


def failing(config: Path) -> list[str]:
    return torchrun("--max-restarts", "0", HERE / "fail_entry.py", "--config", config)


def operator_view(message: str) -> tuple[dict, str]:
    """The operator's plan for a running 2-pod job whose pod 1 failed with `message`: (condition, event)."""
    job = parse_job({"apiVersion": "brain.ai/v1alpha1", "kind": "BrainTrainingJob",
                     "metadata": {"name": "j", "namespace": "default"},
                     "spec": {"image": "brain:1", "nodes": 2}})
    desired = render(job)
    children = [dict(o) for o in desired]
    for pod in children:
        if pod["kind"] == "Pod":
            failed = pod["metadata"]["name"] == "j-worker-1"
            pod["status"] = {"phase": "Failed" if failed else "Running", "containerStatuses": [
                {"name": "trainer", "state": {"terminated": {"exitCode": 1, "reason": "Error", "message": message}}
                 if failed else {"running": {}}}]}
    the_plan = plan(job, desired, children, {"phase": "Running", "startTime": "2026-11-24T11:00:00Z"}, NOW)
    status = the_plan.status.to_dict()
    condition = next(c for c in status["conditions"] if c["type"] == status["phase"])
    (event,) = [e.message for e in the_plan.events if e.reason == "WorkerFailed"]
    return condition, event


def assert_told(message: str, reason: str, condition_reason: str) -> str:
    parsed = contract.parse_termination(message)
    assert parsed is not None and parsed[0] == reason, message
    condition, event = operator_view(message)
    assert condition["reason"] == condition_reason and f"{reason}: {parsed[1]}" in condition["message"]
    assert f"{reason}: {parsed[1]}" in event
    return parsed[1]


def test_out_of_memory_in_a_step(tmp_path):
    proc, message = launch(tmp_path, failing(trainer_yaml(tmp_path)),
                           FAIL_MODE="memory", FAIL_AT="3", FAIL_RANK="1")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    line = assert_told(message, "out-of-memory", "OutOfMemory")
    assert line.startswith("MemoryError on rank 1: the memory planner estimates ")
    assert "GiB of host memory per rank; " in line and " GiB available (" in line
    # The traceback is logged once, by the rank that failed; its peer says one line.
    assert out.count("raise MemoryError()") == 1 and "rank 0: collective-timeout: " in out


def test_collective_timeout_when_a_peer_vanishes(tmp_path):
    proc, message = launch(tmp_path, failing(trainer_yaml(tmp_path)),
                           FAIL_MODE="vanish", FAIL_AT="3", FAIL_RANK="1")
    assert proc.returncode != 0
    assert_told(message, "collective-timeout", "CollectiveTimeout")


def test_config_error(tmp_path):
    config = trainer_yaml(tmp_path, training={"steps": 0})
    proc, message = launch(tmp_path, [sys.executable, "-m", "brain_trainer", "--config", str(config)])
    assert proc.returncode == contract.EXIT_CODES["config-error"] == 2
    assert proc.stderr.strip() == "error: training.steps: must be >= 1, got 0"
    assert assert_told(message, "config-error", "ConfigError") == "training.steps: must be >= 1, got 0"


def test_data_error(tmp_path):
    config = trainer_yaml(tmp_path, data={"source": "files", "path": str(tmp_path / "nothing" / "*.txt")})
    proc, message = launch(tmp_path, [sys.executable, "-m", "brain_trainer", "--config", str(config)])
    assert proc.returncode == contract.EXIT_CODES["data-error"] and "Traceback" not in proc.stderr
    assert assert_told(message, "data-error", "DataError").startswith("data.path: no files match ")


def test_a_restarted_attempt_takes_the_reason_the_failed_one_left_in_the_pod(tmp_path, monkeypatch):
    log = tmp_path / "termination-log"
    monkeypatch.setenv(contract.TERMINATION_LOG_ENV, str(log))
    monkeypatch.setenv(contract.RESTART_COUNT_ENV, "1")
    log.write_text(contract.termination_message("error", "RuntimeError: boom"))
    assert begin_attempt() == "error: RuntimeError: boom" and log.read_text() == ""
    assert begin_attempt() == UNNAMED_FAILURE  # torchrun counted a failure that was killed before it could say why
    monkeypatch.setenv(contract.RESTART_COUNT_ENV, "0")  # a pod's first attempt, or a restart no failure counted
    assert begin_attempt() is None


def test_a_reason_that_fails_the_job_stops_torchrun_restarting_the_pod(tmp_path):
    config = trainer_yaml(tmp_path, data={"source": "files", "path": str(tmp_path / "nothing" / "*.txt")})
    argv = torchrun("--max-restarts", "2", "-m", "brain_trainer", "--config", config)
    # torchrun says at INFO when it restarts the workers. The first rank to fail in an attempt ends it: torchrun
    # may end the peer before it says why, so the ranks' own lines count the attempts only roughly.
    restarted, message = launch(tmp_path, argv, LOGLEVEL="INFO")
    assert restarted.returncode != 0 and contract.parse_termination(message)[0] == "data-error"
    assert restarted.stderr.count("will restart worker group") == 2  # 3 attempts
    assert 3 <= restarted.stderr.count("error: data.path: no files match") <= 2 * 3
    stopped, message = launch(tmp_path, argv, LOGLEVEL="INFO", **{contract.FAIL_FAST_ENV: "storage-full,data-error"})
    assert stopped.returncode != 0 and contract.parse_termination(message)[0] == "data-error"
    # One attempt, no restart.
    assert "will restart worker group" not in stopped.stderr
    assert stopped.stderr.count("error: data.path: no files match") in (1, 2)
