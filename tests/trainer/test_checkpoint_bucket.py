"""Checkpoints on object storage (checkpoint.dir: s3://bucket/prefix) against a real S3 server (moto's, the `s3`
fixture): the guarantees of a volume, the manifest as the commit (docs/checkpoints.md, "On object storage").

- a 2-rank torchrun job on a bucket, SIGKILLed while an asynchronous save of step 4 is written but not
  committed, resumes from step 2 (the manifest-less step 4 ignored, then removed) and ends bitwise where an
  uninterrupted run on a volume ends (the same job on 2 forked ranks); keep_last then holds the two newest
  steps, whole;
- two jobs on one prefix: the second is refused naming the first; a newer group fences the older one, whose
  commit writes no manifest; a renewal whose lease object changed under it (If-Match) is fenced too;
- a hostile .metadata (its checksum fixed up) is refused without unpickling, on both ranks, and moved aside;
- retention deletes the oldest steps first, each manifest first; an uncommitted step is never counted;
- a gs:// checkpoint.dir, a missing bucket, denied access and an unreachable endpoint are refused, named.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from botocore.exceptions import ClientError
from harness import run_ranks
from processes import start, torchrun
from test_checkpoint_resume import NO_SHARED_STORE, write_config
from test_checkpoint_safety import Payload, _state

from brain_trainer.checkpoint import CheckpointManager, bucket, location, shards, store
from brain_trainer.checkpoint.bucket_lease import BucketLease
from brain_trainer.config import CheckpointConfig, load_config
from brain_trainer.loop.train import train
from brain_trainer.model.export import export
from brain_trainer.contract import CONFIG_ERROR_REASON, FENCED, step_dir_name
from brain_trainer.resilience.failures import Fatal
from brain_trainer.s3 import client as s3_client
from brain_trainer.schema import ConfigError

HERE = Path(__file__).parent


def _manager(root: str, rank: int = 0, world_size: int = 1, keep_last: int = 5) -> CheckpointManager:
    return CheckpointManager(CheckpointConfig(dir=root, interval_steps=0, keep_last=keep_last, async_save=False),
                             rank=rank, world_size=world_size, config_hash="h")


def _save(root: str, step: int, rank: int = 0, world_size: int = 1) -> None:
    state = _state()
    state.step = state.sample_index = step
    _manager(root, rank, world_size).finish(state)


def _names(root: str) -> list[str]:
    return bucket.children(location.root_of(root))


# -- a killed job resumes exactly --


def _model(folder) -> dict[str, torch.Tensor]:
    return shards.load_prefix(folder, "model")


STEPS, EVERY = 6, 2  # checkpoints at steps 2, 4 (held, then killed) and 6: the fewest that show a resume


def _job(tmp: Path, name: str, checkpoint_dir: str | None = None) -> Path:
    """test_checkpoint_resume's 2-rank DDP job, STEPS steps, a checkpoint every EVERY, keep_last 2."""
    path = write_config(tmp, name, STEPS, "ddp")
    config = yaml.safe_load(path.read_text())
    config["checkpoint"] |= {"interval_steps": EVERY, **({"dir": checkpoint_dir} if checkpoint_dir else {})}
    path.write_text(yaml.safe_dump(config))
    return path


def uninterrupted(rank: int, world_size: int, config: str) -> int:
    """The reference job on forked ranks: the same config, world size and one thread as under torchrun (its
    numerics: the test's bitwise comparison holds them to that), without a torchrun launch's seconds."""
    return train(load_config(Path(config))).step


def test_sigkill_during_an_async_save_on_a_bucket_resumes_bitwise_from_the_last_commit(s3env, tmp_path):
    assert run_ranks(uninterrupted, 2, str(_job(tmp_path, "reference"))) == [STEPS, STEPS]

    uri = s3env.bucket() + "/runs/a"
    root = location.root_of(uri)
    held, last = 2 * EVERY, EVERY
    command = torchrun("--max-restarts", "1", HERE / "hold_commit.py", "--config", _job(tmp_path, "killed", uri))
    with start(command, timeout=240, cwd=HERE,
               env={**os.environ, "OMP_NUM_THREADS": "1", "HOLD_COMMIT_STEP": str(held), **NO_SHARED_STORE}) as job:
        for line in job.lines():
            if line.startswith(f"holding commit of step {held} in pid "):
                names = bucket.objects(root / step_dir_name(held))
                assert shards.METADATA_FILE in names and store.MANIFEST not in names, names
                assert bucket.latest_checkpoint(root) == root / step_dir_name(last)  # the held step is not committed
                os.kill(int(line.split()[-1]), signal.SIGKILL)
        code = job.wait()
    text = job.output
    (tmp_path / "killed.out").write_text(text)
    assert code == 0, text[-4000:]
    assert f"removing uncommitted checkpoint {root / step_dir_name(held)}" in text
    assert f"resumed from {root / step_dir_name(last)}: step {last}" in text and "torchrun restart count 1" in text

    ref, got = _model(tmp_path / "reference" / step_dir_name(STEPS)), _model(root / step_dir_name(STEPS))
    assert ref.keys() == got.keys() and all(torch.equal(ref[k], got[k]) for k in ref)
    # keep_last: 2 — the two newest steps, whole; the lease and resume_from's record beside them.
    assert [n for n in _names(uri) if n.startswith("step-")] == [step_dir_name(held), step_dir_name(STEPS)]
    assert bucket.objects(root / step_dir_name(last)) == {}
    assert not list(bucket._uploads(root))
    # braintrain export reads the bucket's newest committed step.
    assert export(uri, tmp_path / "export") == (root / step_dir_name(STEPS), 1)
    export(tmp_path / "reference", tmp_path / "reference-export")
    ours, theirs = (load_file(tmp_path / name / "model.safetensors") for name in ("export", "reference-export"))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


# -- one writer per prefix --


def test_a_second_job_is_refused_naming_the_first_and_a_fenced_group_cannot_commit(s3env):
    uri = s3env.bucket() + "/shared"
    root = location.root_of(uri)
    first = BucketLease(root, 60.0, rank=0, env={"BRAIN_LEASE_HOLDER": "job a (uid 1)"})
    first.acquire(lambda value: value)
    other = BucketLease(root, 60.0, rank=0, env={"BRAIN_LEASE_HOLDER": "job b (uid 2)"})
    with pytest.raises(Fatal) as refused:
        other.acquire(lambda value: value)
    assert refused.value.reason == CONFIG_ERROR_REASON
    assert f"checkpoint folder {uri} is in use by job a (uid 1)" in str(refused.value)

    # A newer worker group of the same job takes generation 2: the first group is fenced at its commit.
    newer = BucketLease(root, 60.0, rank=0, env={"BRAIN_LEASE_HOLDER": "job a (uid 1)"})
    newer.acquire(lambda value: value)
    folder = root / step_dir_name(3)
    bucket.write_text(folder / shards.METADATA_FILE, "written")
    with pytest.raises(Fatal) as fenced:
        bucket.commit(folder, folder, {"step": 3}, first.check)
    assert fenced.value.reason == FENCED and "generation 2" in str(fenced.value)
    assert store.MANIFEST not in bucket.objects(folder)
    bucket.commit(folder, folder, {"step": 3}, newer.check)
    assert bucket.read_manifest(folder)["step"] == 3

    # If-Match: a renewal finds its lease object rewritten by someone else, and stops.
    bucket.write_text(root / "lease-00000002.json", json.dumps({"holder": "someone"}))
    assert not newer._rewrite(lambda record, now: record)
    assert newer.fenced is not None
    for lease in (first, other, newer):
        lease.stop()


# -- hostile content --


def hostile_metadata(rank: int, world_size: int, uri: str, marker: str) -> tuple[int | None, bool]:
    _save(uri, 2, rank, world_size)
    _save(uri, 4, rank, world_size)
    if rank == 0:
        folder = location.root_of(uri) / step_dir_name(4)
        s3_client().put_object(Bucket=folder.bucket, Key=(folder / shards.METADATA_FILE).key,
                               Body=pickle.dumps(Payload(Path(marker))))
        manifest = bucket.read_manifest(folder)
        manifest["files"][shards.METADATA_FILE] = bucket.object_digest(folder / shards.METADATA_FILE)
        bucket.write_text(folder / store.MANIFEST, json.dumps(manifest))
    torch.distributed.barrier()
    step = _manager(uri, rank, world_size).restore(_state())
    return step, Path(marker).exists()


def test_a_hostile_metadata_on_a_bucket_is_refused_on_every_rank_and_moved_aside(s3env, tmp_path):
    uri = s3env.bucket() + "/hostile"
    marker = tmp_path / "ran"
    assert run_ranks(hostile_metadata, 2, uri, str(marker)) == [(2, False), (2, False)]
    assert not marker.exists()
    names = _names(uri)
    assert step_dir_name(4) not in names and step_dir_name(4) + store.CORRUPT_SUFFIX in names
    moved = location.root_of(uri) / (step_dir_name(4) + store.CORRUPT_SUFFIX)
    assert {shards.METADATA_FILE, store.MANIFEST} <= set(bucket.objects(moved))


# -- retention and uncommitted steps --


def test_retention_deletes_the_oldest_whole_steps_manifest_first_and_never_counts_an_uncommitted_one(
        s3env, monkeypatch):
    uri = s3env.bucket() + "/keep"
    root = location.root_of(uri)
    for step in (1, 2, 3):
        folder = root / step_dir_name(step)
        bucket.write_text(folder / "__0_0.distcp", f"shard {step}")
        bucket.commit(folder, folder, {"step": step})
    bucket.write_text(root / step_dir_name(4) / "__0_0.distcp", "no manifest")  # a save that never committed
    deleted: list[list[str]] = []
    delete_keys = bucket.delete_keys
    monkeypatch.setattr(bucket, "delete_keys", lambda name, keys: (deleted.append(keys), delete_keys(name, keys)))

    assert bucket.apply_retention(root, 1) == [root / step_dir_name(2), root / step_dir_name(1)]
    prefix = root.key + "/"
    assert deleted == [[f"{prefix}step-00000001/manifest.json"], [f"{prefix}step-00000001/__0_0.distcp"],
                       [f"{prefix}step-00000002/manifest.json"], [f"{prefix}step-00000002/__0_0.distcp"]]
    assert _names(uri) == [step_dir_name(3), step_dir_name(4)]
    assert bucket.latest_checkpoint(root) == root / step_dir_name(3)
    bucket.remove_stale(root)
    assert _names(uri) == [step_dir_name(3)]


# -- named refusals --


def test_a_bad_scheme_is_refused_naming_checkpoint_dir_and_the_scheme(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"checkpoint": {"dir": "gs://bucket/prefix"}}))
    with pytest.raises(ConfigError, match=r"checkpoint\.dir: scheme 'gs' is not supported: only s3://"):
        load_config(path)
    with pytest.raises(ConfigError, match=r"checkpoint\.dir: '' is not a bucket name"):
        location.root_of("s3:///prefix")


def test_a_missing_bucket_denied_access_and_an_unreachable_endpoint_are_named(s3env, monkeypatch):
    root = location.root_of("s3://no-such-bucket/prefix")
    assert bucket.probe(root) == "checkpoint.dir s3://no-such-bucket/prefix: bucket no-such-bucket does not exist"
    denied = ClientError({"Error": {"Code": "AccessDenied", "Message": "Access Denied"}}, "PutObject")
    assert bucket.explain(denied, root).startswith("access denied (AccessDenied)")

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # discard: nothing listens
    with pytest.raises(Fatal) as refused:
        _manager("s3://any/prefix").restore(_state())
    assert refused.value.reason == CONFIG_ERROR_REASON
    assert "checkpoint.dir s3://any/prefix: endpoint http://127.0.0.1:9 unreachable" in str(refused.value)
