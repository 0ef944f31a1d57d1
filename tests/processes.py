"""Child processes of the tests: a deadline for each, output drained while it runs, and nothing of it left
behind.

    done = run([sys.executable, "-c", code], timeout=60)       # Finished: returncode, stdout, stderr
    with start(torchrun("-m", "brain_trainer", ...), timeout=300) as child:
        for line in child.lines(): ...                          # stdout and stderr together, as they come
        code = child.wait()
    child.output                                                # everything it wrote

A child that outlives its deadline is killed and TimeoutError raised (with the
end of its output). Whatever is left of a child when `run` returns or the
`with` block ends is killed too, its whole tree: its process group (each child
leads a session of its own), and every process that carries the child's marker
in its environment, which descendants inherit. torchrun starts its workers in
sessions of their own, so its group alone would miss them, and a worker left
running keeps the output pipe open: a read would never end.

A thread per pipe reads the child's output from the start, so a child that
writes more than a pipe holds never blocks on a test that is busy polling or
waiting.

`torchrun(...)`: a one-node torchrun whose rendezvous is its own (`--standalone`:
a c10d store that the agent binds on port 0, and a fresh uuid as rendezvous id),
so two runs never choose the same port nor join each other's rendezvous. With
TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 the workers' own store still gets its port
from torch's agent, chosen free and bound later by rank 0: torch's race, not
ours; leave the store shared unless the test needs it off.
"""

from __future__ import annotations

import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterator, Mapping, Optional, Sequence, Union

__all__ = ["Child", "Finished", "alive", "run", "start", "torchrun"]

TORCHRUN = str(Path(sys.executable).parent / "torchrun")
MARKER = "TEST_PROCESS_TREE"
# How much of the output a TimeoutError shows.
TAIL_CHARS = 4000

Arg = Union[str, os.PathLike]


@dataclass(frozen=True)
class Finished:
    returncode: int
    stdout: str
    stderr: str  # "" when stderr went to stdout


def torchrun(*args: Arg, nproc: int = 2) -> list[str]:
    return [TORCHRUN, "--standalone", "--nproc-per-node", str(nproc), *map(str, args)]


def alive(pid: int) -> bool:
    """Whether `pid` is a process that has not ended (a zombie has ended; a stopped one has not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _carries(pid: str, marker: bytes) -> bool:
    """Whether process `pid` is running with `marker` in its environment (a zombie's reads as empty)."""
    try:
        return marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:  # gone, or not ours
        return False


def _kill_marked(marker: bytes) -> None:
    """SIGKILL every process that carries `marker`, and return once each has ended."""
    while True:  # until none is left: one may have started another between the scan and its kill
        doomed = []
        for pid in (entry.name for entry in Path("/proc").iterdir() if entry.name.isdigit()):
            if not _carries(pid, marker):
                continue
            try:
                handle = os.pidfd_open(int(pid))
            except ProcessLookupError:
                continue
            # Looked at again through the handle: the pid is that process's, not a stranger's that reused it.
            if _carries(pid, marker):
                signal.pidfd_send_signal(handle, signal.SIGKILL)
                doomed.append(handle)
            else:
                os.close(handle)
        if not doomed:
            return
        for handle in doomed:
            # Readable once the process has ended: a killed process stops showing its environment before that.
            select.select([handle], [], [])
            os.close(handle)


class Child:
    """One child process and its descendants; see the module's docstring."""

    def __init__(self, argv: Sequence[Arg], *, timeout: float, merge_stderr: bool = True,
                 env: Optional[Mapping[str, str]] = None, cwd: Optional[Arg] = None):
        self.argv = [str(a) for a in argv]
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        tree = uuid.uuid4().hex
        self.marker = f"{MARKER}={tree}".encode()
        self.proc = subprocess.Popen(
            self.argv, env={**(os.environ if env is None else env), MARKER: tree}, cwd=cwd, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE, text=True,
            errors="replace", start_new_session=True,
        )
        self.pid = self.proc.pid
        self._stdout: list[str] = []
        self._stderr: list[str] = []
        self._lines: queue.Queue[Optional[str]] = queue.Queue()  # stdout's lines, then None at its end
        self._readers = [threading.Thread(target=self._read, args=(self.proc.stdout, self._stdout, self._lines),
                                          daemon=True)]
        if not merge_stderr:
            self._readers.append(threading.Thread(target=self._read, args=(self.proc.stderr, self._stderr, None),
                                                  daemon=True))
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(pipe: IO[str], into: list[str], lines: Optional[queue.Queue]) -> None:
        for line in pipe:
            into.append(line)
            if lines is not None:
                lines.put(line)
        if lines is not None:
            lines.put(None)

    @property
    def output(self) -> str:
        """What the child wrote to stdout so far (stderr too, unless kept apart)."""
        return "".join(self._stdout)

    def _left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def _expired(self) -> TimeoutError:
        self.kill()
        return TimeoutError(f"{' '.join(self.argv)} did not finish within {self.timeout:.0f} s; its output ends:\n"
                            f"{self.output[-TAIL_CHARS:]}")

    def lines(self) -> Iterator[str]:
        """stdout's lines (newline kept) as the child writes them, until its output ends."""
        while True:
            try:
                line = self._lines.get(timeout=self._left())
            except queue.Empty:
                raise self._expired() from None
            if line is None:
                self._lines.put(None)  # for a later call
                return
            yield line

    def poll(self) -> Optional[int]:
        return self.proc.poll()

    def send_signal(self, signum: int) -> None:
        """To the child itself (torchrun passes SIGTERM on to its workers)."""
        self.proc.send_signal(signum)

    def wait(self) -> int:
        """The child's exit code, once it exited and its output ended (every writer closed it)."""
        for reader in self._readers:
            reader.join(self._left())
            if reader.is_alive():
                raise self._expired()
        try:
            return self.proc.wait(self._left())
        except subprocess.TimeoutExpired:
            raise self._expired() from None

    def finish(self) -> Finished:
        code = self.wait()
        return Finished(code, self.output, "".join(self._stderr))

    def kill(self) -> None:
        """SIGKILL the child's whole tree (a no-op once everything ended), then collect its output's end."""
        if self.proc.poll() is None:  # not reaped: its pid is still its group's, not a stranger's
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:  # the group ended meanwhile
                pass
        _kill_marked(self.marker)
        self.proc.wait()
        for reader in self._readers:
            reader.join()

    def __enter__(self) -> "Child":
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


def start(argv: Sequence[Arg], *, timeout: float, env: Optional[Mapping[str, str]] = None,
          cwd: Optional[Arg] = None) -> Child:
    """A child with stdout and stderr merged; use it in a `with` block."""
    return Child(argv, timeout=timeout, env=env, cwd=cwd)


def run(argv: Sequence[Arg], *, timeout: float, env: Optional[Mapping[str, str]] = None,
        cwd: Optional[Arg] = None) -> Finished:
    """Run `argv` to its end, within `timeout` seconds; stdout and stderr kept apart."""
    with Child(argv, timeout=timeout, merge_stderr=False, env=env, cwd=cwd) as child:
        return child.finish()
