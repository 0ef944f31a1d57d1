"""Issue 7, point 1: during a real 2-rank run, rank 0's /progress and /metrics follow training."""

import json
import os
import re
import signal
import time
import urllib.error
import urllib.request

import yaml
from processes import start, torchrun

from brain_trainer.parallel.launcher import held_port

LOG_LINE = re.compile(r"step (\d+)/\d+ loss ([\d.]+)")


def get(port: int, path: str) -> bytes | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.read()
    except (urllib.error.URLError, ConnectionError):
        return None  # not listening yet


def metric(text: str, name: str) -> float:
    return float(re.search(rf"^{name} (\S+)$", text, re.M)[1])


def test_progress_and_metrics_report_a_rising_step_and_the_logged_loss(tmp_path):
    cfg_path = tmp_path / "trainer.yaml"
    seen = []  # (progress document, /metrics text) pairs, in the order read
    # Held until rank 0's endpoint listens on it: nobody else takes it, and what answers there is our trainer.
    with held_port() as port:
        config = {
            "training": {"steps": 100000, "micro_batch_size": 2, "seq_len": 16, "log_interval": 1},
            "distributed": {"strategy": "ddp"},
            "checkpoint": {"dir": str(tmp_path / "checkpoints"), "enabled": False},
            "metrics": {"port": port},
        }
        cfg_path.write_text(yaml.safe_dump(config))
        with start(torchrun("-m", "brain_trainer", "--config", cfg_path), timeout=300,
                   env={**os.environ, "OMP_NUM_THREADS": "1"}) as child:
            deadline = time.monotonic() + 180
            # Poll the live endpoint until training has visibly moved on; the run would go on for hours.
            while len({doc["step"] for doc, _ in seen}) < 3:
                assert child.poll() is None, "the trainer exited early:\n" + child.output[-3000:]
                assert time.monotonic() < deadline, "no progress within 180 s"
                body, text = get(port, "/progress"), get(port, "/metrics")
                if body and text and json.loads(body):
                    seen.append((json.loads(body), text.decode()))
            child.send_signal(signal.SIGTERM)  # torchrun forwards it to the workers
            child.wait()
    output = child.output
    logged = {int(m[1]): float(m[2]) for m in LOG_LINE.finditer(output)}
    steps = [doc["step"] for doc, _ in seen]
    assert steps == sorted(steps) and len(set(steps)) >= 3
    for doc, text in seen:
        assert doc["total_steps"] == 100000
        assert round(doc["loss"], 4) == logged[doc["step"]], "the loss of the last logged step"
        step = int(metric(text, "brain_trainer_step"))
        assert step >= doc["step"] and round(metric(text, "brain_trainer_loss"), 4) == logged[step]
        assert metric(text, "brain_trainer_tokens_per_second") > 0
        assert metric(text, "brain_trainer_restarts") == 0
        assert metric(text, "brain_trainer_peak_memory_bytes") > 2**20  # a torch process holds far more than 1 MiB
        # Counters of what this process ran: one step per logging step here, 2 ranks x 2 sequences x 16 tokens each.
        assert metric(text, "brain_trainer_steps_total") == metric(text, "brain_trainer_step_time_seconds_count") == step
        assert metric(text, "brain_trainer_tokens_total") == step * 2 * 2 * 16
        assert metric(text, "brain_trainer_grad_norm") > 0
        assert re.search(r'^brain_trainer_info\{preset="minimal",strategy="ddp",version="[^"]+",world_size="2"\} 1.0$', text, re.M)
