"""A worker 0 that starts late costs nothing (issue 21, point 3): two real torchrun agents (gloo, one process
each) with the rendezvous the operator renders for a pod, a TCP store hosted by worker 0 (`is_host=1`) and the
join and store timeouts from watchdog.startupSeconds.

Worker 1 starts first and connects to a store nobody hosts yet. A control agent, the same worker 1 rendered
with a short startupSeconds (standing in for torch's own 60 s store timeout, which would make the test a
minute long), starts after it and gives up: only then is worker 0 started, so worker 1 has demonstrably
waited longer than a store timeout like the control's would have let it. Worker 1 is still waiting, and once
worker 0 comes up both train to the end.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml
from processes import start

from brain_operator.local.plan import LocalWorker, plan_local, process_env
from brain_operator.backends import render_elastic
from brain_operator.spec import parse_job
from brain_trainer.parallel.launcher import held_port

pytestmark = pytest.mark.timeout(400)

# Long enough for a loaded machine to start worker 0 after the control gave up; short enough that a broken
# rendering fails the test within minutes.
WAITING_SECONDS = 240
# The control's store timeout: torch's TCPStore retries a connection until it passes.
SHORT_SECONDS = 2


def manifest(startup_seconds: float) -> dict:
    return {
        "apiVersion": "brain.ai/v1alpha1",
        "kind": "BrainTrainingJob",
        "metadata": {"name": "late", "namespace": "default", "uid": "uid-late"},
        "spec": {
            "nodes": 2,
            "model": {"preset": "minimal"},
            "training": {"steps": 4, "microBatchSize": 2, "seqLen": 16, "logInterval": 2},
            "distributed": {"backend": "gloo", "strategy": "ddp"},
            "data": {"source": "synthetic"},
            "checkpoint": {"enabled": False},
            "watchdog": {"startupSeconds": startup_seconds},
        },
    }


def agents(tmp: Path, startup_seconds: float, port: int) -> list[LocalWorker]:
    """The job's workers as local agents, with the pods' own rendezvous (a TCP store on worker 0) on loopback."""
    job = parse_job(manifest(startup_seconds), require_image=False)
    plan = plan_local(job, workdir=tmp, claims=tmp / "claims", rendezvous=tmp / "rendezvous" / "unused",
                      metrics_port=0, python=sys.executable, cpu_count=2)
    for path, text in plan.files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for folder in plan.dirs:
        folder.mkdir(parents=True, exist_ok=True)
    pods = [o for o in render_elastic(job) if o["kind"] == "Pod"]
    out = []
    for worker, pod in zip(plan.workers, pods):
        rendered = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
        env = {**worker.env, "PET_RDZV_ENDPOINT": f"127.0.0.1:{port}", "PET_RDZV_CONF": rendered["PET_RDZV_CONF"],
               "LOGLEVEL": "INFO"}
        out.append(LocalWorker(worker.name, worker.argv, env, worker.scratch_dirs, worker.termination_log))
    return out


def spawn(worker: LocalWorker, cwd: Path, timeout: float):
    return start(worker.argv, env=process_env(os.environ, worker), cwd=cwd, timeout=timeout)


def until(child, text: str) -> None:
    """Read the child's output until a line contains `text` (its deadline ends a wait that never comes)."""
    if not any(text in line for line in child.lines()):
        raise AssertionError(f"{text!r} never came; output:\n{child.output[-3000:]}")


def test_a_worker_0_started_late_still_trains(tmp_path):
    # Held, not listening, until the test ends: worker 0's store binds the job's port; the control's stays closed.
    with held_port() as port, held_port() as control_port:
        zero, one = agents(tmp_path / "job", WAITING_SECONDS, port)
        assert one.env["PET_RDZV_CONF"] == f"is_host=0,join_timeout={WAITING_SECONDS},read_timeout={WAITING_SECONDS}"
        _, control = agents(tmp_path / "control", SHORT_SECONDS, control_port)

        with spawn(one, tmp_path / "job", 360) as waiting:
            # torchrun prints its launch configuration, then blocks connecting to worker 0's store.
            until(waiting, f"'read_timeout': '{WAITING_SECONDS}'")
            with spawn(control, tmp_path / "control", 120) as gave_up:
                assert gave_up.wait() != 0
            assert "client socket has timed out" in gave_up.output or "RendezvousConnectionError" in gave_up.output
            assert waiting.poll() is None, waiting.output[-3000:]

            with spawn(zero, tmp_path / "job", 300) as host:
                assert host.wait() == 0, host.output[-3000:]
            assert waiting.wait() == 0, waiting.output[-3000:]
    # Trained: rank 0's progress document reached the last step.
    progress = yaml.safe_load((tmp_path / "job" / "progress.json").read_text())
    assert progress["step"] == 4
