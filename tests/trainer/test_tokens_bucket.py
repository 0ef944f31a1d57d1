"""A prepared token dataset in a bucket (issue 37, point 2): `braintrain prepare --out s3://...` and
`data.path: s3://...`, against a real S3 server (moto's, tests/object_store.py).

The bucket's dataset is the folder's, file for file; training on it gives the folder's losses step by step, on
one rank and on two, and a resume from the bucket continues as if uninterrupted; a missing, truncated or rewritten
shard is named by its URI before training; another scheme is refused, naming the setting and the scheme.
"""

from __future__ import annotations

import pytest
from harness import run_ranks
from small_runs import small_run
from tokens_corpus import PROG, prepare, stdlib_globs

from brain_trainer.config import TrainerConfig
from brain_trainer.data.errors import DataError
from brain_trainer.data.tokens.dataset import TokenDataset
from brain_trainer.data.tokens.format import MANIFEST, read_manifest
from brain_trainer.data.tokens.prepare import main as prepare_main
from brain_trainer.data.tokens.source import open_split, token_split
from brain_trainer.data.tokens.streamed import BucketTokenDataset
from brain_trainer.loop.train import train
from brain_trainer.schema import ConfigError

SHARD_TOKENS = 4096  # 5 train shards and 7 validation shards: windows cross shard boundaries
SEQ_LEN = 16


pytestmark = pytest.mark.usefixtures("s3env")  # tests/conftest.py: the server in this process's environment


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("tokens") / "json"
    argv = [*stdlib_globs("json"), "--out", str(out), "--val-fraction", "0.2", "--shard-tokens", str(SHARD_TOKENS)]
    assert prepare_main(argv) == 0
    return out


@pytest.fixture(scope="module")
def bucket(s3env, folder):
    """The same corpus prepared into a bucket (by `braintrain prepare`'s code, in this process)."""
    uri = f"{s3env.bucket()}/datasets/json"
    argv = [*stdlib_globs("json"), "--out", uri, "--val-fraction", "0.2", "--shard-tokens", str(SHARD_TOKENS)]
    assert prepare_main(argv) == 0
    return uri


def objects(s3, uri) -> dict[str, bytes]:
    name, _, prefix = uri[len("s3://"):].partition("/")
    client = s3.client()
    listed = client.list_objects_v2(Bucket=name, Prefix=f"{prefix}/")
    return {o["Key"][len(prefix) + 1:]: client.get_object(Bucket=name, Key=o["Key"])["Body"].read()
            for o in listed.get("Contents", [])}


def copy(s3, uri) -> str:
    """The bucket's dataset copied under a new prefix, to damage."""
    name, _, prefix = uri[len("s3://"):].partition("/")
    client = s3.client()
    for key in objects(s3, uri):
        client.copy_object(Bucket=name, Key=f"copy/{key}", CopySource={"Bucket": name, "Key": f"{prefix}/{key}"})
    return f"s3://{name}/copy"


def test_prepare_to_a_bucket_stores_the_folders_files_and_reads_its_windows(s3, folder, bucket):
    stored = objects(s3, bucket)
    assert stored == {p.name: p.read_bytes() for p in folder.iterdir()}, "the same files, manifest included"
    assert len(read_manifest(folder).train.shards) == 5
    on_disk, streamed = TokenDataset(folder, SEQ_LEN), BucketTokenDataset(bucket, SEQ_LEN)
    assert len(streamed) == len(on_disk) and streamed.vocab_size == on_disk.vocab_size == 257
    # the windows on either side of each shard boundary (the one across it read in two ranges), first and last
    boundaries = [(s * SHARD_TOKENS) // (SEQ_LEN + 1) for s in range(1, len(read_manifest(folder).train.shards))]
    some = sorted({0, len(on_disk) - 1, *boundaries, *(w + 1 for w in boundaries)})
    for (x, y), k in zip(streamed.__getitems__(some), some, strict=True):
        want_x, want_y = on_disk[k]
        assert x.equal(want_x) and y.equal(want_y), f"window {k}"


def test_prepare_to_a_bucket_refuses_to_overwrite_and_force_replaces_a_dataset(s3, capsys):
    uri = f"{s3.bucket()}/data"
    corpus = stdlib_globs("json")
    rc, out, _ = prepare(capsys, *corpus, "--out", uri, "--val-fraction", "0", "--shard-tokens", 8192)
    assert rc == 0 and out.startswith(f"{uri}: train 5 documents, 48342 tokens in 6 shards;")
    assert "train-00005.bin" in objects(s3, uri)
    rc, _, errors = prepare(capsys, *corpus, "--out", uri, "--val-fraction", "0")
    assert rc == 1 and errors == [f"{PROG}: {uri}: already exists; --force replaces a dataset prepared before"]
    assert prepare(capsys, *corpus, "--out", uri, "--val-fraction", "0", "--shard-tokens", 16384, "--force")[0] == 0
    shards = {s.name for s in BucketTokenDataset(uri, SEQ_LEN).manifest.train.shards}
    assert set(objects(s3, uri)) == shards | {MANIFEST}, "the replaced dataset's extra shards are gone"
    foreign = f"{s3.bucket()}/notes"
    s3.client().put_object(Bucket=foreign[5:].split("/")[0], Key="notes/readme.txt", Body=b"mine")
    rc, _, errors = prepare(capsys, *corpus, "--out", foreign, "--force")
    assert rc == 1 and errors == [f"{PROG}: {foreign}: exists and is not a token dataset; not replacing it"]


def tokens_run(root, steps, path, data=(), **sections):
    """small_run's loop on the dataset at `path`, with a model small enough to train in a blink (user_models.py)."""
    return small_run(root, steps, model={"entrypoint": "user_models:byte_lm"},
                     data={"source": "tokens", "path": str(path), **dict(data)}, **sections)


def test_training_on_the_bucket_gives_the_folders_losses_and_resumes_exactly(tmp_path, folder, bucket):
    """Training and held-out losses step by step; the evaluation reads the validation split's first 2 x 2 windows."""
    sections = {"training": {"eval_interval": 3, "eval_steps": 2}, "checkpoint": {"interval_steps": 2}}
    disk = train(tokens_run(tmp_path / "disk", 6, folder, **sections))
    streamed = train(tokens_run(tmp_path / "bucket", 6, bucket, **sections))
    assert [step for step, _ in streamed.history] == list(range(1, 7))
    assert [step for step, _ in streamed.eval_history] == [3, 6]
    assert (streamed.history, streamed.eval_history) == (disk.history, disk.eval_history), "bit for bit"
    resumed = train(tokens_run(tmp_path / "bucket", 6, bucket, data={"num_workers": 1},
                               training=sections["training"], checkpoint={"resume_from": 4}))
    assert resumed.history == disk.history[4:], "resumed at step 4's sample index, in a forked DataLoader worker"
    assert resumed.eval_history == disk.eval_history[1:]


def _train_each(rank, world_size, cfgs):
    return [train(cfg).history for cfg in cfgs]


def test_two_ranks_train_on_the_bucket_as_on_the_folder(tmp_path, folder, bucket):
    cfgs = [tokens_run(tmp_path / name, 4, path, strategy="ddp", checkpoint={"enabled": False})
            for name, path in (("disk", folder), ("bucket", bucket))]
    ranks = run_ranks(_train_each, 2, cfgs, timeout=300)
    on_disk, streamed = ranks[0]
    assert len(streamed) == 4 and streamed == on_disk and ranks[1] == ranks[0]


def test_a_missing_truncated_or_rewritten_shard_is_named_by_its_uri(s3, tmp_path, bucket):
    damaged = copy(s3, bucket)
    name = damaged[len("s3://"):].split("/")[0]
    client = s3.client()
    original = client.get_object(Bucket=name, Key="copy/train-00001.bin")["Body"].read()
    client.delete_object(Bucket=name, Key="copy/train-00001.bin")
    with pytest.raises(DataError) as exc:
        train(tokens_run(tmp_path, 2, damaged))
    assert str(exc.value) == f"data.path: {damaged}/train-00001.bin: missing"

    client.put_object(Bucket=name, Key="copy/train-00001.bin", Body=original[:-2])
    with pytest.raises(DataError) as exc:
        open_split(damaged, SEQ_LEN, "train")
    size = len(original)
    assert str(exc.value) == f"data.path: {damaged}/train-00001.bin: {size - 2} bytes, manifest says {size} (truncated)"

    client.put_object(Bucket=name, Key="copy/train-00001.bin", Body=bytes(reversed(original)))
    with pytest.raises(DataError, match=rf"^{damaged}/train-00001.bin: checksum [0-9a-f]{{8}}, manifest says "
                                        r"[0-9a-f]{8} \(corrupted\)$"):
        token_split(damaged, SEQ_LEN, "train")

    client.delete_object(Bucket=name, Key=f"copy/{MANIFEST}")
    with pytest.raises(DataError, match=rf"^{damaged}: not a token dataset \(no {MANIFEST};"):
        token_split(damaged, SEQ_LEN, "train")


GS = "scheme 'gs' is not supported: only s3:// (Amazon S3 and S3-compatible stores: MinIO, Ceph, R2), got 'gs://bucket/data'"


def test_other_schemes_are_refused_naming_the_setting_and_the_scheme(capsys):
    with pytest.raises(ConfigError) as exc:
        TrainerConfig.from_dict({"data": {"source": "tokens", "path": "gs://bucket/data"}})
    assert [str(e) for e in exc.value.errors] == [
        f"data.path: {GS}"]
    with pytest.raises(ConfigError, match=r"^data.path: source 'files' reads local files only, got 's3://bucket/\*.txt'$"):
        TrainerConfig.from_dict({"data": {"source": "files", "path": "s3://bucket/*.txt"}})
    with pytest.raises(DataError, match=r"^scheme 'hdfs' is not supported: .* got 'hdfs://name/data'$"):
        token_split("hdfs://name/data", SEQ_LEN, "train")
    rc, _, errors = prepare(capsys, "a.txt", "--out", "gs://bucket/data")
    assert rc == 2 and errors == [
        f"{PROG}: --out: {GS}"]

