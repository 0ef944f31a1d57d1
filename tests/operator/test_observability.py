"""Issue 7's pure pieces on the operator side: progress -> status, polling cadence, own metrics."""

from datetime import datetime, timedelta, timezone

import pytest
from prometheus_client import generate_latest

from brain_operator.status.job_status import JobStatus, LastCheckpoint
from brain_operator.metrics import OperatorMetrics
from brain_operator.status.progress import progress_status

NOW = datetime(2026, 11, 22, 12, 0, 0, tzinfo=timezone.utc)
DOC = {"step": 120, "total_steps": 200, "loss": 2.123456, "tokens_per_second": 5321.77,
       "eta_seconds": 41.9, "last_checkpoint_step": 100, "eval_loss": 2.345678, "updated_at": 1.0}


def polled(doc, status=None, now=NOW, root="/c"):
    return progress_status(doc, status or JobStatus(), now=now, root=root)


def test_progress_document_maps_into_status():
    out = polled(DOC, root="/checkpoints/").to_dict()
    # Only the fields the document feeds are added.
    assert out == {
        **JobStatus().to_dict(),
        "progress": {"step": 120, "totalSteps": 200, "loss": 2.123, "tokensPerSecond": 5322.0, "etaSeconds": 41,
                     "evalLoss": 2.346, "updatedAt": "2026-11-22T12:00:00Z"},
        "lastCheckpoint": {"step": 100, "path": "/checkpoints/step-00000100"},
    }


@pytest.mark.parametrize("doc", [None, {}, {"step": "x"}, {"loss": 1.0}])
def test_unreachable_or_garbled_worker_keeps_previous_values(doc):
    previous = JobStatus(phase="Running", progress=polled(DOC).progress, last_checkpoint=LastCheckpoint(100, "/ckpt"))
    assert polled(doc, previous, now=NOW + timedelta(minutes=1)) is previous


def test_no_checkpoint_yet_means_no_last_checkpoint():
    out = polled({**DOC, "last_checkpoint_step": None})
    assert out.last_checkpoint is None and out.progress.step == 120


def test_a_poll_changes_only_news():
    first = polled(DOC)
    # The same document later: no news, the status stands (and updatedAt says when it last changed).
    assert polled(DOC, first, now=NOW + timedelta(seconds=30)) is first
    moved = polled({**DOC, "step": 121}, first, now=NOW + timedelta(seconds=30))
    assert moved.progress.step == 121 and moved.progress.updated_at == "2026-11-22T12:00:30Z"


def test_goodput_goes_to_status_goodput_rounded_and_counts_as_news():
    goodput = {"ratio": 0.71234, "wall_seconds": 100.4, "productive_seconds": 71.2, "recomputed_seconds": 3.6,
               "checkpoint_seconds": 1.4, "initialization_seconds": 9.9, "evaluation_seconds": 0.0, "waiting_seconds": 14.1}
    out = polled({**DOC, "goodput": goodput}).to_dict()
    assert out["goodput"] == {"ratio": 0.712, "wallSeconds": 100.0, "productiveSeconds": 71.0, "recomputedSeconds": 4.0,
                              "checkpointSeconds": 1.0, "initializationSeconds": 10.0, "evaluationSeconds": 0.0,
                              "waitingSeconds": 14.0}
    assert "goodput" not in out["progress"]  # shown once, under status.goodput
    before = JobStatus.read(out)
    later = polled({**DOC, "goodput": {**goodput, "wall_seconds": 130.0, "ratio": 0.6}}, before)
    assert later is not before and later.goodput.ratio == 0.6


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
