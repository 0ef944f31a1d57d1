"""`braintrain run` end to end: real torchrun agents and trainers on this machine (gloo, CPU).

A shorter version of deploy/examples/local-minimal.yaml (the `make demo` job):
the same two worker pods and model, fewer steps, denser checkpoints.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from brain_trainer.checkpoint.store import list_checkpoints

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "local-minimal.yaml"
BRAINTRAIN = Path(sys.executable).with_name("braintrain")
STEPS = 20
# The example's volumeClaimTemplate makes the claim <job>-checkpoints: locally, a folder of the claims folder.
CLAIM = "local-minimal-checkpoints"

pytestmark = pytest.mark.timeout(300)


def write_job(path: Path, steps: int = STEPS) -> Path:
    job = yaml.safe_load(EXAMPLE.read_text())
    job["spec"]["training"].update(steps=steps, logInterval=5)
    job["spec"]["checkpoint"].update(intervalSteps=5)
    path.write_text(yaml.safe_dump(job))
    return path


def claim_of(workdir: Path) -> Path:
    """The checkpoint claim's folder of a run in `workdir`: every run beside it shares it."""
    return workdir.parent / "claims" / CLAIM


def start(job: Path, workdir: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [BRAINTRAIN, "run", job, "--workdir", workdir, "--claims", workdir.parent / "claims"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        stop(proc)
        raise
    return proc.returncode, out


def stop(proc: subprocess.Popen) -> None:
    """End a run that overstayed as Ctrl-C would (the runner ends its workers), then for good."""
    proc.terminate()
    try:
        proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()


def committed_steps(workdir: Path) -> list[int]:
    return sorted(c.step for c in list_checkpoints(claim_of(workdir)) if c.manifest is not None)


def progress_step(workdir: Path) -> int:
    try:
        return json.loads((workdir / "progress.json").read_text())["step"]
    except (OSError, ValueError):
        return 0


def summary(out: str) -> dict[str, str]:
    fields = {}
    for line in out.splitlines():
        head, sep, value = line.partition(":")
        if sep and head in ("status", "steps", "final loss", "restarts", "checkpoint"):
            fields[head] = value.strip()
    return fields


def model_weights(checkpoint: Path, scratch: Path) -> dict[str, torch.Tensor]:
    """The model tensors of a committed checkpoint, consolidated without a process group."""
    out = scratch / f"{checkpoint.parent.parent.name}-{checkpoint.name}.pt"
    dcp_to_torch_save(checkpoint, out)
    return torch.load(out, weights_only=False)["model"]


def agent_of(pod_index: int, workdir: Path) -> int:
    """The pid of the torchrun agent playing worker pod `pod_index` of the run in `workdir`."""
    progress = f"BRAIN_PROGRESS_FILE={workdir / 'progress.json'}".encode()
    host = f"PET_RDZV_CONF=is_host={1 if pod_index == 0 else 0}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"torch.distributed.run" in cmdline and progress in environ and host in environ:
            return int(entry.name)
    raise AssertionError(f"no torchrun agent for pod {pod_index} of {workdir}")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One uninterrupted run of the job."""
    root = tmp_path_factory.mktemp("reference")
    job = write_job(root / "job.yaml")
    code, out = finish(start(job, root / "run"))
    return job, root / "run", code, out


def test_the_job_succeeds_with_a_falling_loss_and_committed_checkpoints(reference):
    _, workdir, code, out = reference
    assert code == 0, out
    fields = summary(out)
    assert fields["status"] == "Succeeded" and fields["steps"] == f"{STEPS}/{STEPS}"
    final, first = fields["final loss"].replace(")", "").split(" (first logged: ")
    assert float(final) < 0.8 * float(first)
    assert committed_steps(workdir)[-1] == STEPS
    assert fields["checkpoint"] == str(claim_of(workdir) / f"step-{STEPS:08d}")
    # The workers' output is labelled with its pod's name; rank 0 logs the run, every rank its memory after init.
    trainer_lines = [line for line in out.splitlines() if " brain_trainer." in line]
    assert trainer_lines and all(line.startswith("[local-minimal-worker-0] ") for line in trainer_lines
                                 if "after init:" not in line)
    assert any(line.startswith("[local-minimal-worker-1] ") and "rank 1 after init:" in line for line in trainer_lines)


def test_a_killed_worker_pod_restarts_the_group_and_ends_with_the_same_weights(reference, tmp_path):
    job, reference_dir, code, _ = reference
    assert code == 0
    workdir = tmp_path / "run"
    proc = start(job, workdir)
    killed, lines = None, []
    # Every line the runner prints is a moment to look: kill worker pod 1 once a
    # checkpoint is committed and training goes on.
    for line in proc.stdout:
        lines.append(line)
        if killed is None:
            steps = committed_steps(workdir)
            if steps and steps[-1] < STEPS and progress_step(workdir) < STEPS:
                killed = agent_of(1, workdir)
                os.kill(killed, signal.SIGKILL)
    out = "".join(lines)
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        stop(proc)
        raise
    assert code == 0, out
    assert killed is not None, "the run ended before a worker could be killed"
    fields = summary(out)
    assert fields["status"] == "Succeeded" and int(fields["restarts"]) >= 1
    # The killed pod's reason: none (an error, counted), or, when its orphaned trainer got torchrun's death
    # signal (SIGTERM) in time to commit a checkpoint, preempted (not counted).
    assert re.search(r"^braintrain: local-minimal-worker-1: (error: exit code -9, no reason from the trainer; restarted, "
                     r"counted|preempted: SIGTERM: step \d+ committed, exiting to be restarted; retried without counting)"
                     r" against runPolicy\.backoffLimit .*: restarting all workers from the newest checkpoint$", out, re.M), out
    scratch = tmp_path / "weights"
    scratch.mkdir()
    final = f"step-{STEPS:08d}"
    ours = model_weights(claim_of(workdir) / final, scratch)
    theirs = model_weights(claim_of(reference_dir) / final, scratch)
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name


def test_a_finished_job_is_complete_and_a_new_run_on_the_same_claim_continues(reference):
    job, workdir, code, _ = reference
    assert code == 0
    before = committed_steps(workdir)
    code, out = finish(start(job, workdir))
    assert code == 0
    assert f"local-minimal is already complete: {claim_of(workdir) / f'step-{STEPS:08d}'} holds step {STEPS}" in out
    assert "[local-minimal-worker" not in out and committed_steps(workdir) == before

    # A new work directory (a recreated job), the same claim: it resumes from the claim's checkpoint.
    more, elsewhere = STEPS + 5, workdir.parent / "recreated"
    code, out = finish(start(write_job(job, steps=more), elsewhere))
    assert code == 0, out
    assert f"resuming local-minimal from {claim_of(elsewhere) / f'step-{STEPS:08d}'} (step {STEPS} of {more})" in out
    assert claim_of(elsewhere) == claim_of(workdir) and not (elsewhere / "checkpoints").exists()
    assert summary(out)["steps"] == f"{more}/{more}" and committed_steps(workdir)[-1] == more
