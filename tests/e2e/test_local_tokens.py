"""`braintrain run` of deploy/examples/local-tokens.yaml (the `make demo` job), shortened: a prepared dataset
on the job's data claim, read from the local claims folder, with held-out evaluation in the summary."""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

import pytest
import yaml
from processes import run

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "local-tokens.yaml"
BRAINTRAIN = Path(sys.executable).with_name("braintrain")
STDLIB = Path(sysconfig.get_paths()["stdlib"])

pytestmark = pytest.mark.timeout(400)


def test_the_demo_job_trains_on_its_data_claim_and_evaluates(tmp_path):
    job = yaml.safe_load(EXAMPLE.read_text())
    claim = job["spec"]["data"]["volume"]["claimName"]
    folder = job["spec"]["data"]["path"].removeprefix(job["spec"]["data"]["volume"]["mountPath"] + "/")
    claims = tmp_path / "claims"
    prepared = run(
        [BRAINTRAIN, "prepare", str(STDLIB / "json" / "*.py"), str(STDLIB / "email" / "*.py"), "--train-tokenizer",
         "--vocab-size", "512", "--val-fraction", "0.2", "--out", claims / claim / folder],
        timeout=120,
    )
    assert prepared.returncode == 0, prepared.stderr
    job["spec"]["training"].update(steps=40, logInterval=10, evalInterval=20, evalSteps=4)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))

    done = run([BRAINTRAIN, "run", path, "--workdir", tmp_path / "run", "--claims", claims], timeout=360)
    assert done.returncode == 0, done.stdout[-4000:]
    evals = [line for line in done.stdout.splitlines() if "brain_trainer.observe.reporter INFO eval step " in line]
    assert len(evals) == 2 and "eval step 40/40 loss" in evals[-1] and "perplexity" in evals[-1]
    assert "status:      Succeeded" in done.stdout
    summary = next(line for line in done.stdout.splitlines() if line.startswith("eval loss:"))
    last, first = float(summary.split()[2]), float(summary.split("first: ")[1].rstrip(")"))
    assert last < first, summary
