"""The suite's guard against a test deadlocked in C code while holding the GIL: pytest-timeout's SIGALRM handler
never runs there, so the suite's settings (pyproject.toml) also arm faulthandler's watchdog, which prints every
thread's stack and ends the run. Checked with the suite's own settings, the two deadlines scaled down to seconds."""

import sys
import tomllib
from pathlib import Path

from processes import run

REPO = Path(__file__).resolve().parents[1]
# A C call that blocks forever with the GIL held (ctypes.PyDLL keeps it): a non-recursive mutex locked twice.
DEADLOCK = """
import ctypes

def test_deadlocked_in_c_with_the_gil_held():
    libc = ctypes.PyDLL(None)
    mutex = ctypes.create_string_buffer(64)
    libc.pthread_mutex_init(mutex, None)
    libc.pthread_mutex_lock(mutex)
    libc.pthread_mutex_lock(mutex)
"""


def test_a_test_deadlocked_with_the_gil_held_ends_the_run_with_every_stack(tmp_path):
    settings = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert settings["faulthandler_exit_on_timeout"] is True
    assert settings["faulthandler_timeout"] > settings["timeout"], "pytest-timeout answers first where it can"
    (tmp_path / "test_stuck.py").write_text(DEADLOCK)
    done = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(REPO / "pyproject.toml"),
                "--rootdir", str(tmp_path), "-o", "timeout=1", "-o", "faulthandler_timeout=3", str(tmp_path)],
               timeout=60, cwd=tmp_path)
    assert done.returncode != 0
    assert "Timeout (0:00:03)!" in done.stderr and "test_deadlocked_in_c_with_the_gil_held" in done.stderr, done.stderr
