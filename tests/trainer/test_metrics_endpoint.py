"""Rank 0's metrics endpoint in isolation (the training-run test lives with the loop)."""

import json
import socket
import urllib.request
from pathlib import Path

import pytest
from brain_trainer.config import TrainerConfig
from brain_trainer.contract import Goodput, Progress
from brain_trainer.observe.metrics import MetricsServer, start_metrics_server


def fetch(port: int, path: str) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
        return resp.read()


def test_serves_progress_and_metrics(monkeypatch):
    # Not torchrun's count of rank 0's own agent: the run's restarts, from the progress document.
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    server = MetricsServer(0, host="127.0.0.1")
    try:
        assert json.loads(fetch(server.port, "/progress")) == {}
        server.describe(version="1.2.3", preset="minimal", strategy="ddp", world_size="2")
        server.publish(Progress(step=7, total_steps=20, loss=2.5, tokens_per_second=1000.0, last_checkpoint_step=5,
                                restarts=2),
                       step_times=[0.25, 0.75, 3.0], tokens=3 * 512, learning_rate=1e-3, grad_norm=0.5, mfu=None)
        assert json.loads(fetch(server.port, "/progress"))["step"] == 7
        lines = fetch(server.port, "/metrics").decode().splitlines()
        for line in ("brain_trainer_step 7.0", "brain_trainer_loss 2.5", "brain_trainer_last_checkpoint_step 5.0",
                     "brain_trainer_learning_rate 0.001", "brain_trainer_grad_norm 0.5", "brain_trainer_restarts 2.0",
                     "brain_trainer_steps_total 3.0", "brain_trainer_tokens_total 1536.0",
                     'brain_trainer_step_time_seconds_bucket{le="0.25"} 1.0',
                     'brain_trainer_step_time_seconds_bucket{le="1.0"} 2.0',
                     'brain_trainer_step_time_seconds_bucket{le="+Inf"} 3.0', "brain_trainer_step_time_seconds_sum 4.0",
                     'brain_trainer_info{preset="minimal",strategy="ddp",version="1.2.3",world_size="2"} 1.0'):
            assert line in lines, line
        # Counters add up over publications; an unknown MFU (CPU) is no sample at all rather than a 0.
        assert not any(line.startswith("brain_trainer_mfu") for line in lines)
        server.publish(Progress(step=8), step_times=[0.5], tokens=512, mfu=0.41)
        lines = fetch(server.port, "/metrics").decode().splitlines()
        for line in ("brain_trainer_steps_total 4.0", "brain_trainer_tokens_total 2048.0", "brain_trainer_mfu 0.41",
                     "brain_trainer_grad_norm 0.5"):
            assert line in lines, line
    finally:
        server.close()


def test_goodput_is_a_ratio_and_counters_of_the_jobs_seconds_by_kind():
    server = MetricsServer(0, host="127.0.0.1")
    try:
        # A restarted trainer publishes the job's totals first: the counters start there.
        server.publish(Progress(step=5, goodput=Goodput(ratio=0.5, wall_seconds=40.0, productive_seconds=20.0,
                                                        recomputed_seconds=4.0, waiting_seconds=16.0)))
        server.publish(Progress(step=6, goodput=Goodput(ratio=0.55, wall_seconds=42.0, productive_seconds=23.1,
                                                        recomputed_seconds=4.0, waiting_seconds=16.0)))
        lines = fetch(server.port, "/metrics").decode().splitlines()
        for line in ("brain_trainer_goodput_ratio 0.55", 'brain_trainer_goodput_seconds_total{kind="productive"} 23.1',
                     'brain_trainer_goodput_seconds_total{kind="recomputed"} 4.0',
                     'brain_trainer_goodput_seconds_total{kind="checkpoint"} 0.0'):
            assert line in lines, line
        assert not any("wall" in line for line in lines if line.startswith("brain_trainer_goodput_seconds"))
    finally:
        server.close()


def test_in_pod_restarts_are_a_counter_that_starts_at_the_runs_total():
    server = MetricsServer(0, host="127.0.0.1")
    try:
        server.publish(Progress(step=5, restarts=2, in_pod_restarts=2, last_in_pod_restart="error: RuntimeError: boom"))
        server.publish(Progress(step=6, restarts=3, in_pod_restarts=3))
        server.publish(Progress(step=7, restarts=3, in_pod_restarts=3))
        lines = fetch(server.port, "/metrics").decode().splitlines()
        assert "brain_trainer_in_pod_restarts_total 3.0" in lines and "brain_trainer_restarts 3.0" in lines
        assert not any(line.startswith("brain_trainer_in_pod_restarts ") for line in lines)  # no gauge beside it
        assert json.loads(fetch(server.port, "/progress"))["in_pod_restarts"] == 3
    finally:
        server.close()


def test_serves_every_ranks_memory_after_init():
    server = MetricsServer(0, host="127.0.0.1")
    try:
        server.publish_init_memory([
            {"rank": 0, "parameter_bytes": 1000, "peak_host_bytes": 5000, "device_bytes": None},
            {"rank": 1, "parameter_bytes": 900, "peak_host_bytes": 4000, "device_bytes": None},
        ])
        lines = fetch(server.port, "/metrics").decode().splitlines()
        for line in ('brain_trainer_init_parameter_bytes{rank="0"} 1000.0', 'brain_trainer_init_parameter_bytes{rank="1"} 900.0',
                     'brain_trainer_init_peak_host_bytes{rank="1"} 4000.0'):
            assert line in lines, line
        assert not any(line.startswith("brain_trainer_init_device_bytes{") for line in lines)  # none on CPU
    finally:
        server.close()


def test_taken_or_disabled_port_never_stops_training():
    assert start_metrics_server(0, "127.0.0.1") is None
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        assert start_metrics_server(s.getsockname()[1], "0.0.0.0") is None


def _listening(port):
    """The local addresses listening on TCP `port`, from the kernel's own table (/proc/net/tcp: hex, little-endian)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if int(hex_port, 16) == port and state == "0A":  # TCP_LISTEN
            found.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
    return found


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's socket table")
def test_the_endpoint_listens_only_on_the_address_it_is_given():
    # braintrain run's trainer.yaml says 127.0.0.1 (test_local_plan.py); the default is loopback too.
    default = TrainerConfig().metrics.bind_address
    for host, want in ((default, {"127.0.0.1"}), ("0.0.0.0", {"0.0.0.0"})):
        server = MetricsServer(0, host)
        try:
            assert _listening(server.port) == want, host
        finally:
            server.close()


def test_each_committed_checkpoint_is_timed_and_sized(tmp_path):
    """The manager tells each commit (a real save by `train`); the endpoint counts its time and size."""
    from brain_trainer.loop.train import train
    from brain_trainer.observe import commits

    seen: list[commits.Commit] = []
    stop = commits.listen(seen.append)
    try:
        train(TrainerConfig.from_dict({
            "model": {"preset": "minimal"}, "distributed": {"strategy": "single"},
            "training": {"steps": 2, "micro_batch_size": 2, "seq_len": 16, "warmup_steps": 0},
            "data": {"source": "synthetic", "num_samples": 64},
            "checkpoint": {"dir": str(tmp_path), "interval_steps": 1}, "metrics": {"port": 0}}))
    finally:
        stop()
    assert [c.step for c in seen] == [1, 2]
    for commit in seen:
        manifest = json.loads((tmp_path / f"step-{commit.step:08d}" / "manifest.json").read_text())
        assert commit.bytes == sum(f["size"] for f in manifest["files"].values()) > 0 and commit.seconds > 0
    server = MetricsServer(0, host="127.0.0.1")
    try:
        commits.committed(commits.Commit(step=3, bytes=2048, seconds=1.5))
        lines = fetch(server.port, "/metrics").decode().splitlines()
    finally:
        server.close()
    for line in ("brain_trainer_checkpoint_bytes 2048.0", "brain_trainer_checkpoint_save_seconds_count 1.0",
                 'brain_trainer_checkpoint_save_seconds_bucket{le="2.5"} 1.0'):
        assert line in lines, line
    commits.committed(commits.Commit(step=4, bytes=1, seconds=1.0))  # a closed endpoint no longer listens
