"""Experiment trackers (issue 36, point 1) against real local backends.

MLflow: a tracking server started as a process on loopback with a SQLite store; the test reads the run back
through MLflow's REST API. Weights & Biases: offline mode; the test reads the run's records back from the file
wandb wrote. `train` (strategy single, one process) logs to them as rank 0 does in every job.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from brain_trainer.config import TrackerConfig, TrainerConfig
from brain_trainer.contract import LEASE_HOLDER_ENV, job_name
from brain_trainer.loop.train import train
from brain_trainer.observe.trackers import RUNS_FILE, Identity, Trackers, flat_params, tracker_key
from brain_trainer.schema import ConfigError
from small_runs import small_run

SERVER_START_S = 120  # the server migrates its SQLite store on its first start


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """`mlflow server` on loopback with a SQLite store; its URL once /health answers."""
    root = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{root / 'store.db'}", "--default-artifact-root", str(root / "artifacts")],
        stdout=subprocess.DEVNULL, stderr=open(root / "server.log", "wb"),
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},  # its job runner needs packages not here
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + SERVER_START_S
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as answer:
                if answer.status == 200:
                    break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"mlflow server did not start: {(root / 'server.log').read_text()[-2000:]}")
            time.sleep(0.2)  # polling the server's readiness, not waiting for an outcome
    yield url
    proc.terminate()
    proc.wait(timeout=30)


def rest(url: str, path: str, **query: Any) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/api/2.0/mlflow/{path}?{urllib.parse.urlencode(query)}", timeout=10) as r:
        return json.loads(r.read())


def history(url: str, run_id: str, key: str) -> list[tuple[int, float]]:
    metrics = rest(url, "metrics/get-history", run_id=run_id, metric_key=key).get("metrics", [])
    return sorted((m["step"], m["value"]) for m in metrics)


def job(root: Path, steps: int, trackers: list[dict[str, Any]]) -> TrainerConfig:
    return small_run(root, steps, metrics={"trackers": trackers})


def test_training_logs_to_mlflow_and_a_resumed_job_continues_the_same_run(tmp_path, mlflow_server, monkeypatch):
    monkeypatch.setenv(LEASE_HOLDER_ENV, "job llama (uid 1234)")  # RUN_ID_ENV (the uid) would mean torchrun
    tracker = {"type": "mlflow", "tracking_uri": mlflow_server, "experiment": "issue-36", "tags": {"team": "lm"}}
    train(job(tmp_path, 2, [tracker]))
    (run_id,) = json.loads((tmp_path / RUNS_FILE).read_text()).values()
    run = rest(mlflow_server, "runs/get", run_id=run_id)["run"]
    tags = {t["key"]: t["value"] for t in run["data"]["tags"]}
    assert {k: tags[k] for k in ("brain.job", "brain.uid", "brain.restarts", "team")} == {
        "brain.job": "llama", "brain.uid": "", "brain.restarts": "0", "team": "lm"}
    assert tags["mlflow.runName"] == "llama"
    params = {p["key"]: p["value"] for p in run["data"]["params"]}
    assert params["training.steps"] == "2" and params["model.preset"] == "minimal"
    assert run["info"]["status"] == "FINISHED"

    train(job(tmp_path, 4, [tracker]))  # resumes from step 2's checkpoint: the same tracker run goes on
    assert json.loads((tmp_path / RUNS_FILE).read_text()) == {tracker_key(TrackerConfig(**tracker)): run_id}
    assert [s for s, _ in history(mlflow_server, run_id, "train/loss")] == [1, 2, 3, 4]
    for key in ("train/learning_rate", "train/tokens_per_second", "train/grad_norm", "goodput/ratio"):
        assert [s for s, _ in history(mlflow_server, run_id, key)] == [1, 2, 3, 4], key
    tags = {t["key"]: t["value"] for t in rest(mlflow_server, "runs/get", run_id=run_id)["run"]["data"]["tags"]}
    assert tags["brain.restarts"] == "1", "the resumed start counts as a restart of the run"
    experiments = rest(mlflow_server, "experiments/search", max_results=10)["experiments"]
    assert [e["name"] for e in experiments if e["experiment_id"] == run["info"]["experiment_id"]] == ["issue-36"]


def test_an_unreachable_tracker_warns_once_and_training_goes_on(tmp_path, caplog):
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with caplog.at_level(logging.WARNING, logger="brain_trainer"):
        result = train(job(tmp_path, 2, [{"type": "mlflow", "tracking_uri": dead}]))
    assert result.step == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "tracker" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("tracker mlflow failed, no more metrics go to it: ")
    assert not (tmp_path / RUNS_FILE).exists(), "no run was opened, so none is continued"


WANDB_HEADER = b":W&B\xe1\xbe\x00"  # a .wandb file's first bytes: its name, magic 0xBEE1 and version 0
BLOCK = 32768  # the file is LevelDB's log format: 32 KiB blocks of records, each with a 7-byte header
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def leveldb_log(data: bytes) -> list[bytes]:
    """The records of a LevelDB-format log after its header (a record split across blocks is joined again)."""
    records, pending, at = [], b"", len(WANDB_HEADER)
    while at + 7 <= len(data):
        if BLOCK - at % BLOCK < 7:  # a block's tail too short for a header is padding
            at += BLOCK - at % BLOCK
            continue
        length, kind = int.from_bytes(data[at + 4:at + 6], "little"), data[at + 6]
        chunk, at = data[at + 7:at + 7 + length], at + 7 + length
        if kind == 0 and length == 0:
            break  # the zeros after the last record
        pending += chunk
        if kind in (FULL, LAST):
            records.append(pending)
            pending = b""
    return records


def wandb_records(folder: Path) -> list[Any]:
    """Every record of the offline runs below `folder`, in the order wandb wrote them."""
    from wandb.proto import wandb_internal_pb2

    records = []
    for path in sorted(folder.glob("wandb/offline-run-*/run-*.wandb")):
        data = path.read_bytes()
        assert data.startswith(WANDB_HEADER)
        for raw in leveldb_log(data):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(raw)
            records.append(record)
    return records


def test_wandb_offline_writes_the_scalars_config_and_tags_and_a_restart_keeps_the_run_id(tmp_path):
    import wandb

    config = TrackerConfig(type="wandb", project="brain", offline=True)
    identity = Identity("llama", "1234", 0)
    for restarts, steps in ((0, (1, 2)), (1, (3,))):
        trackers = Trackers([config], tmp_path, flat_params({"training": {"steps": 3}}), Identity("llama", "1234",
                                                                                                   restarts))
        for step in steps:
            trackers.write(step, loss=5.0 - step, learning_rate=1e-3, mfu=None)
        trackers.write(steps[-1], eval_loss=1.0, eval_perplexity=2.7)
        trackers.close()
    wandb.teardown()  # as the trainer's exit does: wandb's service writes out what it still holds
    (run_id,) = json.loads((tmp_path / RUNS_FILE).read_text()).values()
    records = wandb_records(tmp_path)
    runs = {r.run.run_id for r in records if r.WhichOneof("record_type") == "run"}
    assert runs == {run_id}, "the restart wrote to the same run"
    history = [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]
    assert [(h["trainer/step"], h.get("train/loss"), h.get("eval/perplexity")) for h in history] == [
        (1, 4.0, None), (2, 3.0, None), (2, None, 2.7), (3, 2.0, None), (3, None, 2.7)]
    assert all("train/mfu" not in h for h in history), "a missing scalar is left out"
    run_records = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert set(run_records[0].tags) >= {f"{k}:{v}" for k, v in identity.tags().items() if k != "brain.restarts"}
    configs = [json.loads(i.value_json) for r in records if r.WhichOneof("record_type") == "config"
               for i in r.config.update if i.key == "training.steps"]
    assert configs and configs[-1] == "3"


def test_a_tracker_setting_of_the_other_type_is_refused_naming_the_field():
    with pytest.raises(ConfigError) as caught:
        TrainerConfig.from_dict({"metrics": {"trackers": [{"type": "mlflow", "project": "x"}]}})
    assert "metrics.trackers[0].project: is a wandb setting; this tracker is mlflow, got 'x'" in str(caught.value)


def test_the_job_name_comes_from_the_lease_holder():
    assert job_name({LEASE_HOLDER_ENV: "job llama (uid 1234)"}) == "llama"
    assert job_name({LEASE_HOLDER_ENV: "job local"}) == "local"
    assert job_name({}) == ""


def test_a_manifests_trackers_reach_trainer_yaml_and_a_wrong_one_is_named_as_written():
    from brain_operator.spec.derive import trainer_config
    from brain_operator.spec.parse import parse_job

    def manifest(tracker: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": "brain.ai/v1alpha1", "kind": "BrainTrainingJob", "metadata": {"name": "llama"},
                "spec": {"image": "trainer:1", "metrics": {"trackers": [tracker]}}}

    job = parse_job(manifest({"type": "wandb", "project": "lm", "offline": True, "runName": "first"}))
    rendered = TrainerConfig.from_dict(trainer_config(job).to_dict())
    assert rendered.metrics.trackers == [TrackerConfig(type="wandb", project="lm", offline=True, run_name="first")]
    with pytest.raises(ConfigError) as caught:
        parse_job(manifest({"type": "wandb", "trackingUri": "http://mlflow:5000"}))
    assert "spec.metrics.trackers[0].trackingUri: is a mlflow setting; this tracker is wandb" in str(caught.value)
