"""How the operator's control loop scales with the number of jobs (a benchmark, not a test).

Every job has 16 nodes. For each fleet size the script applies the jobs to the
in-memory cluster client and reconciles each one twice: the first pass parses,
validates, renders and creates the children; the second is the steady state
(the same work, no writes). It prints jobs/s, objects/s and the median cost
per job over chunks of 100 jobs, which stays flat as the fleet grows when
reconcile is linear.

Reconcile reads the children as the operator's watches keep them
(children.py) through a client that counts API calls by verb, so it also
prints the calls one reconcile makes: creating a job, in the steady state
(target: no LIST, no write), and after one pod changed (one status PATCH).
Then the creates the API server answers 409 AlreadyExists per job start
(target 0) for a burst of jobs whose watches lag the writes by a pass, as
a real watch does, side by side with and without the operator's
expectations (what the operator did before it kept them).
Last, the operator's resident memory: a fresh process holds the kopf
indexes of every child of N jobs, fed pod bodies the size the API server
sends through the operator's own index function.

    .venv/bin/python benchmarks/operator_scale.py [--sizes 100 1000 10000]
"""

from __future__ import annotations

import argparse
import copy
import gc
import statistics
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path[:0] = [str(TESTS / "operator"), str(TESTS)]  # the fake cluster, and the checkers it shares with the tests

from counting_cluster import CountingCluster, watched  # noqa: E402  (call counts; the indexes' view)
from fake_cluster import FakeCluster, Watch  # noqa: E402  (the in-memory ClusterClient, a lagging watch)

from brain_operator.cluster.expectations import Expectations  # noqa: E402
from brain_operator.reconcile import plan, reconcile, watched_kinds  # noqa: E402
from brain_operator.backends import render  # noqa: E402
from brain_operator.spec import API_VERSION, KIND, parse_job  # noqa: E402

NODES = 16
STAGE_JOBS = 200
# A burst of jobs started at once, and how many passes their watches lag the writes.
BURST_JOBS = 30
WATCH_LAG = 1
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


def timed_pass(jobs: list[dict], cluster: FakeCluster, counting: CountingCluster) -> tuple[float, float, list[str]]:
    """Reconcile every job once: total seconds, median seconds per job over chunks, phases.

    The median over chunks of CHUNK jobs shrugs off load spikes from other
    processes, and the later chunks run against a fuller cluster, so a
    reconcile that grew with the fleet would show in it.
    """
    per_job, phases = [], []
    for first in range(0, len(jobs), CHUNK):
        chunk = jobs[first:first + CHUNK]
        start = time.perf_counter()
        for job in chunk:
            # As the operator does: read the job afresh, then reconcile it.
            current = counting.get_job(job["metadata"]["namespace"], job["metadata"]["name"])
            phases.append(reconcile(current, counting, NOW, observed=watched(cluster))["phase"])
        per_job.append((time.perf_counter() - start) / len(chunk))
    total = sum(seconds * len(jobs[i * CHUNK:(i + 1) * CHUNK]) for i, seconds in enumerate(per_job))
    return total, statistics.median(per_job), phases


def fleet(n: int) -> dict[str, float]:
    cluster = FakeCluster()
    counting = CountingCluster(cluster)
    jobs = [cluster.apply_job(manifest(i)) for i in range(n)]
    create, create_median, phases = timed_pass(jobs, cluster, counting)
    assert set(phases) == {"Pending"}, f"jobs did not start: {set(phases)}"
    calls = {"create": counting.take()}
    objects = sum(kind == "create" for kind, _ in cluster.writes)
    writes = len(cluster.writes)
    steady, steady_median, _ = timed_pass(jobs, cluster, counting)
    calls["steady"] = counting.take()
    assert len(cluster.writes) == writes, "a steady-state pass wrote to the cluster"
    for job in jobs:  # one worker of each job starts running: each job's next pass has news
        cluster.set_pod(f"{job['metadata']['name']}-worker-0", "Running", namespace=job["metadata"]["namespace"])
    timed_pass(jobs, cluster, counting)
    calls["one pod changed"] = counting.take()
    return {"jobs": n, "objects": objects, "create_s": create, "steady_s": steady,
            "create_median": create_median, "steady_median": steady_median, "calls": calls}


def already_exists_per_start(n: int, lag: int, expect: bool) -> tuple[float, float]:
    """(409 AlreadyExists answers, creates sent) per job, over the passes that start n jobs at once while the
    watches show each job's children `lag` passes late; `expect`: with the operator's expectations."""
    cluster = FakeCluster()
    watch = Watch(cluster, lag)
    expectations = Expectations() if expect else None
    jobs = [cluster.apply_job(manifest(i)) for i in range(n)]
    for _ in range(lag + 2):  # until every create is seen, and one pass more
        watch.tick()
        for job in jobs:
            meta = job["metadata"]
            reconcile(cluster.get_job(meta["namespace"], meta["name"]), cluster, NOW, observed=watch,
                      expectations=expectations)
    kinds = Counter(kind for kind, _ in cluster.writes)
    return kinds["already_exists"] / n, (kinds["create"] + kinds["already_exists"]) / n


def print_already_exists() -> None:
    print(f"creates answered 409 AlreadyExists per job start ({BURST_JOBS} jobs at once, watches {WATCH_LAG} "
          f"pass behind; target 0):")
    for expect in (True, False):
        already, sent = already_exists_per_start(BURST_JOBS, WATCH_LAG, expect)
        label = "with expectations" if expect else "without (before)"
        print(f"  {label:<20} AlreadyExists {already:g}, creates sent {sent:g}", flush=True)


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def index_memory(n: int) -> tuple[int, int]:
    """(resident bytes before, after) one process holds the kopf indexes of n jobs' children.

    Each child passes through the operator's own index function as a full
    body (pods with status, as a watch delivers them) and is then dropped,
    as the watch drops it; what stays is what the indexes keep.
    """
    from kopf._core.engines.indexing import OperatorIndexer  # the structure kopf keeps an index in

    from brain_operator import handlers
    from brain_operator.cluster.children import WATCHED

    template_job = parse_job({**manifest(0), "metadata": {"name": "job-00000", "namespace": "team-0", "uid": "u"}})
    template = render(template_job)
    gc.collect()
    before = resident_bytes()
    indexers = {index: OperatorIndexer() for _, _, _, index in WATCHED}
    by_kind = {(api_version, kind): index for api_version, kind, _, index in WATCHED}
    for i in range(n):
        name, namespace = f"job-{i:05d}", f"team-{i % 10}"
        for obj in template:
            if (obj["apiVersion"], obj["kind"]) not in by_kind:
                continue
            body = copy.deepcopy(obj)
            meta = body["metadata"]
            meta.update(namespace=namespace, uid=f"{i:08d}-{meta['name']}", resourceVersion=str(i),
                        creationTimestamp="2026-11-22T12:00:00Z", name=meta["name"].replace("job-00000", name))
            meta["labels"] = {**meta.get("labels", {}), "brain.ai/job-name": name}
            if body["kind"] == "Pod":
                body["status"] = {"phase": "Running", "podIP": "10.1.2.3", "hostIP": "10.0.0.1", "qosClass": "Guaranteed",
                                  "startTime": "2026-11-22T12:00:01Z",
                                  "conditions": [{"type": t, "status": "True", "lastTransitionTime": "2026-11-22T12:00:01Z"}
                                                 for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")],
                                  "containerStatuses": [{"name": "trainer", "ready": True, "restartCount": 0,
                                                         "image": "registry.example/brain-trainer:1",
                                                         "containerID": f"containerd://{i:064x}",
                                                         "state": {"running": {"startedAt": "2026-11-22T12:00:02Z"}}}]}
            value = handlers.index_child(namespace=namespace, labels=meta["labels"], body=body)
            indexers[by_kind[(body["apiVersion"], body["kind"])]].replace((namespace, meta["name"], meta["uid"]), value)
    gc.collect()
    return before, resident_bytes()


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


def print_calls(fleets: list[dict]) -> None:
    print("API calls per reconcile, by verb (children read from the watches' indexes):")
    for stage in ("create", "steady", "one pod changed"):
        per_job = Counter()
        for r in fleets:
            per_job.update({verb: count / r["jobs"] for verb, count in r["calls"][stage].items()})
        verbs = ", ".join(f"{verb} {count / len(fleets):g}" for verb, count in sorted(per_job.items()) if verb != "LIST")
        print(f"  {stage:<16} LIST {per_job['LIST'] / len(fleets):g}, {verbs}")


def print_memory(sizes: list[int]) -> None:
    print("operator resident memory holding every child of every job in its kopf indexes (fresh process each):")
    print(f"{'jobs':>7} {'pods':>8} {'baseline MiB':>13} {'total MiB':>10} {'indexes MiB':>12} {'KiB/job':>8}")
    for n in sizes:
        out = subprocess.run([sys.executable, __file__, "--index-memory", str(n)], check=True, capture_output=True,
                             text=True).stdout.split()
        before, after = int(out[0]), int(out[1])
        print(f"{n:>7} {n * NODES:>8} {before / 2**20:>13.0f} {after / 2**20:>10.0f} {(after - before) / 2**20:>12.0f} "
              f"{(after - before) / n / 1024:>8.1f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--index-memory", type=int, help=argparse.SUPPRESS)  # the memory probe's own process
    args = parser.parse_args()
    if args.index_memory:
        print(*index_memory(args.index_memory))
        return
    print(f"jobs of {NODES} nodes each, elastic backend, in-memory cluster client")
    split = stages(STAGE_JOBS)
    total = sum(split.values())
    print(f"one steady pass over {STAGE_JOBS} jobs, by stage:")
    for stage, seconds in split.items():
        print(f"  {stage:<26} {1e3 * seconds / STAGE_JOBS:6.3f} ms/job  {100 * seconds / total:5.1f}%")
    print(f"{'jobs':>7} {'objects':>8} {'jobs/s':>7} {'objects/s':>10} {'median ms/job':>14} "
          f"{'steady jobs/s':>14} {'median ms/job':>14}")
    base = None
    fleets = []
    for n in args.sizes:
        r = fleet(n)
        fleets.append(r)
        print(f"{r['jobs']:>7} {r['objects']:>8} {r['jobs'] / r['create_s']:>7.0f} "
              f"{r['objects'] / r['create_s']:>10.0f} {1e3 * r['create_median']:>14.2f} "
              f"{r['jobs'] / r['steady_s']:>14.0f} {1e3 * r['steady_median']:>14.2f}", flush=True)
        base = base or r
        if r is not base:
            ratio = r["create_median"] / base["create_median"]
            steady = r["steady_median"] / base["steady_median"]
            print(f"        cost per job at {r['jobs']} jobs / at {base['jobs']} jobs: create {ratio:.2f}, "
                  f"steady {steady:.2f} (1.00 = linear)", flush=True)

    print_calls(fleets)
    print_already_exists()
    print_memory(args.sizes)


if __name__ == "__main__":
    main()
