"""`braintrain estimate` asks the trainer's planner the trainer's question: the strategy it shows a CPU job running
under `auto` is the one the trainer resolves there (one rule, plan.question.unplanned_strategy)."""

from __future__ import annotations

from pathlib import Path

import pytest

from brain_operator.sizing.estimate import host_plan
from brain_operator.spec import parse_job, trainer_config, world_size
from brain_trainer.config import read_yaml
from brain_trainer.plan import resolve_distributed, unplanned_strategy

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "local-minimal.yaml"


def test_auto_without_planning_is_fsdp_under_tp_or_pp_single_on_one_rank_else_ddp():
    assert [unplanned_strategy(*case) for case in ((1, 1, 1), (4, 1, 1), (4, 2, 1), (4, 1, 2), (1, 1, 2))] == [
        "single", "ddp", "fsdp", "fsdp", "fsdp"]


@pytest.mark.parametrize(("nodes", "distributed"), [
    (1, {}), (2, {}), (1, {"cpuOffload": True}), (2, {"cpuOffload": True}), (2, {"activationCheckpointing": "full"}),
    (1, {"tensorParallel": 2}), (2, {"pipelineParallel": 2, "gradientAccumulationSteps": 2}),
])
def test_estimate_on_cpus_plans_the_strategy_the_trainer_runs(nodes, distributed):
    doc = read_yaml(EXAMPLE)
    doc["spec"]["nodes"] = nodes
    doc["spec"]["nprocPerNode"] = distributed.get("tensorParallel", 1)  # a tp group stays in a node
    doc["spec"].setdefault("distributed", {}).update(strategy="auto", **distributed)
    job = parse_job(doc, require_image=False)
    trainer = resolve_distributed(trainer_config(job), world_size(job.spec), None)
    shown = host_plan(job).plan.choice
    assert (shown.strategy, shown.tensor_parallel, shown.pipeline_parallel, shown.activation_checkpointing) == (
        trainer.strategy, trainer.tp, trainer.pp, trainer.activation_checkpointing)
