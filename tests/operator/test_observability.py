"""Issue 7's pure pieces on the operator side: progress -> status, polling cadence, own metrics."""

from datetime import datetime, timedelta, timezone

import pytest
from prometheus_client import generate_latest

from brain_operator.metrics import OperatorMetrics
from brain_operator.progress import changed, progress_status

NOW = datetime(2026, 11, 22, 12, 0, 0, tzinfo=timezone.utc)
DOC = {"step": 120, "total_steps": 200, "loss": 2.123456, "tokens_per_second": 5321.77,
       "eta_seconds": 41.9, "last_checkpoint_step": 100, "eval_loss": 2.345678, "updated_at": 1.0}


def test_progress_document_maps_into_status():
    out = progress_status(DOC, {}, now=NOW, mount_path="/checkpoints/")
    assert out == {
        "progress": {"step": 120, "totalSteps": 200, "loss": 2.123, "tokensPerSecond": 5322.0, "etaSeconds": 41,
                     "evalLoss": 2.346, "updatedAt": "2026-11-22T12:00:00Z"},
        "lastCheckpoint": {"step": 100, "path": "/checkpoints/step-00000100"},
    }


@pytest.mark.parametrize("doc", [None, {}, {"step": "x"}, {"loss": 1.0}])
def test_unreachable_or_garbled_worker_keeps_previous_values(doc):
    previous = progress_status(DOC, {}, now=NOW, mount_path="/ckpt")
    previous["phase"] = "Running"
    out = progress_status(doc, previous, now=NOW + timedelta(minutes=1), mount_path="/ckpt")
    assert out == {"progress": previous["progress"], "lastCheckpoint": previous["lastCheckpoint"]}


def test_no_checkpoint_yet_means_no_last_checkpoint():
    out = progress_status({**DOC, "last_checkpoint_step": None}, {}, now=NOW, mount_path="/c")
    assert "lastCheckpoint" not in out and out["progress"]["step"] == 120


def test_a_poll_patches_only_news():
    a = progress_status(DOC, {}, now=NOW, mount_path="/c")
    b = progress_status(DOC, {}, now=NOW + timedelta(seconds=30), mount_path="/c")
    assert not changed(a, b)
    assert changed(a, progress_status({**DOC, "step": 121}, {}, now=NOW, mount_path="/c"))


def sample(metrics: OperatorMetrics, name: str, **labels) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_operator_metrics_change_with_reconciles():
    m = OperatorMetrics()
    m.observe_phase("ns", "a", "Pending")
    m.observe_phase("ns", "b", "Running")
    m.observe_phase("ns", "a", "Running")
    assert sample(m, "brain_operator_jobs", phase="Running") == 2
    assert sample(m, "brain_operator_jobs", phase="Pending") == 0
    m.observe_phase("ns", "b", None)
    assert sample(m, "brain_operator_jobs", phase="Running") == 1
    with m.reconcile():
        pass
    with pytest.raises(KeyError), m.reconcile():
        raise KeyError("boom")
    assert sample(m, "brain_operator_reconcile_duration_seconds_count") == 2
    assert sample(m, "brain_operator_reconcile_errors_total", error="KeyError") == 1
    assert b"brain_operator_jobs" in generate_latest(m.registry)
