"""`braintrain run`: a BrainTrainingJob's worker pods as local processes.

The thin shell over `local_plan`: parse (no image needed) -> render the
elastic backend -> plan -> start one torchrun agent per worker pod, each in
its own session like a container, so a dead agent takes its trainer
processes with it and a terminal's Ctrl-C reaches only the runner. A failed
worker pod restarts the whole group from the newest committed checkpoint,
within `runPolicy.backoffLimit`, as the operator recreates failed pods; a
preemption (exit PREEMPTED) does not count. Ctrl-C or SIGTERM is passed on
as SIGTERM: the trainers commit a checkpoint and exit.
"""

from __future__ import annotations

import importlib.util
import os
import queue
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, TextIO

from brain_trainer.exitcodes import PREEMPTED

from .display import Display, RunSummary, make_display, read_progress, summary_lines
from .local_plan import LocalPlan, LocalRunError, localize_manifest, plan_local, process_env
from .render import render_elastic
from .spec import parse_job

if TYPE_CHECKING:
    from brain_trainer.checkpoint.store import Candidate

__all__ = ["free_port", "newest_committed", "planner", "run_job"]

# How often the runner looks at its processes and the progress document.
POLL_SECONDS = 0.2
# How long the trainers get to commit a checkpoint after SIGTERM before the
# runner kills them (torchrun gives its workers 30 s).
STOP_GRACE_SECONDS = 60.0

Lines = "queue.Queue[tuple[str, str]]"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def planner(manifest: Mapping[str, Any], *, base_dir: Path, workdir: Optional[Path]) -> Callable[[int], LocalPlan]:
    """Validate the manifest (ConfigError names the field) and return plan(rdzv_port)."""
    job = parse_job(
        localize_manifest(manifest, base_dir=base_dir, stdlib=Path(sysconfig.get_paths()["stdlib"])),
        require_image=False,
    )
    objects = render_elastic(job)
    folder = (workdir or Path("runs") / job.name).resolve()
    return lambda port: plan_local(
        objects,
        workdir=folder,
        rdzv_port=port,
        metrics_port=free_port(),
        python=sys.executable,
        backoff_limit=job.spec.run_policy.backoff_limit,
        cpu_count=os.cpu_count() or 1,
    )


class _Group:
    """One attempt: a torchrun agent per worker pod, each its own session (like a container)."""

    def __init__(self, plan: LocalPlan, lines: Lines):
        self.names = [w.name for w in plan.workers]
        self.procs: list[subprocess.Popen] = []
        self.readers: list[threading.Thread] = []
        for worker in plan.workers:
            for folder in worker.scratch_dirs:
                folder.mkdir(parents=True, exist_ok=True)
            proc = subprocess.Popen(
                worker.argv,
                env=process_env(os.environ, worker),
                cwd=plan.workdir,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                bufsize=1,
                start_new_session=True,
            )
            reader = threading.Thread(target=_pump, args=(worker.name, proc, lines), daemon=True)
            reader.start()
            self.procs.append(proc)
            self.readers.append(reader)

    def codes(self) -> list[Optional[int]]:
        return [p.poll() for p in self.procs]

    def terminate(self) -> None:
        """SIGTERM to each agent, as the kubelet signals a container's first process."""
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL whatever is left of every pod, agents and trainers alike."""
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p, reader in zip(self.procs, self.readers):
            p.wait()
            reader.join()


def _pump(name: str, proc: subprocess.Popen, lines: Lines) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.put((name, line.rstrip("\n")))


class _Runner:
    def __init__(self, plan_for: Callable[[int], LocalPlan], plan: LocalPlan, display: Display):
        self.plan_for = plan_for
        self.plan = plan
        self.display = display
        self.lines: Lines = queue.Queue()
        self.stop_signal: Optional[int] = None
        self.wake = threading.Event()
        # The first loss this run saw, so the summary shows that it fell.
        self.first_loss: Optional[float] = None

    def request_stop(self, signum: int, _frame: object = None) -> None:
        if self.stop_signal is not None:
            raise KeyboardInterrupt  # asked twice: do not wait for the checkpoint
        self.stop_signal = signum
        self.wake.set()

    def _refresh(self) -> None:
        while not self.lines.empty():
            self.display.log(*self.lines.get_nowait())
        doc = read_progress(self.plan.progress_file)
        if doc and self.first_loss is None:
            self.first_loss = doc.get("loss")
        self.display.update(doc)

    def _attempt(self, plan: LocalPlan) -> list[Optional[int]]:
        """Run one group until every agent exited, one failed, or a stop finished."""
        group = _Group(plan, self.lines)
        stopping_since: Optional[float] = None
        try:
            while True:
                self._refresh()
                codes = group.codes()
                if self.stop_signal is not None and stopping_since is None:
                    stopping_since = time.monotonic()
                    self.display.note("stopping: the trainers commit a checkpoint first")
                    group.terminate()
                if all(c is not None for c in codes):
                    return codes
                if stopping_since is None and any(c not in (None, 0) for c in codes):
                    return codes
                if stopping_since is not None and time.monotonic() - stopping_since > STOP_GRACE_SECONDS:
                    return codes
                self.wake.wait(POLL_SECONDS)
        finally:
            group.kill()
            self._refresh()

    def run(self) -> tuple[str, int, str]:
        """Attempts until success, a stop, or the spent budget: (status, restarts, message)."""
        restarts = failures = 0
        plan = self.plan
        while True:
            codes = self._attempt(plan)
            if self.stop_signal is not None:
                return "Stopped", restarts, f"{signal.Signals(self.stop_signal).name}; rerun to continue"
            failed = [(w.name, c) for w, c in zip(plan.workers, codes) if c not in (None, 0)]
            if not failed:
                return "Succeeded", restarts, ""
            name, code = failed[0]
            failures += code != PREEMPTED
            if failures > plan.backoff_limit:
                return "Failed", restarts, f"{name} exited with {code}; backoffLimit {plan.backoff_limit} spent"
            restarts += 1
            self.display.note(f"{name} exited with {code}: restarting all workers from the newest checkpoint")
            # A fresh rendezvous port: the old store's port may still be held.
            plan = self.plan_for(free_port())


def newest_committed(root: Path) -> Optional["Candidate"]:
    """The newest checkpoint with a manifest (what the trainer resumes from)."""
    # Imported here: the brain_trainer.checkpoint package imports torch, which
    # a bad manifest should not wait for.
    from brain_trainer.checkpoint.store import list_checkpoints

    return next((c for c in list_checkpoints(root) if c.manifest is not None), None)


def _prepare(plan: LocalPlan) -> None:
    for folder in plan.dirs:
        folder.mkdir(parents=True, exist_ok=True)
    for path, text in plan.files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    # A document from an earlier run would show stale progress.
    plan.progress_file.unlink(missing_ok=True)


def run_job(
    manifest: Mapping[str, Any], *, base_dir: Path, workdir: Optional[Path] = None, stream: TextIO = sys.stdout
) -> int:
    """Run the job's workers locally; the exit code is 0 only when it succeeded."""
    plan_for = planner(manifest, base_dir=base_dir, workdir=workdir)
    plan = plan_for(free_port())
    if importlib.util.find_spec("torch") is None:
        raise LocalRunError("braintrain run needs torch here: pip install 'brain-train[trainer]'")
    done = newest_committed(plan.checkpoint_dir)
    if done is not None and done.step >= plan.total_steps:
        print(
            f"braintrain: {plan.job_name} is already complete: {done.path} holds step {done.step} "
            f"of {plan.total_steps}; raise spec.training.steps to train further",
            file=stream,
        )
        return 0
    _prepare(plan)
    display = make_display(stream, job_name=plan.job_name, total_steps=plan.total_steps)
    if done is not None:
        display.note(f"resuming {plan.job_name} from {done.path} (step {done.step} of {plan.total_steps})")
    runner = _Runner(plan_for, plan, display)
    started = time.monotonic()
    previous = {sig: signal.signal(sig, runner.request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        status, restarts, message = runner.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        display.close()
    doc = read_progress(plan.progress_file) or {}
    last = newest_committed(plan.checkpoint_dir)
    summary = RunSummary(
        status=status,
        step=max(last.step if last else 0, doc.get("step") or 0),
        total_steps=plan.total_steps,
        loss=doc.get("loss"),
        first_loss=runner.first_loss,
        tokens_per_second=doc.get("tokens_per_second"),
        wall_seconds=time.monotonic() - started,
        checkpoint=str(last.path) if last else None,
        restarts=restarts,
        message=message,
    )
    print("\n".join(summary_lines(summary)), file=stream, flush=True)
    if status == "Succeeded":
        return 0
    return 128 + runner.stop_signal if runner.stop_signal is not None else 1
