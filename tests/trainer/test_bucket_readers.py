"""What reads checkpoints on a bucket besides the trainer (issue 37): `braintrain checkpoints LOCATION`,
`model.init_from: s3://...` and `braintrain generate` / `eval`'s loading, against a real S3 server (moto's).

- `braintrain checkpoints` lists a bucket's and a folder's committed steps, newest first, the latest marked; a
  step without manifest, a quarantined and a set-aside one are named below, not listed; a bad scheme, a missing
  bucket and an unreachable endpoint are one line each;
- a job started from a bucket's step (or its checkpoint.dir prefix) has the first loss of one started from the same
  step copied to a volume, and records the step's URI as its origin; generate gives the same text from both;
- a bad init_from scheme is refused by the config, a missing bucket named by model.init_from.
"""

from __future__ import annotations

import pytest
import torch
from small_runs import small_run
from test_checkpoint_bucket import _save

from brain_operator.cli import main as braintrain
from brain_trainer.checkpoint import bucket, location, store
from brain_trainer.checkpoint.listing import layout
from brain_trainer.config import TrainerConfig
from brain_trainer.contract import step_dir_name
from brain_trainer.inference.evaluate import EvalLayout, eval_config
from brain_trainer.inference.loading import origin
from brain_trainer.loop.train import train
from brain_trainer.model.brain_ai import build_model
from brain_trainer.model.init_from import open_source
from brain_trainer.schema import ConfigError

STEPS = 2


pytestmark = pytest.mark.usefixtures("s3env")  # tests/conftest.py: the server in this process's environment


def cli(capsys, *argv) -> tuple[int, list[str], str]:
    code = braintrain([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def meta_minimal():
    with torch.device("meta"):
        return build_model(TrainerConfig.from_dict({"model": {"preset": "minimal"}}).model)


def put(s3, uri: str, key: str, body: bytes = b"x") -> None:
    name, _, prefix = uri[len("s3://"):].partition("/")
    s3.client().put_object(Bucket=name, Key=f"{prefix}/{key}", Body=body)


@pytest.fixture(scope="module")
def trained(s3env, tmp_path_factory) -> tuple[str, str]:
    """(a 2-step job's checkpoint.dir on a bucket, its step 2 copied object for object to a folder)."""
    root = f"{s3env.bucket()}/job"
    train(small_run(root, STEPS))
    name, _, prefix = root[len("s3://"):].partition("/")
    step = step_dir_name(STEPS)
    folder = tmp_path_factory.mktemp("copy") / step
    folder.mkdir()
    client = s3env.client()
    for item in client.list_objects_v2(Bucket=name, Prefix=f"{prefix}/{step}/")["Contents"]:
        client.download_file(name, item["Key"], str(folder / item["Key"].rsplit("/", 1)[1]))
    return root, str(folder)


# -- braintrain checkpoints --


def test_checkpoints_lists_committed_steps_and_names_the_others(s3, tmp_path, capsys):
    uri = f"{s3.bucket()}/ckpt"
    for step in (2, 4):
        _save(uri, step)
    put(s3, uri, "step-00000006/__0_0.distcp")  # a save that never committed
    put(s3, uri, "step-00000001.corrupt/manifest.json", b"{}")
    put(s3, uri, "set-aside-20260101T000000Z-resume-from-none/step-00000009/manifest.json", b"{}")
    code, lines, err = cli(capsys, "checkpoints", uri)
    assert (code, err) == (0, "")
    assert lines[0] == f"{uri}: 2 committed checkpoints, newest first"
    assert lines[1].split() == ["STEP", "COMMITTED", "SIZE", "WORLD", "LAYOUT"]
    assert [line.split()[0] for line in lines[2:4]] == ["4", "2"]
    manifest = bucket.read_manifest(location.root_of(uri) / step_dir_name(4))
    assert lines[2].split()[1:] == [manifest["time"], *lines[2].split()[2:4], "1", "-", "latest"]
    assert "latest" not in lines[3]
    assert lines[4:] == ["not committed (never loaded): step-00000006 (no manifest.json (not committed))",
                         "quarantined (refused or damaged at load): step-00000001.corrupt",
                         "set aside (by checkpoint.resumeFrom): set-aside-20260101T000000Z-resume-from-none"]

    folder = tmp_path / "ckpt"
    _save(str(folder), 3)
    (folder / "step-00000005.tmp").mkdir()
    code, lines, _ = cli(capsys, "checkpoints", folder)
    assert code == 0 and lines[0] == f"{folder}: 1 committed checkpoint" and lines[2].split()[0] == "3"
    assert lines[-1] == "not committed (never loaded): step-00000005.tmp (being written, or interrupted)"
    assert layout({"settings": {"distributed.strategy": "fsdp", "distributed.tensor_parallel": 2,
                                "distributed.pipeline_parallel": 1}}) == "fsdp tp2"


def test_checkpoints_names_a_bad_uri_a_missing_bucket_and_an_unreachable_store(tmp_path, capsys, monkeypatch):
    code, _, err = cli(capsys, "checkpoints", "gs://bucket/prefix")
    assert code == 1 and err.startswith("braintrain: LOCATION: scheme 'gs' is not supported: only s3://")
    code, _, err = cli(capsys, "checkpoints", "s3://no-such-bucket/prefix")
    assert (code, err) == (1, "braintrain: s3://no-such-bucket/prefix: bucket no-such-bucket does not exist\n")
    code, _, err = cli(capsys, "checkpoints", tmp_path / "nothing")
    assert (code, err) == (1, f"braintrain: {tmp_path / 'nothing'}: no such folder\n")

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # discard: nothing listens
    try:
        code, _, err = cli(capsys, "checkpoints", "s3://any/prefix")
    finally:
        monkeypatch.undo()
    assert code == 1 and err.startswith("braintrain: s3://any/prefix: endpoint http://127.0.0.1:9 unreachable")


# -- model.init_from, generate and eval from a bucket --


def test_init_from_a_bucket_step_starts_as_from_the_same_step_on_a_volume(trained, tmp_path):
    root, copy = trained
    step = f"{root}/{step_dir_name(STEPS)}"
    minimal = {"preset": "minimal"}
    from_bucket = train(small_run(tmp_path / "a", 1, model={**minimal, "init_from": step}))
    from_volume = train(small_run(tmp_path / "b", 1, model={**minimal, "init_from": copy}))
    fresh = train(small_run(tmp_path / "c", 1))
    assert from_bucket.history == from_volume.history != fresh.history
    assert store.read_manifest(tmp_path / "a" / step_dir_name(1))["init_from"]["path"] == step

    # A checkpoint.dir prefix means its newest committed step, as for a folder.
    assert str(open_source(root, meta_minimal()).folder) == step


def test_generate_and_eval_read_a_bucket_checkpoint_as_its_copy(trained, capsys):
    root, copy = trained
    found = origin(root)
    assert str(found.path) == f"{root}/{step_dir_name(STEPS)}" and found.manifest["step"] == STEPS
    config = eval_config(found.path, found.manifest, "/data", None, None, EvalLayout())
    assert config.model.init_from == str(found.path)  # eval loads it as model.init_from does

    prompt = ["--prompt", "import json", "--greedy", "--max-new-tokens", "12", "--device", "cpu"]
    code, ours, err = cli(capsys, "generate", root, *prompt)
    assert code == 0, err
    assert cli(capsys, "generate", copy, *prompt)[1] == ours and len(ours[0]) > len("import json")


def test_a_bad_init_from_scheme_and_a_missing_bucket_are_named(tmp_path):
    with pytest.raises(ConfigError, match=r"model\.init_from: scheme 'gs' is not supported: only s3://"):
        TrainerConfig.from_dict({"model": {"init_from": "gs://bucket/step-00000002"}})
    with pytest.raises(ConfigError, match=r"^model\.init_from: s3://no-such-bucket/x: bucket no-such-bucket does "
                                          r"not exist$"):
        open_source("s3://no-such-bucket/x", meta_minimal())
