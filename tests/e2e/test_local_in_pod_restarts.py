"""In-pod restarts shown and counted (issue 27): `braintrain run` of the demo job (two worker pods), whose model
raises once on rank 0 at step 7, after the checkpoint of step 4 and the logging step 6. torchrun restarts the workers inside the pods (no pod
fails, so the runner restarts nothing); the trainer counts the restart with its reason in the goodput ledger,
and the run's summary shows it beside the runner's restarts, with the lost time in the goodput line."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml
from processes import run

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "local-minimal.yaml"
BRAINTRAIN = Path(sys.executable).with_name("braintrain")
CLAIM = "local-minimal-checkpoints"

pytestmark = pytest.mark.timeout(400)


def test_a_worker_that_fails_once_shows_one_in_pod_restart_with_its_reason(tmp_path):
    job = yaml.safe_load(EXAMPLE.read_text())
    job["spec"]["model"] = {"entrypoint": "raise_once:build"}
    job["spec"]["training"].update(steps=8, logInterval=2, warmupSteps=2)
    job["spec"]["checkpoint"].update(intervalSteps=4)
    path, claims = tmp_path / "job.yaml", tmp_path / "claims"
    claims.mkdir()
    path.write_text(yaml.safe_dump(job))
    env = {**os.environ, "FAIL_AT": "7",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parent / "in_pod"), os.environ.get("PYTHONPATH")]))}
    proc = run([BRAINTRAIN, "run", path, "--workdir", tmp_path / "run", "--claims", claims], timeout=360, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    lines = out.splitlines()
    assert "status:      Succeeded" in lines, out[-4000:]
    assert "restarts:    1 (1 in pod, last: error: RuntimeError: boom)" in lines, out[-4000:]
    assert "steps:       8/8" in lines
    # The runner restarted no pod: torchrun restarted the workers inside them, from the checkpoint of step 4.
    assert "restarting all workers" not in out and "resumed from" in out
    # The ledger agrees: one restart of the run, the in-pod one, and its cost in waiting and recomputed time.
    ledger = json.loads((claims / CLAIM / "goodput.json").read_text())
    assert (ledger["restarts"], ledger["in_pod_restarts"]) == (1, 1)
    assert ledger["last_in_pod_restart"] == "error: RuntimeError: boom"
    assert ledger["seconds"]["waiting"] > 0 and ledger["seconds"]["recomputed"] > 0
    goodput = next(line for line in lines if line.startswith("goodput:"))
    assert "waiting" in goodput and "recomputed" in goodput, goodput
