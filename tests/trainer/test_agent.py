"""`python -m brain_trainer.agent`: torchrun's agent, which stops its workers on SIGTERM and then ends quietly."""

import os
import signal
import sys

from processes import run, start

AGENT = [sys.executable, "-m", "brain_trainer.agent", "--standalone", "--nproc-per-node", "1"]

WAITS = """
import signal
print("worker ready", flush=True)
signal.pause()
"""


def test_a_stopped_agent_stops_its_worker_and_exits_as_signalled_without_a_traceback(tmp_path):
    script = tmp_path / "waits.py"
    script.write_text(WAITS)
    with start([*AGENT, script], timeout=120) as agent:
        for line in agent.lines():
            if "worker ready" in line:  # the worker runs: the agent has its signal handlers
                agent.send_signal(signal.SIGTERM)
        code = agent.wait()
    assert code == 128 + signal.SIGTERM, agent.output
    # torchrun's own account of the stop stays; its SignalException traceback is gone.
    assert "Received 15 death signal, shutting down workers" in agent.output
    assert "Traceback" not in agent.output and "SignalException" not in agent.output


COMMITS = """
import signal, sys
from brain_trainer.resilience.failures import write_termination

def stop(*_):
    write_termination("preempted", "SIGTERM: step 3 committed, exiting to be restarted")
    sys.exit(75)

signal.signal(signal.SIGTERM, stop)
print("worker ready", flush=True)
signal.pause()
"""


def test_a_stop_whose_workers_committed_ends_the_agent_with_their_code(tmp_path):
    script = tmp_path / "commits.py"
    script.write_text(COMMITS)
    env = {**os.environ, "BRAIN_TERMINATION_LOG": str(tmp_path / "termination-log")}
    with start([*AGENT, script], timeout=120, env=env) as agent:
        for line in agent.lines():
            if "worker ready" in line:
                agent.send_signal(signal.SIGTERM)
        code = agent.wait()
    assert code == 75, agent.output
    assert "Traceback" not in agent.output and "SignalException" not in agent.output


def test_a_failed_worker_is_reported_by_torchrun_as_before(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text("raise SystemExit(3)\n")
    done = run([*AGENT, script], timeout=120)
    assert done.returncode == 1
    assert "ChildFailedError" in done.stderr and "exitcode  : 3" in done.stderr, done.stderr
