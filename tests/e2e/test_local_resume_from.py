"""`braintrain run` with spec.checkpoint.resumeFrom (issue 23): a run rolled back to an earlier step sets the newer
checkpoint aside and says where in its summary; running it again sets nothing aside; a step that is not committed
is refused before any worker starts; `braintrain checkpoint` on the finished run says it is not running.

The demo job on one worker pod, few steps (the start dominates).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml
from processes import run

from brain_trainer.checkpoint import store

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "local-minimal.yaml"
BRAINTRAIN = Path(sys.executable).with_name("braintrain")
CLAIM = "local-minimal-checkpoints"

pytestmark = pytest.mark.timeout(400)


def _job(path: Path, steps: int, **checkpoint) -> Path:
    job = yaml.safe_load(EXAMPLE.read_text())
    job["spec"].update(nodes=1)
    job["spec"]["training"].update(steps=steps, logInterval=5)
    job["spec"]["checkpoint"].update({"intervalSteps": 10, "keepLast": 3, **checkpoint})
    path.write_text(yaml.safe_dump(job))
    return path


def _braintrain(*args, timeout: float = 180):
    proc = run([BRAINTRAIN, *args], timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def test_resume_from_an_earlier_step_sets_the_newer_checkpoint_aside_once(tmp_path):
    claims, workdir = tmp_path / "claims", tmp_path / "run"
    where = ["--workdir", workdir, "--claims", claims]
    claim = claims / CLAIM
    code, out = _braintrain("run", _job(tmp_path / "first.yaml", 20), *where)
    assert code == 0, out[-4000:]
    assert [c.step for c in store.list_checkpoints(claim)] == [20, 10]

    back = _job(tmp_path / "back.yaml", 30, resumeFrom=10)
    code, out = _braintrain("run", back, *where)
    assert code == 0, out[-4000:]
    [aside] = store.set_aside_folders(claim)
    assert f"set aside:   {aside} (checkpoints moved out of the way by checkpoint.resumeFrom)" in out.splitlines()
    assert re.search(rf"checkpoint.resume_from 10: moved step-00000020 aside to {re.escape(str(aside))}; "
                     r"starting from step 10", out), out[-4000:]
    assert "resumed from " + str(claim / "step-00000010") in out
    assert [p.name for p in aside.iterdir()] == ["step-00000020"]
    moved = store.read_manifest(aside / "step-00000020")
    assert store.verify_files(aside / "step-00000020", moved["files"], moved["files"]) == []
    assert [c.step for c in store.list_checkpoints(claim)] == [30, 20, 10]  # 20 again: this run's own

    # The same run again: resumeFrom 10 is applied already, so it is complete, and nothing more is set aside.
    code, out = _braintrain("run", back, *where)
    assert code == 0 and "is already complete" in out and "holds step 30 of 30" in out, out[-4000:]
    assert store.set_aside_folders(claim) == [aside]

    code, out = _braintrain("checkpoint", workdir, timeout=60)
    assert (code, out) == (1, f"braintrain: {workdir}: the run is not running (last: Succeeded at step 30/30)\n")

    code, out = _braintrain("run", _job(tmp_path / "missing.yaml", 30, resumeFrom=70), *where, timeout=60)
    assert (code, out) == (1, f"braintrain: spec.checkpoint.resumeFrom: step 70 is not a committed checkpoint in "
                              f"{claim}; committed: 10, 20, 30\n")
    assert store.set_aside_folders(claim) == [aside]
