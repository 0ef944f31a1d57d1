"""tests/processes.py: a child's whole tree dies with it, and a chatty child never blocks on its pipe."""

from __future__ import annotations

import sys

import pytest
from processes import alive, run, start

# A child that starts a grandchild in a session of its own (as torchrun starts its workers), which inherits the
# output pipe; both print their pid, then wait forever.
TREE = """
import os, signal, subprocess, sys
grandchild = subprocess.Popen([sys.executable, "-c", "import os, signal; print(os.getpid(), flush=True); signal.pause()"],
                              start_new_session=True)
print(os.getpid(), flush=True)
signal.pause()
"""
# More than a pipe holds (64 KiB on Linux), on both pipes, stderr first.
CHATTY = """
import sys
sys.stderr.write("e" * 2**20)
sys.stdout.write("o" * 2**20)
"""


def pids(child) -> set[int]:
    lines = child.lines()
    return {int(next(lines)), int(next(lines))}


def test_a_child_past_its_deadline_dies_with_the_grandchild_it_started_in_another_session():
    with start([sys.executable, "-c", TREE], timeout=10) as child:
        tree = pids(child)
        with pytest.raises(TimeoutError, match=r"did not finish within 10 s"):
            child.wait()
        assert child.pid in tree and not any(alive(pid) for pid in tree)


def test_leaving_the_block_early_ends_the_whole_tree():
    with start([sys.executable, "-c", TREE], timeout=60) as child:
        tree = pids(child)
    assert not any(alive(pid) for pid in tree)


def test_a_child_that_writes_more_than_a_pipe_holds_finishes():
    done = run([sys.executable, "-c", CHATTY], timeout=60)
    assert (done.returncode, len(done.stdout), len(done.stderr)) == (0, 2**20, 2**20)
    with start([sys.executable, "-c", CHATTY], timeout=60) as child:
        assert child.wait() == 0  # waiting, not reading: the pipe is drained all the same
    assert len(child.output) == 2 * 2**20
