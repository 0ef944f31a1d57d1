"""`braintrain run` with spec.checkpoint.uri (issue 37): the workers commit to the bucket (the endpoint and
credentials from the user's environment, AWS_ENDPOINT_URL...), the summary names the bucket's step, and a second
run of the job with more steps resumes from it, saying so before any worker starts.

The demo job on one worker pod, few steps (the start dominates).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml
from processes import run

from brain_trainer.contract import step_dir_name

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "local-minimal.yaml"
BRAINTRAIN = Path(sys.executable).with_name("braintrain")

pytestmark = pytest.mark.timeout(400)


def _job(path: Path, uri: str, steps: int) -> Path:
    job = yaml.safe_load(EXAMPLE.read_text())
    job["spec"].update(nodes=1)
    job["spec"]["training"].update(steps=steps, logInterval=2, seqLen=32, warmupSteps=0)
    job["spec"]["checkpoint"] = {"uri": uri, "intervalSteps": 2, "keepLast": 2}
    path.write_text(yaml.safe_dump(job))
    return path


def test_a_local_run_commits_to_the_bucket_and_a_second_run_resumes_from_it(s3, tmp_path):
    uri = f"{s3.bucket()}/runs/local-minimal"
    env = {**os.environ, **s3.env}
    where = ["--workdir", tmp_path / "run", "--claims", tmp_path / "claims"]

    first = run([BRAINTRAIN, "run", _job(tmp_path / "first.yaml", uri, 4), *where], env=env, timeout=180)
    assert first.returncode == 0, (first.stdout + first.stderr)[-4000:]
    assert f"checkpoint:  {uri}/{step_dir_name(4)}" in first.stdout.splitlines()
    assert not (tmp_path / "run" / "checkpoints").exists() and not (tmp_path / "claims").exists()

    second = run([BRAINTRAIN, "run", _job(tmp_path / "second.yaml", uri, 6), *where], env=env, timeout=180)
    out = second.stdout + second.stderr
    assert second.returncode == 0, out[-4000:]
    assert f"resuming local-minimal from {uri}/{step_dir_name(4)} (step 4 of 6)" in out
    assert f"resumed from {uri}/{step_dir_name(4)}: step 4" in out
    assert f"checkpoint:  {uri}/{step_dir_name(6)}" in second.stdout.splitlines()
    # keepLast 2, applied on the bucket
    keys = s3.client().list_objects_v2(Bucket=uri[len("s3://"):].split("/")[0])["Contents"]
    assert sorted({key["Key"].split("/")[2] for key in keys if "/step-" in key["Key"]}) == [
        step_dir_name(4), step_dir_name(6)]
