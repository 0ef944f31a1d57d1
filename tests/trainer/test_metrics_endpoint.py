"""Rank 0's metrics endpoint in isolation (the training-run test lives with the loop)."""

import json
import socket
import urllib.request

from brain_trainer.contract import Progress
from brain_trainer.metrics import MetricsServer, start_metrics_server


def fetch(port: int, path: str) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
        return resp.read()


def test_serves_progress_and_metrics(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    server = MetricsServer(0, host="127.0.0.1")
    try:
        assert json.loads(fetch(server.port, "/progress")) == {}
        server.publish(Progress(step=7, total_steps=20, loss=2.5, tokens_per_second=1000.0, last_checkpoint_step=5,
                                eval_loss=2.75),
                       step_time=0.25, learning_rate=1e-3)
        assert json.loads(fetch(server.port, "/progress"))["step"] == 7
        text = fetch(server.port, "/metrics").decode()
        for line in ("brain_trainer_step 7.0", "brain_trainer_loss 2.5", "brain_trainer_last_checkpoint_step 5.0", "brain_trainer_eval_loss 2.75",
                     "brain_trainer_step_time_seconds 0.25", "brain_trainer_learning_rate 0.001", "brain_trainer_restarts 2.0"):
            assert line in text.splitlines(), line
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
    assert start_metrics_server(0) is None
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        assert start_metrics_server(s.getsockname()[1]) is None
