"""`braintrain run` end to end: real torchrun agents and trainers on this machine (gloo, CPU).

A shorter version of deploy/examples/local-minimal.yaml (the `make demo` job):
the same two worker pods and model, fewer steps, denser checkpoints.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import sys
from pathlib import Path
from typing import Callable

import pytest
import torch
import yaml
from processes import Child, alive, start

from brain_operator.local.run import request_checkpoint, request_profile
from brain_trainer.checkpoint import shards
from brain_trainer.checkpoint.store import list_checkpoints
from brain_trainer.contract import TERMINATION_LOG_ENV

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "local-minimal.yaml"
BRAINTRAIN = Path(sys.executable).with_name("braintrain")
STEPS = 20
# The example's volumeClaimTemplate makes the claim <job>-checkpoints: locally, a folder of the claims folder.
CLAIM = "local-minimal-checkpoints"
WATCHDOG_FLOOR = 15
# Rank 0's log line of a step, as the runner prints it.
LOGGED_STEP = re.compile(r"\[local-minimal-worker-0\] .* step (\d+)/\d+ loss ")

pytestmark = pytest.mark.timeout(300)


def write_job(path: Path, steps: int = STEPS, log_interval: int = 5, **checkpoint) -> Path:
    job = yaml.safe_load(EXAMPLE.read_text())
    job["spec"]["training"].update(steps=steps, logInterval=log_interval)
    job["spec"]["checkpoint"].update({"intervalSteps": 5, **checkpoint})
    # A frozen peer is noticed after WATCHDOG_FLOOR s (the steps take far less), once each (re)start warmed up.
    job["spec"]["watchdog"] = {"floorSeconds": WATCHDOG_FLOOR, "warmupSteps": 2, "checkpointSeconds": 2 * WATCHDOG_FLOOR}
    path.write_text(yaml.safe_dump(job))
    return path


def claim_of(workdir: Path) -> Path:
    """The checkpoint claim's folder of a run in `workdir`: every run beside it shares it."""
    return workdir.parent / "claims" / CLAIM


def braintrain_run(job: Path, workdir: Path, timeout: float = 240) -> Child:
    """The runner, its agents and trainers; use it in a `with` block, which ends whatever is left of them."""
    return start([BRAINTRAIN, "run", job, "--workdir", workdir, "--claims", workdir.parent / "claims"], timeout=timeout)


def finish(job: Path, workdir: Path) -> tuple[int, str]:
    with braintrain_run(job, workdir) as run:
        return run.wait(), run.output


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


def model_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The model tensors of a committed checkpoint, consolidated without a process group.

    Read as the trainer reads them: DCP's own dcp_to_torch_save would torch.load the training state's JSON items.
    """
    return shards.load_prefix(checkpoint, "model")


def process_of(workdir: Path, program: bytes, marker: bytes, what: str) -> int:
    """The pid of the process of the run in `workdir` running `program` with `marker` in its environment."""
    progress = f"BRAIN_PROGRESS_FILE={workdir / 'progress.json'}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if program in cmdline and progress in environ and marker in environ:
            return int(entry.name)
    raise AssertionError(f"no {what} of {workdir}")


def agent_of(pod_index: int, workdir: Path) -> int:
    """The pid of the torchrun agent playing worker pod `pod_index` of the run in `workdir`."""
    pod = f"{TERMINATION_LOG_ENV}={workdir / 'termination' / f'local-minimal-worker-{pod_index}'}".encode()
    return process_of(workdir, b"brain_trainer.agent", pod, f"torchrun agent for pod {pod_index}")


def trainer_of(rank: int, workdir: Path) -> int:
    """The pid of the trainer process of `rank` in the run in `workdir`."""
    return process_of(workdir, b"brain_trainer", f"RANK={rank}".encode(), f"trainer of rank {rank}")


def same_final_weights(workdir: Path, reference_dir: Path) -> None:
    final = f"step-{STEPS:08d}"
    ours = model_weights(claim_of(workdir) / final)
    theirs = model_weights(claim_of(reference_dir) / final)
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One uninterrupted run of the job."""
    root = tmp_path_factory.mktemp("reference")
    job = write_job(root / "job.yaml")
    code, out = finish(job, root / "run")
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
    killed = None
    with braintrain_run(job, workdir) as run:
        # Every line the runner prints is a moment to look: kill worker pod 1 once a
        # checkpoint is committed and training goes on.
        for _ in run.lines():
            if killed is None:
                steps = committed_steps(workdir)
                if steps and steps[-1] < STEPS and progress_step(workdir) < STEPS:
                    killed = agent_of(1, workdir)
                    os.kill(killed, signal.SIGKILL)
        code = run.wait()
    out = run.output
    assert code == 0, out
    assert killed is not None, "the run ended before a worker could be killed"
    fields = summary(out)
    # `restarts:    N`, or `N (M in pod, last: ...)` when torchrun also restarted pod 0's workers in place.
    assert fields["status"] == "Succeeded" and int(fields["restarts"].split()[0]) >= 1
    # The killed pod's reason: none (an error, counted), or, when its orphaned trainer got torchrun's death
    # signal (SIGTERM) in time to commit a checkpoint, preempted (not counted).
    assert re.search(r"^braintrain: local-minimal-worker-1: (error: exit code -9, no reason from the trainer; restarted, "
                     r"counted|preempted: SIGTERM: step \d+ committed, exiting to be restarted; retried without counting)"
                     r" against runPolicy\.backoffLimit .*: restarting all workers from the newest checkpoint$", out, re.M), out
    same_final_weights(workdir, reference_dir)


@pytest.mark.timeout(600)
def test_a_frozen_trainer_is_noticed_by_its_peer_and_the_group_resumes_with_the_same_weights(reference, tmp_path):
    job, reference_dir, code, _ = reference
    assert code == 0
    workdir = tmp_path / "run"
    frozen = committed_at_freeze = None
    resumed = []
    with braintrain_run(job, workdir, timeout=540) as run:
        # Freeze rank 1 (worker pod 1) once a checkpoint is committed and training goes on: rank 0
        # waits for it in a collective until its watchdog ends it; torchrun restarts the group.
        for line in run.lines():
            if frozen is None:
                steps = committed_steps(workdir)
                if steps and steps[-1] < STEPS and progress_step(workdir) < STEPS:
                    frozen, committed_at_freeze = trainer_of(1, workdir), steps[-1]
                    os.kill(frozen, signal.SIGSTOP)
            elif "resumed from" in line:
                # The new group formed only once worker pod 1's agent had ended the frozen trainer.
                resumed.append((line, alive(frozen)))
        code = run.wait()
        # Ended by the run itself, before the block's end kills whatever is left.
        frozen_left = frozen is not None and alive(frozen)
    out = run.output
    assert code == 0, out
    assert frozen is not None, "the run ended before a trainer could be frozen"
    assert summary(out)["status"] == "Succeeded"
    # Rank 0 (worker pod 0) noticed within the floor the job configured, not the process group's 30-minute timeout.
    stalled = [line for line in out.splitlines() if "brain_trainer.resilience.watchdog ERROR stalled: " in line]
    assert len(stalled) == 1 and stalled[0].startswith("[local-minimal-worker-0] "), out
    assert f"(limit {WATCHDOG_FLOOR} s: floorSeconds;" in stalled[0]
    # Its stacks are in the log: the main thread where it waited, the watchdog's own.
    assert "[local-minimal-worker-0] Thread 0x" in out and "most recent call first" in out
    assert 'brain_trainer/resilience/watchdog.py", line' in out and 'brain_trainer/loop/train.py", line' in out
    # The runner saw it too: no progress for longer than the job allows (the frozen peer, then the group's restart).
    notes = [line for line in out.splitlines() if line.startswith("braintrain: ")]
    stall = next(i for i, line in enumerate(notes) if line.startswith("braintrain: stalled: no progress for "))
    # The watchdog's limits between two reports, plus the second the document's times are rounded to.
    assert int(re.search(r"\(limit (\d+) s: ", notes[stall])[1]) >= WATCHDOG_FLOOR + 1
    assert any(line.startswith("braintrain: progress again at step ") for line in notes[stall + 1:])
    # The group resumed from the newest checkpoint, with the frozen trainer gone, and finished as if nothing happened.
    assert len(resumed) == 1 and not resumed[0][1], resumed
    step = int(resumed[0][0].split("/step-")[1][:8])
    assert committed_at_freeze <= step < STEPS
    assert not frozen_left
    same_final_weights(workdir, reference_dir)


def test_a_finished_job_is_complete_and_a_new_run_on_the_same_claim_continues(reference):
    job, workdir, code, _ = reference
    assert code == 0
    before = committed_steps(workdir)
    code, out = finish(job, workdir)
    assert code == 0
    assert f"local-minimal is already complete: {claim_of(workdir) / f'step-{STEPS:08d}'} holds step {STEPS}" in out
    assert "[local-minimal-worker" not in out and committed_steps(workdir) == before

    # A new work directory (a recreated job), the same claim: it resumes from the claim's checkpoint.
    more, elsewhere = STEPS + 5, workdir.parent / "recreated"
    code, out = finish(write_job(job, steps=more), elsewhere)
    assert code == 0, out
    assert f"resuming local-minimal from {claim_of(elsewhere) / f'step-{STEPS:08d}'} (step {STEPS} of {more})" in out
    assert claim_of(elsewhere) == claim_of(workdir) and not (elsewhere / "checkpoints").exists()
    assert summary(out)["steps"] == f"{more}/{more}" and committed_steps(workdir)[-1] == more


def asked_mid_run(job: Path, workdir: Path, ask: Callable[[Path], str]) -> tuple[int, str, str]:
    """The run, asked once mid-run (`ask(workdir)`: what `braintrain checkpoint` or `profile` does, without a second
    Python's start-up between the look and the ask): the step rank 0 had reported then, the request, the output."""
    asked_at = request = None
    with braintrain_run(job, workdir) as run:
        for _ in run.lines():
            if request is None and 3 <= progress_step(workdir) <= STEPS - 5:
                asked_at, request = progress_step(workdir), ask(workdir)
        code = run.wait()
    assert code == 0, run.output
    assert asked_at is not None and request is not None, "the run ended before it could be asked"
    return asked_at, request, run.output


def test_a_checkpoint_on_demand_is_committed_within_two_steps(tmp_path):
    # No interval saves, a progress document after every step and a vote after every step: any
    # checkpoint before the last step is the one asked for, and the test sees the step it asked at.
    job = write_job(tmp_path / "job.yaml", log_interval=1, intervalSteps=0, preemptionVoteSeconds=0)
    workdir = tmp_path / "run"
    asked_at, request, out = asked_mid_run(job, workdir, request_checkpoint)
    *on_demand, last = committed_steps(workdir)
    assert last == STEPS and len(on_demand) == 1, committed_steps(workdir)
    assert asked_at < on_demand[0] <= asked_at + 2
    assert f"checkpoint requested ({request}): saving step {on_demand[0]}" in out
    doc = json.loads((workdir / "progress.json").read_text())
    assert (doc["checkpoint_request"], doc["checkpoint_request_step"]) == (request, on_demand[0])


def test_a_profile_on_demand_traces_the_steps_asked_for_on_both_workers(tmp_path):
    # A vote after every step: the vote that reads the request is within two steps of the one the test saw when it
    # asked (as a checkpoint on demand is, which saves that vote's step), and the profile traces the steps after it.
    job = write_job(tmp_path / "job.yaml", log_interval=1, preemptionVoteSeconds=0)
    workdir = tmp_path / "run"
    asked_at, request, out = asked_mid_run(job, workdir, lambda w: request_profile(w, 2))
    folder = Path(json.loads((workdir / "progress.json").read_text())["profile"])
    start = int(folder.name.removeprefix("step-"))
    assert asked_at + 1 < start <= asked_at + 3 and folder.parent == claim_of(workdir) / "profiles"
    assert f"profiling steps {start}-{start + 1} on every rank (requested)" in out
    for rank in (0, 1):
        with gzip.open(folder / f"rank-{rank}.json.gz", "rt") as f:
            names = {event.get("name", "") for event in json.load(f)["traceEvents"]}
        assert {n for n in names if n.startswith("ProfilerStep#")} == {f"ProfilerStep#{start}", f"ProfilerStep#{start + 1}"}


def test_a_killed_trainer_on_worker_1_is_one_restart_and_goodput_shows_the_recomputed_steps(tmp_path):
    # A log line after every step: the test kills between two checkpoints (every 5 steps), once rank 0 has
    # logged a step past the newest committed one, so the steps since that commit are lost.
    job = write_job(tmp_path / "job.yaml", log_interval=1)
    workdir = tmp_path / "run"
    killed = None
    with braintrain_run(job, workdir) as run:
        for line in run.lines():
            logged = LOGGED_STEP.search(line)
            step = int(logged[1]) if logged else 0
            committed = committed_steps(workdir)
            if killed is None and committed and committed[-1] < step < STEPS - 2 and step % 5 in (1, 2, 3):
                killed = trainer_of(1, workdir)  # rank 1: worker pod 1's trainer; its torchrun agent restarts the group
                os.kill(killed, signal.SIGKILL)
        code = run.wait()
    out = run.output
    assert code == 0, out
    assert killed is not None, "the run ended before a trainer could be killed"
    goodput = json.loads((workdir / "progress.json").read_text())["goodput"]
    assert goodput["recomputed_seconds"] > 0 and goodput["productive_seconds"] > 0
    parts = sum(value for key, value in goodput.items() if key.endswith("_seconds") and key != "wall_seconds")
    assert abs(parts - goodput["wall_seconds"]) <= 0.05 * goodput["wall_seconds"], goodput
    assert goodput["ratio"] == pytest.approx(goodput["productive_seconds"] / goodput["wall_seconds"])
    ledger = json.loads((claim_of(workdir) / "goodput.json").read_text())
    assert ledger["high_water"] == STEPS and ledger["run_id"] == "local-minimal"
    # Truthful restarts: rank 0's own agent restarted nothing of its own, yet the one group restart is counted, once.
    assert json.loads((workdir / "progress.json").read_text())["restarts"] == ledger["restarts"] == 1
    (shown,) = [line for line in out.splitlines() if line.startswith("goodput:")]
    assert f"{100 * goodput['ratio']:.0f}% of " in shown and "recomputed" in shown


def test_a_stopped_run_ends_with_its_summary_and_no_traceback(tmp_path):
    """SIGTERM (what Ctrl-C and `kill` send): the trainers commit a checkpoint, the agents stop quietly, the summary
    says Stopped and lists the run's --set overrides."""
    job = write_job(tmp_path / "job.yaml")
    workdir = tmp_path / "run"
    argv = [BRAINTRAIN, "run", job, "--workdir", workdir, "--claims", workdir.parent / "claims",
            "--set", "training.steps=100000", "--set", "checkpoint.intervalSteps=0"]
    stopped_at = None
    with start(argv, timeout=240) as run:
        for line in run.lines():
            logged = LOGGED_STEP.search(line)
            # Rank 0 logged a step: every trainer runs, so every agent has its signal handlers.
            if stopped_at is None and logged:
                stopped_at = int(logged[1])
                run.send_signal(signal.SIGTERM)
        code = run.wait()
    out = run.output
    assert stopped_at is not None, out[-4000:]
    assert code == 128 + signal.SIGTERM, out[-4000:]
    lines = out.splitlines()
    status = next(i for i, line in enumerate(lines) if line.startswith("status:"))
    assert lines[status:status + 2] == ["status:      Stopped (SIGTERM; rerun to continue)",
                                        "overrides:   --set training.steps=100000 --set checkpoint.intervalSteps=0"]
    assert "Traceback" not in out and "SignalException" not in out, out[-4000:]
    # The trainers' own stop, as before: a checkpoint committed past the step the runner saw logged.
    assert summary(out)["steps"].endswith("/100000") and committed_steps(workdir)[-1] >= stopped_at
