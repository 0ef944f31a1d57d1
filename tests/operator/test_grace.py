"""Grace that fits a checkpoint, and a rendezvous that waits: what the worker pods, the PyTorchJob and the local
runner are given (sizing/grace.py, backends/shared/workers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from brain_operator.sizing.grace import (
    MIN_GRACE_SECONDS,
    SHUTDOWN_MARGIN_SECONDS,
    planned_save_seconds,
    shutdown_timeout_seconds,
    termination_grace_seconds,
)
from brain_operator.local.plan import plan_local
from brain_operator.backends import render
from brain_operator.spec import parse_job
from brain_operator.sizing.storage import checkpoint_size
from brain_trainer.schema import ConfigError


def manifest(backend="elastic", nodes=2, **spec):
    return {
        "apiVersion": "brain.ai/v1alpha1",
        "kind": "BrainTrainingJob",
        "metadata": {"name": "g", "namespace": "ns", "uid": "u-1"},
        "spec": {"image": "trainer:1", "backend": backend, "nodes": nodes, **spec},
    }


def pods_of(objects):
    """(pod spec, env) of every worker the rendering makes, for either backend."""
    out = []
    for obj in objects:
        if obj["kind"] == "Pod":
            specs = [obj["spec"]]
        elif obj["kind"] == "PyTorchJob":
            specs = [r["template"]["spec"] for r in obj["spec"]["pytorchReplicaSpecs"].values()]
        else:
            continue
        for spec in specs:
            out.append((spec, {e["name"]: e["value"] for e in spec["containers"][0]["env"]}))
    return out


@pytest.mark.parametrize("backend", ["elastic", "pytorchjob"])
def test_a_set_grace_reaches_the_pods_and_torchruns_shutdown_timeout(backend):
    job = parse_job(manifest(backend, runPolicy={"terminationGracePeriodSeconds": 900}))
    pods = pods_of(render(job))
    assert pods
    for spec, env in pods:
        assert spec["terminationGracePeriodSeconds"] == 900
        assert env["PET_SHUTDOWN_TIMEOUT"] == str(900 - SHUTDOWN_MARGIN_SECONDS)


def test_the_default_grace_fits_the_planned_save_of_a_large_model():
    big = parse_job(manifest(nodes=1, model={"preset": "7b"}))
    save = planned_save_seconds(big)
    # A 7B checkpoint (fp32 weights and AdamW's moments, ~84 GB) written by one node takes minutes.
    assert save is not None and save > MIN_GRACE_SECONDS
    assert termination_grace_seconds(big) == save + SHUTDOWN_MARGIN_SECONDS
    (spec, env), = pods_of(render(big))
    assert spec["terminationGracePeriodSeconds"] == save + SHUTDOWN_MARGIN_SECONDS
    assert int(env["PET_SHUTDOWN_TIMEOUT"]) == save
    # More nodes share the write.
    assert planned_save_seconds(parse_job(manifest(nodes=4, model={"preset": "7b"}))) < save


def test_the_default_grace_is_never_below_the_old_300_seconds():
    small = parse_job(manifest())
    assert checkpoint_size(small) is not None
    assert termination_grace_seconds(small) == MIN_GRACE_SECONDS
    # Without a size to plan from (a user model), the floor too.
    user = parse_job(manifest(model={"entrypoint": "mypkg.models:build"}))
    assert planned_save_seconds(user) is None and termination_grace_seconds(user) == MIN_GRACE_SECONDS


@pytest.mark.parametrize("bad", [0, -5, "long", 1.5])
def test_a_bad_grace_is_refused_naming_the_field(bad):
    with pytest.raises(ConfigError) as err:
        parse_job(manifest(runPolicy={"terminationGracePeriodSeconds": bad}))
    assert "spec.runPolicy.terminationGracePeriodSeconds" in str(err.value)
    assert str(bad) in str(err.value)


@given(st.integers(min_value=1, max_value=10**6))
def test_torchrun_lets_go_of_its_workers_before_the_kubelet_kills_it(grace):
    timeout = shutdown_timeout_seconds(grace)
    assert 1 <= timeout <= grace
    if grace > 1:
        assert timeout < grace
    if grace >= 2 * SHUTDOWN_MARGIN_SECONDS:
        assert timeout == grace - SHUTDOWN_MARGIN_SECONDS


def test_the_local_runner_waits_the_grace_before_it_kills():
    job = parse_job(manifest(runPolicy={"terminationGracePeriodSeconds": 45}), require_image=False)
    plan = plan_local(job, workdir=Path("/w"), claims=Path("/c"), rendezvous=Path("/w/r/a"), metrics_port=1,
                      python="python", cpu_count=2)
    assert plan.grace_seconds == 45
    assert {w.env["PET_SHUTDOWN_TIMEOUT"] for w in plan.workers} == {str(shutdown_timeout_seconds(45))}


@pytest.mark.parametrize("backend", ["elastic", "pytorchjob"])
def test_the_rendezvous_waits_as_long_as_a_start_may_take(backend):
    job = parse_job(manifest(backend, elastic={"minNodes": 1, "maxNodes": 3},
                             watchdog={"startupSeconds": 90.5}))
    if backend == "elastic":
        confs = [env["PET_RDZV_CONF"] for _, env in pods_of(render(job))]
        assert confs == ["is_host=1,join_timeout=91,read_timeout=91", "is_host=0,join_timeout=91,read_timeout=91"]
    else:
        (pytorchjob,) = [o for o in render(job) if o["kind"] == "PyTorchJob"]
        conf = pytorchjob["spec"]["elasticPolicy"]["rdzvConf"]
        assert conf == [{"key": "join_timeout", "value": "91"}, {"key": "read_timeout", "value": "91"}]
