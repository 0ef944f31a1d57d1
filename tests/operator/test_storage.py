"""Storage admission (storage.py): a checkpoint's size from the memory planner, and (keepLast + 1) x it checked
by `braintrain validate`, `braintrain estimate`, the operator and `braintrain run`."""

from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml
from fake_cluster import FakeCluster

from brain_operator.cli import main
from brain_operator.local.dataset import job_vocabulary
from brain_operator.reconcile import reconcile
from brain_operator.spec import parse_job
from brain_operator.sizing.storage import StorageTooSmall, check_storage, local_shortfall, room_needed
from brain_trainer.config.presets import preset_config, wrap_unit_params
from brain_trainer.plan.checkpoint_size import STAGED_BYTES_PER_PARAM, preset_checkpoint_bytes

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "deploy" / "examples").glob("*.yaml"))
LOCAL_MINIMAL = EXAMPLES[0].with_name("local-minimal.yaml")
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)


def minimal(**checkpoint):
    manifest = yaml.safe_load(LOCAL_MINIMAL.read_text())
    manifest["spec"]["checkpoint"] = {**manifest["spec"]["checkpoint"], **checkpoint}
    return manifest


def test_a_checkpoint_is_the_planners_fp32_parameters_and_adamw_moments():
    params = sum(wrap_unit_params(preset_config("minimal")))
    assert STAGED_BYTES_PER_PARAM == 12
    assert params * 12 < preset_checkpoint_bytes("minimal") < params * 12 * 1.1


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_has_room_for_its_checkpoints(path):
    job = parse_job(yaml.safe_load(path.read_text()), require_image=False)
    check_storage(job, job_vocabulary(job))  # raises when too small
    needed, size = room_needed(job)
    assert needed == (job.spec.checkpoint.keep_last + 1) * size == (job.spec.checkpoint.keep_last + 1) * \
        preset_checkpoint_bytes(job.spec.model.preset)


def test_a_too_small_template_is_refused_naming_the_field_and_both_figures():
    job = parse_job(minimal(volumeClaimTemplate={"accessModes": ["ReadWriteMany"], "storage": "20Mi"}), require_image=False)
    with pytest.raises(StorageTooSmall) as refused:
        check_storage(job, job_vocabulary(job))
    (error,) = refused.value.errors
    assert str(error) == (
        "spec.checkpoint.volumeClaimTemplate.storage: 20Mi (21.0 MB) cannot hold (checkpoint.keepLast 2 + 1) x "
        "13.1 MB per checkpoint = 39.2 MB"
    )
    # (keepLast + 1) x the size is enough: keeping one checkpoint fits in 30Mi (31.5 MB >= 2 x 13.1 MB).
    job = parse_job(minimal(keepLast=1, volumeClaimTemplate={"storage": "30Mi"}), require_image=False)
    check_storage(job, job_vocabulary(job))


@pytest.mark.parametrize("command", ["validate", "estimate"])
def test_validate_and_estimate_refuse_it_in_one_line(tmp_path, capsys, command):
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(minimal(volumeClaimTemplate={"accessModes": ["ReadWriteMany"], "storage": "20Mi"})))
    code = main([command, str(path), *(["--local"] if command == "validate" else [])])
    _, err = capsys.readouterr()
    assert code == 1
    assert err.splitlines() == [f"{path}: spec.checkpoint.volumeClaimTemplate.storage: 20Mi (21.0 MB) cannot hold "
                                "(checkpoint.keepLast 2 + 1) x 13.1 MB per checkpoint = 39.2 MB"]


def test_estimate_says_what_the_checkpoints_need(capsys):
    assert main(["estimate", str(LOCAL_MINIMAL)]) == 0
    out = capsys.readouterr().out
    assert "checkpoint: 13.1 MB each; keepLast 2 + 1 being written = 39.2 MB" in out
    assert "spec.checkpoint.volumeClaimTemplate.storage: 1Gi, covers it" in out


def test_the_operator_refuses_a_too_small_template_until_it_is_fixed():
    cluster = FakeCluster()
    manifest = minimal(volumeClaimTemplate={"accessModes": ["ReadWriteMany"], "storage": "20Mi"})
    manifest["spec"]["image"] = "registry.example/brain-trainer:1"
    manifest["metadata"]["namespace"] = "default"
    cluster.apply_job(manifest)
    status = reconcile(cluster.get_job("default", "local-minimal"), cluster, NOW)
    valid = next(c for c in status["conditions"] if c["type"] == "Valid")
    assert (valid["status"], valid["reason"]) == ("False", "CheckpointStorageTooSmall")
    assert "volumeClaimTemplate.storage: 20Mi (21.0 MB) cannot hold" in valid["message"] and "39.2 MB" in valid["message"]
    assert status["phase"] == "Failed" and cluster.kinds() == []
    manifest["spec"]["checkpoint"]["volumeClaimTemplate"]["storage"] = "64Mi"
    cluster.apply_job(manifest)
    status = reconcile(cluster.get_job("default", "local-minimal"), cluster, NOW)
    assert status["phase"] == "Pending" and "PersistentVolumeClaim" in cluster.kinds()


def test_a_claim_name_gets_a_warning_event_once():
    cluster = FakeCluster()
    manifest = minimal(claimName="shared-ckpt")
    del manifest["spec"]["checkpoint"]["volumeClaimTemplate"]
    manifest["spec"]["image"] = "registry.example/brain-trainer:1"
    manifest["metadata"]["namespace"] = "default"
    cluster.apply_job(manifest)
    reconcile(cluster.get_job("default", "local-minimal"), cluster, NOW)
    reconcile(cluster.get_job("default", "local-minimal"), cluster, NOW)
    warned = [e for _, e in cluster.events if e.reason == "CheckpointStorageUnchecked"]
    assert [(e.type, e.message) for e in warned] == [(
        "Warning",
        "checkpoint claim shared-ckpt is not sized by the operator: it must hold (checkpoint.keepLast 2 + 1) x "
        "13.1 MB per checkpoint = 39.2 MB, or the trainer fails with storage-full",
    )]


@pytest.mark.parametrize("free_mb, short", [(14, False), (13, True), (0, True)])
def test_a_local_run_needs_room_for_the_next_checkpoint(free_mb, short):
    job = parse_job(minimal(), require_image=False)
    found = local_shortfall(job, free=free_mb * 10**6, folder="runs/claims/x")
    assert (found is not None) == short
    if short:
        assert found == (f"storage-full: runs/claims/x has {free_mb:.1f} MB free; the next checkpoint needs 13.1 MB "
                         "(checkpoint.keepLast 2)")
