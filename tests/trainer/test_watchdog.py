"""The hang watchdog thread (brain_trainer.resilience.watchdog) in real processes.

Each case runs a small program that steps a few times and then blocks its main
thread for good, as a rank stuck in a collective does: the watchdog must end
it with the stalled exit code, its stacks on stderr and `brain.ai/stalled: ...` as the
termination message.
"""

from __future__ import annotations

import sys
import textwrap

import processes
import pytest

from brain_trainer.contract import EXIT_CODES, STALLED

PROGRAM = textwrap.dedent(
    """
    import logging, sys, threading
    from brain_trainer.config import WatchdogConfig
    from brain_trainer.resilience.watchdog import Watchdog

    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(name)s %(message)s")
    watchdog = Watchdog(WatchdogConfig(enabled={enabled}, warmup_steps=1, floor_seconds=0.5, startup_seconds=600,
                                       checkpoint_seconds=1.0))

    def stuck_in_a_collective():
        threading.Event().wait({block})  # what a peer that never answers looks like from here

    for step in range(1, 4):
        watchdog.stepped(step)
    if {in_save}:
        with watchdog.checkpointing():
            stuck_in_a_collective()
    else:
        stuck_in_a_collective()
    watchdog.close()
    print("finished")
    """
)


def run(tmp_path, *, enabled=True, block="None", in_save=False) -> tuple[processes.Finished, str]:
    log = tmp_path / "termination-log"
    program = PROGRAM.format(enabled=enabled, block=block, in_save=in_save)
    env = {"BRAIN_TERMINATION_LOG": str(log), "PATH": ""}
    proc = processes.run([sys.executable, "-c", program], timeout=120, env=env)
    return proc, log.read_text() if log.exists() else ""


@pytest.mark.parametrize("in_save, what", [(False, "no optimizer step"), (True, "a checkpoint save did not finish")])
def test_a_blocked_rank_dumps_its_stacks_and_exits_stalled(tmp_path, in_save, what):
    proc, message = run(tmp_path, in_save=in_save)
    assert proc.returncode == EXIT_CODES[STALLED] == 82, proc.stderr
    limit = "1 s: checkpointSeconds" if in_save else "0 s: floorSeconds"
    assert f"brain_trainer.resilience.watchdog stalled: {what} for " in proc.stdout
    assert f"after step 3 (limit {limit}" in proc.stdout
    # Every thread's stack: the blocked main thread where it waits, and the watchdog's own.
    assert "most recent call first" in proc.stderr
    assert "in stuck_in_a_collective" in proc.stderr and "in _fire" in proc.stderr
    assert message.startswith(f"brain.ai/stalled: {what} for ") and "after step 3" in message
    assert "finished" not in proc.stdout


def test_a_process_that_gets_through_ends_normally(tmp_path):
    # Blocked for less than the startup limit... of a watchdog that is off; then one that is on, for less than its floor.
    proc, message = run(tmp_path, enabled=False, block="2.0")
    assert (proc.returncode, proc.stdout.strip(), message) == (0, "finished", "")
    proc, message = run(tmp_path, block="0.01")
    assert (proc.returncode, proc.stdout.strip(), message) == (0, "finished", "")
