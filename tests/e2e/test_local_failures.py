"""`braintrain run` when the checkpoint volume fills up (issue 18): the demo job, two worker pods, with its
claim on a filesystem with room for two checkpoints but not a third (a real tmpfs where this machine lets
the test mount one; else the same size reported to every process of the run, see small_fs/).

The run ends Failed with reason storage-full in its summary, without a restart of the runner's, every
committed checkpoint intact and no half-written .tmp left.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from pathlib import Path
from typing import Iterator

import pytest
import yaml
from processes import run

from brain_trainer import contract
from brain_trainer.checkpoint import store

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "local-minimal.yaml"
BRAINTRAIN = Path(sys.executable).with_name("braintrain")
CLAIM = "local-minimal-checkpoints"
# Two checkpoints of the minimal preset (about 12.4 MB each) fit, a third does not.
VOLUME_MB = 32

pytestmark = pytest.mark.timeout(400)


@contextlib.contextmanager
def small_volume(folder: Path, size_mb: int) -> Iterator[dict[str, str]]:
    """`folder` as a filesystem of size_mb; yields the environment the run needs for it."""
    folder.mkdir(parents=True)
    mounted = run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", folder], timeout=60).returncode == 0
    try:
        yield {} if mounted else {
            "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parent / "small_fs"),
                                                         os.environ.get("PYTHONPATH")])),
            "BRAIN_TEST_SMALL_FS": f"{folder}:{size_mb * 2**20}",
        }
    finally:
        if mounted:
            done = run(["umount", folder], timeout=60)
            assert done.returncode == 0, done.stderr


def test_a_full_checkpoint_volume_fails_the_run_with_storage_full_and_keeps_the_checkpoints(tmp_path):
    job = yaml.safe_load(EXAMPLE.read_text())
    job["spec"]["training"].update(steps=40, logInterval=5)
    job["spec"]["checkpoint"].update(intervalSteps=10)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    claims, workdir = tmp_path / "claims", tmp_path / "run"
    claims.mkdir()
    claim = claims / CLAIM
    with small_volume(claim, VOLUME_MB) as env:
        proc = run([BRAINTRAIN, "run", path, "--workdir", workdir, "--claims", claims], timeout=360,
                   env={**os.environ, **env})
        out = proc.stdout + proc.stderr
        assert proc.returncode == 1, out[-4000:]
        lines = out.splitlines()
        status = next(i for i, line in enumerate(lines) if line.startswith("status:"))
        assert lines[status].startswith("status:      Failed (local-minimal-worker-")
        assert "runPolicy.failurePolicy.storageFull: FailJob" in lines[status]
        assert re.match(r"reason:      storage-full: the checkpoint of step 30 needs [0-9,]+ bytes "
                        r"\([0-9.]+ MB\), [0-9,]+ bytes \([0-9.]+ MB\) free in ", lines[status + 1]), lines[status + 1]
        # Nor did torchrun restart the trainers inside the pods (elastic.maxRestarts is 3): storage-full fails the
        # job anyway (BRAIN_FAIL_FAST), so the trainers stopped their agents.
        assert "resumed from" not in out
        assert f"free in {claim} (checkpoint.keep_last=2" in lines[status + 1]
        assert "restarts:    0" in lines and "restarting all workers" not in out
        # Every committed checkpoint intact, nothing half-written.
        committed = store.list_checkpoints(claim)
        assert [c.step for c in committed] == [20, 10]
        for c in committed:
            assert store.verify_files(c.path, c.manifest["files"], c.manifest["files"]) == []
        assert not list(claim.glob("*" + contract.TMP_SUFFIX))
        # The trainer wrote its reason where the pod's termination message goes.
        said = [contract.parse_termination((workdir / "termination" / f"local-minimal-worker-{i}").read_text())
                for i in range(2)]
        assert said[0][0] == contract.STORAGE_FULL


def test_resuming_with_another_vocabulary_fails_at_once_naming_the_setting(tmp_path):
    """Issue 23: the same job (and so the same claim) run again with model.vocabSize changed fails as
    config-error, naming the setting and the first tensor, without a restart of the runner's or torchrun's."""
    job = yaml.safe_load(EXAMPLE.read_text())
    job["spec"]["training"].update(steps=4, logInterval=2)
    job["spec"]["checkpoint"].update(intervalSteps=0)
    path, claims = tmp_path / "job.yaml", tmp_path / "claims"
    claims.mkdir()
    path.write_text(yaml.safe_dump(job))
    first = run([BRAINTRAIN, "run", path, "--workdir", tmp_path / "first", "--claims", claims], timeout=240)
    assert first.returncode == 0, (first.stdout + first.stderr)[-4000:]
    job["spec"]["model"]["vocabSize"] = 512
    job["spec"]["training"]["steps"] = 8  # else the runner says the job is complete and starts nothing
    path.write_text(yaml.safe_dump(job))
    proc = run([BRAINTRAIN, "run", path, "--workdir", tmp_path / "second", "--claims", claims], timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]
    lines = out.splitlines()
    status = next(i for i, line in enumerate(lines) if line.startswith("status:"))
    assert "runPolicy.failurePolicy.configError: FailJob" in lines[status], lines[status]
    assert lines[status + 1] == ("reason:      config-error: model.vocab_size: 512 here, unset in step-00000004 "
                                 "(encoders.embed.weight [512, 64] here, [256, 64] there)"), lines[status + 1]
    assert "restarts:    0" in lines and "restarting all workers" not in out and "resumed from" not in out
    # Each trainer says it in one line, without a traceback (nor DCP's, once per rank), and so do the torchrun
    # agents that BRAIN_FAIL_FAST stopped with SIGTERM, so that they restart nothing (brain_trainer.agent).
    for pod in range(2):
        assert out.count(f"[local-minimal-worker-{pod}] error: model.vocab_size: 512 here") == 1, out[-4000:]
    assert "Traceback" not in out and "SignalException" not in out, out[-4000:]
    assert "Size mismatch" not in out and "CheckpointException" not in out
    assert [c.step for c in store.list_checkpoints(claims / CLAIM)] == [4], "the checkpoint stays as it was"
