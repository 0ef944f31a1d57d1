"""The chart's Grafana dashboard (issue 36, point 3): shipped off by default in a ConfigMap for Grafana's sidecar,
and every query names a metric, and groups by a label, that the trainer or the operator really exports."""

from __future__ import annotations

import json
import re
from typing import Any, Iterator

import pytest
from brain_operator.metrics import OperatorMetrics
from brain_operator.objects.names import JOB_NAME_LABEL
from brain_trainer.contract import Goodput, Progress
from brain_trainer.observe import commits
from brain_trainer.observe.metrics import MetricsServer
from chart_render import CHART, RELEASE_NAMESPACE, render_objects

DASHBOARD = CHART / "dashboards" / "brain-train.json"
# Labels Prometheus adds when it scrapes: the target's namespace and pod, the PodMonitor's podTargetLabels
# (brain.ai/job-name, its name sanitised), and the buckets' `le`.
SCRAPE_LABELS = {"namespace", "pod", "job", "le", re.sub(r"[^a-zA-Z0-9_]", "_", JOB_NAME_LABEL)}
# PromQL's own words, which are not metric names
PROMQL = {"sum", "rate", "by", "histogram_quantile", "label_values", "avg", "max", "min", "increase", "without"}
METRIC = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def expressions(board: dict[str, Any]) -> Iterator[str]:
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            yield target["expr"]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            yield variable["query"]["query"]


def names_in(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, labels grouped by) of a PromQL expression."""
    grouped = {label.strip() for group in re.findall(r"by \(([^)]*)\)", expr) for label in group.split(",")}
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"|by \([^)]*\)", " ", expr)  # matchers, ranges, strings, groupings
    words = {w for w in METRIC.findall(bare) if w not in PROMQL and not re.fullmatch(r"\d.*", w)}
    variable_labels = set(re.findall(r", ([a-z_]+)\)$", expr)) if expr.startswith("label_values") else set()
    return words - variable_labels, grouped | variable_labels


@pytest.fixture(scope="module")
def exported() -> dict[str, set[str]]:
    """{sample name: its labels} of every series the trainer's endpoint and the operator register, each made to
    appear: a full progress document, init memory, a committed checkpoint, a reconcile that raised."""
    server = MetricsServer(0, host="127.0.0.1")
    try:
        server.describe(version="0", preset="minimal", strategy="ddp", world_size="2")
        goodput = Goodput(ratio=0.9, wall_seconds=10.0, productive_seconds=9.0, checkpoint_seconds=1.0)
        server.publish(Progress(step=3, total_steps=9, loss=2.0, tokens_per_second=9.0, eta_seconds=1.0,
                                last_checkpoint_step=2, eval_loss=2.1, checkpoint_interval_steps=2, goodput=goodput,
                                restarts=1, in_pod_restarts=1),
                       step_times=[0.1], tokens=10, learning_rate=1e-3, peak_memory_bytes=1, grad_norm=1.0, mfu=0.4)
        server.publish_init_memory([{"rank": 0, "parameter_bytes": 1, "peak_host_bytes": 1, "device_bytes": 1}])
        commits.committed(commits.Commit(step=2, bytes=1024, seconds=1.5))
        registries = [server.registry]
    finally:
        server.close()
    operator = OperatorMetrics()
    operator.observe_phase("ns", "job", "Running")
    with pytest.raises(RuntimeError), operator.reconcile():
        raise RuntimeError("a reconcile that failed")
    registries.append(operator.registry)
    out: dict[str, set[str]] = {}
    for registry in registries:
        for metric in registry.collect():
            for sample in metric.samples:
                out.setdefault(sample.name, set()).update(sample.labels)
    return out


def test_every_query_names_a_metric_and_labels_that_are_exported(exported):
    used: set[str] = set()
    for expr in expressions(dashboard()):
        metrics, labels = names_in(expr)
        assert metrics, f"no metric in {expr!r}"
        for name in metrics:
            assert name in exported, f"{name} (in {expr!r}) is exported by neither the trainer nor the operator"
            assert labels <= exported[name] | SCRAPE_LABELS, (
                f"{expr!r} groups by {sorted(labels - exported[name] - SCRAPE_LABELS)}, which {name} does not carry")
        used |= metrics
    # what issue 36 asks the dashboard to show
    for name in ("brain_trainer_steps_total", "brain_trainer_tokens_per_second", "brain_trainer_mfu",
                 "brain_trainer_loss", "brain_trainer_eval_loss", "brain_trainer_goodput_ratio",
                 "brain_trainer_goodput_seconds_total", "brain_trainer_restarts", "brain_trainer_in_pod_restarts_total",
                 "brain_trainer_checkpoint_save_seconds_bucket", "brain_trainer_checkpoint_bytes",
                 "brain_operator_reconcile_duration_seconds_count", "brain_operator_reconcile_errors_total"):
        assert name in used, name


def test_a_wrong_name_is_caught(exported):
    metrics, labels = names_in('sum by (namespace, brain_ai_job_name) (rate(brain_trainer_step_total{x="y"}[5m]))')
    assert metrics == {"brain_trainer_step_total"} and "brain_trainer_step_total" not in exported
    assert labels == {"namespace", "brain_ai_job_name"}


def test_the_dashboard_configmap_is_off_by_default_and_labelled_for_the_sidecar():
    assert not [o for o in render_objects() if o["kind"] == "ConfigMap"]
    values = {"metrics": {"grafanaDashboard": {"enabled": True, "annotations": {"grafana_folder": "Training"}}}}
    (configmap,) = [o for o in render_objects(values) if o["kind"] == "ConfigMap"]
    assert configmap["metadata"]["namespace"] == RELEASE_NAMESPACE
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "Training"}
    assert json.loads(configmap["data"]["brain-train.json"]) == dashboard()
    values["metrics"]["grafanaDashboard"].update(namespace="monitoring", labels={"dashboards": "brain"})
    (configmap,) = [o for o in render_objects(values) if o["kind"] == "ConfigMap"]
    assert configmap["metadata"]["namespace"] == "monitoring" and configmap["metadata"]["labels"]["dashboards"] == "brain"
