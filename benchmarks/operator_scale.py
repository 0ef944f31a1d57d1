"""How the operator's control loop scales with the number of jobs (a benchmark, not a test).

Every job has 16 nodes. For each fleet size the script applies the jobs to the
in-memory cluster client and reconciles each one twice: the first pass parses,
validates, renders and creates the children; the second is the steady state
(the same work, no writes). It prints jobs/s, objects/s and the median cost
per job over chunks of 100 jobs, which stays flat as the fleet grows when
reconcile is linear.

    .venv/bin/python benchmarks/operator_scale.py [--sizes 100 1000 10000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "operator"))

from fake_cluster import FakeCluster  # noqa: E402  (the in-memory ClusterClient)

from brain_operator.reconcile import plan, reconcile, watched_kinds  # noqa: E402
from brain_operator.render import render  # noqa: E402
from brain_operator.spec import API_VERSION, KIND, parse_job  # noqa: E402

NODES = 16
STAGE_JOBS = 200
CHUNK = 100
NOW = datetime(2026, 11, 22, 12, 0, 0, tzinfo=timezone.utc)


def manifest(i: int) -> dict:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": f"job-{i:05d}", "namespace": f"team-{i % 10}"},
        "spec": {
            "image": "registry.example/brain-trainer:1",
            "nodes": NODES,
            "nprocPerNode": 8,
            "elastic": {"minNodes": 8, "maxNodes": 32},
            "resources": {"limits": {"nvidia.com/gpu": 8}},
            "model": {"preset": "7b"},
            "training": {"microBatchSize": 2},
            "distributed": {"gradientAccumulationSteps": 4},
            "checkpoint": {"volumeClaimTemplate": {"storage": "2Ti"}},
            "runPolicy": {"backoffLimit": 5},
        },
    }


def timed_pass(jobs: list[dict], cluster: FakeCluster) -> tuple[float, float, list[str]]:
    """Reconcile every job once: total seconds, median seconds per job over chunks, phases.

    The median over chunks of CHUNK jobs shrugs off load spikes from other
    processes, and the later chunks run against a fuller cluster, so a
    reconcile that grew with the fleet would show in it.
    """
    per_job, phases = [], []
    for first in range(0, len(jobs), CHUNK):
        chunk = jobs[first:first + CHUNK]
        start = time.perf_counter()
        phases.extend(reconcile(job, cluster, NOW)["phase"] for job in chunk)
        per_job.append((time.perf_counter() - start) / len(chunk))
    total = sum(seconds * len(jobs[i * CHUNK:(i + 1) * CHUNK]) for i, seconds in enumerate(per_job))
    return total, statistics.median(per_job), phases


def fleet(n: int) -> dict[str, float]:
    cluster = FakeCluster()
    jobs = [cluster.apply_job(manifest(i)) for i in range(n)]
    create, create_median, phases = timed_pass(jobs, cluster)
    assert set(phases) == {"Pending"}, f"jobs did not start: {set(phases)}"
    objects = sum(kind == "create" for kind, _ in cluster.writes)
    current = [cluster.get_job(j["metadata"]["namespace"], j["metadata"]["name"]) for j in jobs]
    writes = len(cluster.writes)
    steady, steady_median, _ = timed_pass(current, cluster)
    assert len(cluster.writes) == writes, "a steady-state pass wrote to the cluster"
    return {"jobs": n, "objects": objects, "create_s": create, "steady_s": steady,
            "create_median": create_median, "steady_median": steady_median}


def stages(n: int) -> dict[str, float]:
    """Where one pass's time goes: the pure steps alone, on already-created jobs."""
    cluster = FakeCluster()
    jobs = [cluster.apply_job(manifest(i)) for i in range(n)]
    for job in jobs:
        reconcile(job, cluster, NOW)
    jobs = [cluster.get_job(j["metadata"]["namespace"], j["metadata"]["name"]) for j in jobs]
    out = {}
    start = time.perf_counter()
    parsed = [parse_job(j) for j in jobs]
    out["parse+validate"] = time.perf_counter() - start
    start = time.perf_counter()
    rendered = [render(j) for j in parsed]
    out["render"] = time.perf_counter() - start
    start = time.perf_counter()
    children = [
        [c for api, kind in watched_kinds(j, r) for c in cluster.list_children(api, kind, j.namespace, j.name)]
        for j, r in zip(parsed, rendered)
    ]
    out["list (in-memory client)"] = time.perf_counter() - start
    start = time.perf_counter()
    for job, raw, desired, existing in zip(parsed, jobs, rendered, children):
        plan(job, desired, existing, raw.get("status") or {}, NOW)
    out["plan + status"] = time.perf_counter() - start
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000])
    args = parser.parse_args()
    print(f"jobs of {NODES} nodes each, elastic backend, in-memory cluster client")
    split = stages(STAGE_JOBS)
    total = sum(split.values())
    print(f"one steady pass over {STAGE_JOBS} jobs, by stage:")
    for stage, seconds in split.items():
        print(f"  {stage:<26} {1e3 * seconds / STAGE_JOBS:6.3f} ms/job  {100 * seconds / total:5.1f}%")
    print(f"{'jobs':>7} {'objects':>8} {'jobs/s':>7} {'objects/s':>10} {'median ms/job':>14} "
          f"{'steady jobs/s':>14} {'median ms/job':>14}")
    base = None
    for n in args.sizes:
        r = fleet(n)
        print(f"{r['jobs']:>7} {r['objects']:>8} {r['jobs'] / r['create_s']:>7.0f} "
              f"{r['objects'] / r['create_s']:>10.0f} {1e3 * r['create_median']:>14.2f} "
              f"{r['jobs'] / r['steady_s']:>14.0f} {1e3 * r['steady_median']:>14.2f}", flush=True)
        base = base or r
        if r is not base:
            ratio = r["create_median"] / base["create_median"]
            steady = r["steady_median"] / base["steady_median"]
            print(f"        cost per job at {r['jobs']} jobs / at {base['jobs']} jobs: create {ratio:.2f}, "
                  f"steady {steady:.2f} (1.00 = linear)", flush=True)


if __name__ == "__main__":
    main()
