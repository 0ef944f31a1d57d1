"""Hostile manifests (issue 28, point 6): scheduling typed by core/v1, deep trees and long values stay one short line."""

from __future__ import annotations

import pytest
from fake_cluster import FakeCluster
from test_reconcile import NS, T0, condition, manifest

from brain_operator.reconcile import reconcile
from brain_operator.spec.parse import parse_job
from brain_trainer.schema import QUOTE_LIMIT, ConfigError


def problems(**scheduling):
    with pytest.raises(ConfigError) as caught:
        parse_job(manifest(scheduling=scheduling))
    return [str(error) for error in caught.value.errors]


def test_affinity_and_tolerations_are_checked_against_core_v1_naming_the_field():
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"], "valuez": ["a100"]}]}]}}}
    [line] = problems(affinity=affinity, tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}])
    assert line.startswith("spec.scheduling.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
                           ".nodeSelectorTerms[0].matchExpressions[0].valuez: unknown field")
    assert problems(tolerations=[{"key": "gpu", "tolerationSeconds": "forever"}]) == [
        "spec.scheduling.tolerations[0].tolerationSeconds: must be an integer, got 'forever'"]
    assert problems(tolerations={"key": "gpu"}) == ["spec.scheduling.tolerations: must be a list, got {'key': 'gpu'}"]
    good = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}]}}
    assert parse_job(manifest(scheduling={"affinity": good})).spec.scheduling.affinity == good


def test_affinity_nested_700_deep_is_an_invalid_spec_not_a_reconcile_that_fails_forever():
    deep = leaf = {}
    for _ in range(700):
        leaf["x"] = {}
        leaf = leaf["x"]
    cluster = FakeCluster()
    cluster.apply_job(manifest())
    job = cluster.get_job(NS, "j")  # the fake cluster's copies recurse; the operator holds the tree as it came
    job["spec"]["scheduling"] = {"affinity": {"nodeAffinity": deep}}
    status = reconcile(job, cluster, T0)
    valid = condition(status, "Valid")
    assert valid["status"] == "False" and valid["reason"] == "InvalidSpec" and cluster.kinds() == []
    assert valid["message"] == "spec.scheduling.affinity.nodeAffinity.x: unknown field (known fields: " \
        "preferredDuringSchedulingIgnoredDuringExecution, requiredDuringSchedulingIgnoredDuringExecution)"
    # Again, as the next pass reads it (its status and resourceVersion as just written): the same status.
    stored = cluster.get_job(NS, "j")
    job["metadata"]["resourceVersion"], job["status"] = stored["metadata"]["resourceVersion"], stored["status"]
    assert reconcile(job, cluster, T0) == status


def test_error_messages_quote_at_most_a_short_prefix_of_what_they_were_given():
    huge = "x" * 1_000_000
    with pytest.raises(ConfigError) as caught:
        parse_job({**manifest(), "kind": huge, "spec": {**manifest()["spec"], huge: 1, "nodes": [list(range(10**5))]}})
    lines = [str(error) for error in caught.value.errors]
    # Beyond the quotes, a line holds its own words: for the unknown key, the list of the spec's known fields.
    assert len(lines) == 3 and all(len(line) < 2 * QUOTE_LIMIT + 400 for line in lines), [len(line) for line in lines]
    assert any(line.startswith("kind: must be ") and "'xxx" in line for line in lines)
