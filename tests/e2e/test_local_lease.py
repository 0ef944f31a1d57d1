"""`braintrain run`: two jobs of different names on one checkpoint claim (issue 23). The second is refused at start
with config-error naming the claim and the first job, without a restart; every checkpoint on the claim has one
writer; the first job's stop releases the lease.

The demo job (deploy/examples/local-minimal.yaml), two worker pods, with `spec.checkpoint.claimName`.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest
import yaml
from processes import run, start

from brain_trainer.checkpoint import lease, store

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "local-minimal.yaml"
BRAINTRAIN = Path(sys.executable).with_name("braintrain")
CLAIM = "shared-ckpt"

pytestmark = pytest.mark.timeout(400)


def write_job(folder: Path, name: str) -> Path:
    job = yaml.safe_load(EXAMPLE.read_text())
    job["metadata"]["name"] = name
    # More steps than the test lets it run: the first job is stopped, the second must not find the claim complete.
    job["spec"]["training"].update(steps=100000, logInterval=5)
    job["spec"]["checkpoint"] = {"claimName": CLAIM, "intervalSteps": 5, "keepLast": 100}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def braintrain_run(job: Path, workdir: Path) -> list:
    return [BRAINTRAIN, "run", job, "--workdir", workdir, "--claims", workdir.parent / "claims"]


def status_lines(out: str) -> list[str]:
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("status:"))
    return lines[at:at + 2]


def test_a_second_job_on_a_claim_in_use_is_refused_and_nothing_is_committed_twice(tmp_path):
    claim = tmp_path / "claims" / CLAIM
    first, second = tmp_path / "writer-a", tmp_path / "writer-b"
    with start(braintrain_run(write_job(tmp_path, "writer-a"), first), timeout=300) as writer:
        for _ in writer.lines():  # until the first job committed a checkpoint: it holds the claim
            if store.latest_checkpoint(claim) is not None:
                break
        refused = run(braintrain_run(write_job(tmp_path, "writer-b"), second), timeout=200)
        writer.send_signal(signal.SIGTERM)  # stopped: the trainers commit a checkpoint and release the lease
        writer.wait()
    out = refused.stdout + refused.stderr
    assert refused.returncode == 1, out[-4000:]
    status, reason = status_lines(out)
    assert status.startswith("status:      Failed (writer-b-worker-")
    assert "runPolicy.failurePolicy.configError: FailJob" in status
    assert reason.startswith(f"reason:      config-error: checkpoint claim {CLAIM} ({claim}) is in use by job writer-a "
                             f"({first}) since "), reason
    assert "restarts:    0" in out.splitlines() and "restarting all workers" not in out
    # One line per trainer, no traceback of theirs, nor of the agents that FAIL_FAST stopped.
    assert out.count("ERROR rank ") == 2 and "/brain_trainer/" not in out and "Traceback" not in out

    assert "status:      Stopped" in writer.output, writer.output[-4000:]
    committed = [c for c in store.list_checkpoints(claim) if c.manifest is not None]
    assert len(committed) >= 2  # an interval checkpoint and the stop's
    writers = {(c.manifest["lease"]["holder"], c.manifest["lease"]["generation"]) for c in committed}
    assert writers == {(f"job writer-a ({first})", 1)}
    held = lease.read_newest(claim)
    assert (held.generation, held.holder, held.released) == (1, f"job writer-a ({first})", True)
