"""`braintrain logs` and `braintrain status` (issue 36, point 4) against the real kopf operator's view in kmock.

kmock serves the job and the pods the operator made; `LogEmulator` also serves each pod's log (the API server's
pods/log, `follow=true` a chunked stream until the container ends). A worker that fails is replaced by the
operator; the follower picks the new pod up by its uid.
"""

import asyncio
import re
import threading
import time
from dataclasses import dataclass, field

import aiohttp.web
import kubernetes
import pytest
from test_handlers import NS, first_event, pod_named
from test_operator_kmock import JOBS, PODS, FaultyEmulator, both_workers_running, operator, set_pod

from brain_operator.cli import main
from brain_operator.status.summary import summary_lines
from brain_operator.cluster.kube_context import current_cluster
from brain_operator.cluster.worker_logs import Logs, since_seconds

WITHIN_S = 30.0


@dataclass
class PodLog:
    """One container's log: its lines so far, and whether the container ended."""

    lines: list = field(default_factory=list)
    ended: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def add(self, *lines):
        self.lines.extend(lines)
        self.changed.set()

    def end(self):
        self.ended = True
        self.changed.set()


class LogEmulator(FaultyEmulator):
    def __attrs_post_init__(self):
        super().__attrs_post_init__()
        self.logs = {}  # pod name -> the PodLog of its current pod
        self.log_requests = []

    async def _handle(self, request):
        found = re.fullmatch(rf"{PODS}/([^/]+)/log", request.url.path)
        if found is None:
            return await super()._handle(request)
        self.log_requests.append(dict(request.params))
        log = self.logs.setdefault(found[1], PodLog())
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request._raw_request)
        sent = 0
        while True:
            while sent < len(log.lines):
                await response.write(f"{log.lines[sent]}\n".encode())
                sent += 1
            if request.params.get("follow", "").lower() != "true" or log.ended:  # the client sends True
                break
            log.changed.clear()
            if sent == len(log.lines) and not log.ended:
                await log.changed.wait()
        await response.write_eof()
        return response


async def until(predicate, what):
    """Polls `predicate` (a follower thread's output) until true."""
    deadline = time.monotonic() + WITHIN_S
    while not predicate():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


def run_cli(*argv):
    return asyncio.to_thread(main, list(argv))


async def logs_and_status_scenario(tmp_path, monkeypatch, capsys):
    async with operator(tmp_path, monkeypatch, emulator=LogEmulator) as (km, _):
        await both_workers_running(km)
        km.logs["demo-worker-0"] = PodLog(["rank 0: step 1", "rank 1: step 1"])
        km.logs["demo-worker-1"] = PodLog(["rank 2: step 1"])

        assert await run_cli("logs", "demo", "-n", NS) == 0
        assert capsys.readouterr().out.splitlines() == [
            "[demo-worker-0 node 0] rank 0: step 1", "[demo-worker-0 node 0] rank 1: step 1",
            "[demo-worker-1 node 1] rank 2: step 1"]
        assert await run_cli("logs", "demo", "-n", NS, "--rank", "1", "--since", "10m") == 0
        assert capsys.readouterr().out.splitlines() == ["[demo-worker-1 node 1] rank 2: step 1"]
        assert km.log_requests[-1]["sinceSeconds"] == "600" and km.log_requests[-1]["container"] == "trainer"

        lines, stop = [], threading.Event()
        core, custom, _ = await asyncio.to_thread(current_cluster, NS)
        follower = asyncio.create_task(asyncio.to_thread(Logs(core, custom, NS, "demo", lines.append, stop=stop).follow))
        await until(lambda: len(lines) == 3, f"the logs so far: {lines}")
        km.logs["demo-worker-0"].add("rank 0: step 2")
        await until(lambda: "[demo-worker-0 node 0] rank 0: step 2" in lines, f"a line as it comes: {lines}")

        # worker 1 fails: its container ends, the operator replaces the pod (same name, a new uid), which starts
        km.logs["demo-worker-1"].add("rank 2: out of memory")
        km.logs["demo-worker-1"].end()
        km.logs["demo-worker-1"] = PodLog(["rank 2: restored step 1"])
        await set_pod(km, "demo-worker-1", "Failed", exit_code=1)
        await first_event(km, JOBS, lambda o: (o.get("status") or {}).get("restarts") == 1)
        await first_event(km, PODS, pod_named("demo-worker-1"))
        await set_pod(km, "demo-worker-1", "Running", ready=True)
        await until(lambda: "[demo-worker-1 node 1] rank 2: restored step 1" in lines, f"the new pod: {lines}")
        stop.set()
        await follower
        assert lines.index("[demo-worker-1 node 1] rank 2: out of memory") < lines.index(
            "[demo-worker-1 node 1] rank 2: restored step 1")

        assert await run_cli("status", "demo", "-n", NS) == 0
        return capsys.readouterr().out.splitlines()


def test_logs_follow_every_worker_and_the_pod_that_replaces_one_and_status_says_why(tmp_path, monkeypatch, capsys):
    status = asyncio.run(logs_and_status_scenario(tmp_path, monkeypatch, capsys))
    assert re.fullmatch(rf"demo \({NS}\): (Running|Restarting|Pending), nodes \d/2, backend elastic.*", status[0])
    assert any(line.startswith("restarts: 1 (in pod: 0)") for line in status), status
    assert "conditions:" in status


def test_no_cluster_is_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(tmp_path / "none"))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    for command in (["logs", "demo", "--follow"], ["status", "demo"]):
        assert main(command) == 1
        err = capsys.readouterr().err
        assert err.startswith("braintrain: no cluster: ") and err.count("\n") == 1, err


def test_since_is_read_as_kubectl_spells_it():
    assert [since_seconds(t) for t in ("30s", "10m", "1h30m")] == [30, 600, 5400]
    with pytest.raises(ValueError, match="--since: must be a duration"):
        since_seconds("ten minutes")


def test_status_names_the_incident_the_last_checkpoint_and_why_workers_wait():
    job = {"metadata": {"name": "llama", "namespace": "ml"}, "spec": {"backend": "pytorchjob"}, "status": {
        "phase": "Restarting", "nodes": "1/2", "restarts": 2, "inPodRestarts": 1, "reason": "out-of-memory",
        "strategy": "fsdp",
        "progress": {"step": 40, "totalSteps": 100, "loss": 2.5, "tokensPerSecond": 1200.0, "etaSeconds": 3725.0},
        "incident": {"reason": "out-of-memory", "pod": "llama-worker-1", "since": "2026-11-29T04:00:00Z", "step": 40},
        "lastCheckpoint": {"step": 40, "path": "/checkpoints/step-00000040"},
        "goodput": {"ratio": 0.9, "wallSeconds": 100.0},
        "conditions": [{"type": "WorkersReady", "status": "False", "reason": "Unschedulable",
                        "message": "llama-worker-1: 0/3 nodes are available"}]}}
    assert summary_lines(job) == [
        "llama (ml): Restarting, nodes 1/2, backend pytorchjob, strategy fsdp",
        "progress: step 40/100, loss 2.5000, tokens/s 1200, ETA 1h02m",
        "restarts: 2 (in pod: 1), reason out-of-memory",
        "incident: out-of-memory on llama-worker-1 since 2026-11-29T04:00:00Z at step 40",
        "waiting: Unschedulable llama-worker-1: 0/3 nodes are available",
        "last checkpoint: step 40 at /checkpoints/step-00000040",
        "goodput: 90.0% of 100 s",
        "conditions:",
        "  WorkersReady=False Unschedulable llama-worker-1: 0/3 nodes are available",
    ]
