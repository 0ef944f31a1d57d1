"""`braintrain run`: a BrainTrainingJob's worker pods as local processes.

The thin shell over `plan`: parse (no image needed) -> the elastic
backend's worker plan -> local plan -> start one torchrun agent per worker pod, each in
its own session like a container, so a terminal's Ctrl-C reaches only the
runner. A failed worker pod ends the others as Kubernetes deletes pods
(SIGTERM, a grace period, SIGKILL) and the whole group restarts from the
newest committed checkpoint, as the operator recreates failed pods: the
trainers' termination messages name the reason, and
`runPolicy.failurePolicy` says whether it restarts (counted against
`runPolicy.backoffLimit` or not) or fails the run at once; the summary names
the reason. Ctrl-C or SIGTERM is passed on the same way: the trainers commit a
checkpoint and exit. On Linux the runner adopts the trainers of an agent
that died abruptly (torchrun starts them in sessions of their own) and ends
them with their pod, so nothing outlives it.

Checkpoints in an object store (`spec.checkpoint.uri`) are read as the
trainers read them (brain_trainer.checkpoint.location), with the user's own
endpoint and credentials: the runner names the step it resumes from, the
summary the newest committed one, as for a folder.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import importlib.util
import os
import queue
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any, Callable, Iterator, Mapping, Optional, TextIO

from brain_trainer.checkpoint import bucket, location, resume_from
from brain_trainer.checkpoint.store import Candidate
from brain_trainer.contract import (
    CHECKPOINT_REQUEST_FILE,
    CONFIG_FILE,
    ERROR,
    PROFILE_REQUEST_FILE,
    PROGRESS_FILE_ENV,
    Progress,
    cause_rank,
    format_time,
    parse_termination,
)
from brain_trainer.parallel.launcher import held_port

from .display import Display, RunSummary, make_display, read_progress, summary_lines
from ..status.failure_policy import WorkerFailure, consequence
from .plan import (
    CLAIMS_DIR,
    LocalPlan,
    LocalRunError,
    LocalWorker,
    cluster_only,
    localize,
    missing_claim,
    not_started,
    plan_local,
    process_env,
    request_file,
)
from ..backends.shared.workers import run_id
from ..spec import OperatorDefaults, parse_job
from ..spec.model import FAIL_JOB, RESTART
from ..status.stalled import quiet
from ..sizing.storage import check_storage, local_shortfall
from .dataset import job_vocabulary

__all__ = ["newest_committed", "planner", "request_checkpoint", "request_profile", "run_job", "running_here"]

# How often the runner looks at its processes and the progress document.
POLL_SECONDS = 0.2
# The progress document's time has whole seconds.
STALL_SLACK_SECONDS = 1.0
# The work directory's folder of the attempts' rendezvous files (plan.py's docstring).
RENDEZVOUS_DIR = "rendezvous"
# In the work directory: locked by the runner while its run lives (flock: the kernel releases it however the runner
# ends); its text says how the run ended, or, while it runs, what to say should the runner die without a summary.
RUN_STATE_FILE = "run-state"
# prctl(2) option: orphaned descendants are re-parented to this process.
PR_SET_CHILD_SUBREAPER = 36

Lines = "queue.Queue[tuple[str, str]]"


def planner(
    manifest: Mapping[str, Any],
    *,
    base_dir: Path,
    workdir: Optional[Path],
    metrics_port: int,
    claims: Optional[Path] = None,
    defaults: Optional[OperatorDefaults] = None,
) -> Callable[[], LocalPlan]:
    """Validate the manifest (ConfigError names the field; `defaults` as for `braintrain validate`) and return
    plan(): each call the plan of a new attempt, with a rendezvous file of its own (a file named after no earlier
    attempt, even a crashed runner's)."""
    job = localize(
        parse_job(manifest, require_image=False, defaults=defaults), base_dir=base_dir, stdlib=Path(sysconfig.get_paths()["stdlib"])
    )
    folder = (workdir or Path("runs") / job.name).resolve()
    claims_folder = (claims or CLAIMS_DIR).resolve()
    return lambda: plan_local(
        job,
        workdir=folder,
        claims=claims_folder,
        rendezvous=folder / RENDEZVOUS_DIR / uuid.uuid4().hex,
        metrics_port=metrics_port,
        python=sys.executable,
        cpu_count=os.cpu_count() or 1,
    )


def become_subreaper() -> bool:
    """On Linux, adopt orphaned descendants (PR_SET_CHILD_SUBREAPER), as a container's init does.

    torchrun starts each trainer in its own session, so a torchrun agent that
    dies abruptly leaves its trainers behind; adopted, the runner can end them.
    """
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def _adopted(agents: set[int], marker: bytes) -> list[int]:
    """Children of this process, other than the agents, whose environment carries `marker`:
    the trainers of this job orphaned by a dead agent."""
    found = []
    for task in Path("/proc/self/task").iterdir():
        try:
            found += [int(pid) for pid in (task / "children").read_text().split()]
        except OSError:
            continue
    mine = []
    for pid in found:
        try:
            if pid not in agents and marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                mine.append(pid)
        except OSError:
            continue
    return mine


class _Group:
    """One attempt: a torchrun agent per worker pod, each its own session (like a container)."""

    def __init__(self, plan: LocalPlan, lines: Lines, adopting: bool):
        self.adopting = adopting
        self.marker = f"{PROGRESS_FILE_ENV}={plan.progress_file}".encode()
        self.rendezvous = plan.rendezvous
        self.scratch = [folder for worker in plan.workers for folder in worker.scratch_dirs]
        for folder in self.scratch:
            # An emptyDir starts empty with every pod.
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
        for worker in plan.workers:
            worker.termination_log.unlink(missing_ok=True)  # so is a container's termination message
        self.procs: list[subprocess.Popen] = []
        self.readers: list[threading.Thread] = []
        try:
            for worker in plan.workers:
                self._start(worker, plan.workdir, lines)
        except BaseException:
            # The agents already started must not outlive a failed start.
            self.kill()
            raise

    def _start(self, worker: LocalWorker, workdir: Path, lines: Lines) -> None:
        try:
            proc = subprocess.Popen(
                worker.argv,
                env=process_env(os.environ, worker),
                cwd=workdir,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                bufsize=1,
                start_new_session=True,
            )
        except OSError as err:
            raise LocalRunError(not_started(worker, err)) from err
        self.procs.append(proc)
        reader = threading.Thread(target=_pump, args=(worker.name, proc, lines), daemon=True)
        reader.start()
        self.readers.append(reader)

    def codes(self) -> list[Optional[int]]:
        return [p.poll() for p in self.procs]

    def terminate(self) -> None:
        """SIGTERM to each agent, as the kubelet signals a container's first process."""
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL whatever is left of every pod, agents and trainers alike, then free the scratch folders and the
        rendezvous file."""
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        agents = {p.pid for p in self.procs}
        while self.adopting and (orphans := _adopted(agents, self.marker)):
            for pid in orphans:
                # The group takes a trainer's own children; the pid itself, an orphan that leads no group
                # (waiting on a process that was never killed would hang).
                for kill in (os.killpg, os.kill):
                    try:
                        kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                os.waitpid(pid, 0)
        for reader in self.readers:
            reader.join()
        for folder in self.scratch:
            shutil.rmtree(folder, ignore_errors=True)
        self.rendezvous.unlink(missing_ok=True)


def _pump(name: str, proc: subprocess.Popen, lines: Lines) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.put((name, line.rstrip("\n")))


class _Runner:
    def __init__(self, plan_for: Callable[[], LocalPlan], plan: LocalPlan, display: Display):
        self.plan_for = plan_for
        self.plan = plan
        self.display = display
        self.lines: Lines = queue.Queue()
        self.stop_signal: Optional[int] = None
        self.hurry = False
        self.wake = threading.Event()
        self.adopting = become_subreaper()
        # The first loss and held-out loss this run saw, so the summary shows that they fell.
        self.first_loss: Optional[float] = None
        self.first_eval_loss: Optional[float] = None
        # When the current group started, and whether it is shown as stalled (status/stalled.py's limits).
        self.running_since = datetime.now(timezone.utc)
        self.stalled = False
        # Why the latest attempt failed (`reason: line`), for the summary.
        self.reason = ""

    def request_stop(self, signum: int, _frame: object = None) -> None:
        # A second Ctrl-C: stop waiting for the checkpoint.
        self.hurry = self.stop_signal is not None
        self.stop_signal = self.stop_signal or signum
        self.wake.set()

    def _refresh(self) -> None:
        while not self.lines.empty():
            self.display.log(*self.lines.get_nowait())
        doc = read_progress(self.plan.progress_file)
        if doc is not None and self.first_loss is None:
            self.first_loss = doc.loss
        if doc is not None and self.first_eval_loss is None:
            self.first_eval_loss = doc.eval_loss
        self.display.update(doc)
        self._watch_stall(doc)

    def _watch_stall(self, doc: Optional[Progress]) -> None:
        """Say once when the trainers stop reporting progress for longer than the job allows, and when they resume."""
        spec = self.plan.job.spec
        seen = quiet(spec.watchdog, spec.training.log_interval, doc, self.running_since, datetime.now(timezone.utc),
                     slack=STALL_SLACK_SECONDS)
        stalled = seen is not None and seen.seconds > seen.limit
        if stalled and not self.stalled:
            where = f"at step {doc.step}" if doc is not None else "before the first report"
            self.display.note(f"stalled: no progress for {seen.seconds:.0f} s {where} (limit {seen.limit:.0f} s: {seen.why})")
        elif self.stalled and not stalled:
            self.display.note(f"progress again at step {doc.step if doc is not None else 0}")
        self.stalled = stalled

    def _attempt(self, plan: LocalPlan) -> Optional[WorkerFailure]:
        """Run one group to its end: None when every pod succeeded, else the failure that explains it best.

        A failed pod or a stop request ends the others as Kubernetes deletes
        pods: SIGTERM (the trainers commit a checkpoint if they can), a grace
        period, then SIGKILL.
        """
        group = _Group(plan, self.lines, self.adopting)
        self.running_since = datetime.now(timezone.utc)
        failed: list[tuple[LocalWorker, int]] = []  # the pods whose failure ended the group
        ending_since: Optional[float] = None
        try:
            while True:
                self._refresh()
                codes = group.codes()
                if not failed:
                    failed = [(w, c) for w, c in zip(plan.workers, codes) if c not in (None, 0)]
                if ending_since is None and (failed or self.stop_signal is not None):
                    ending_since = time.monotonic()
                    if self.stop_signal is not None:
                        self.display.note("stopping: the trainers commit a checkpoint first")
                    group.terminate()
                if all(c is not None for c in codes) or (
                    ending_since is not None and (self.hurry or time.monotonic() - ending_since > plan.grace_seconds)
                ):
                    break
                self.wake.wait(POLL_SECONDS)
                self.wake.clear()
        finally:
            group.kill()
            self._refresh()
        # The pods that failed first, and any pod whose trainer named a reason (a stopped peer says `preempted`).
        first = {w.name for w, _ in failed}
        named = [(w, c) for w, c in zip(plan.workers, group.codes()) if w.name not in first and _said(w)]
        return min((_failure(w, c, plan) for w, c in failed + named), key=lambda f: cause_rank(f.reason), default=None)

    def run(self) -> tuple[str, int, str]:
        """Attempts until success, a stop, or the spent budget: (status, restarts, message)."""
        restarts = failures = 0
        plan = self.plan
        while True:
            failure = self._attempt(plan)
            if self.stop_signal is not None:
                return "Stopped", restarts, f"{signal.Signals(self.stop_signal).name}; rerun to continue"
            if failure is None:
                return "Succeeded", restarts, ""
            self.reason = f"{failure.reason}: {failure.line}"
            if failure.action == FAIL_JOB:
                return "Failed", restarts, f"{failure.pod} failed; {consequence(failure)}"
            failures += failure.action == RESTART
            if failures > plan.backoff_limit:
                return "Failed", restarts, f"{failure.pod} failed; backoffLimit {plan.backoff_limit} spent"
            restarts += 1
            self.display.note(f"{failure.text()}; {consequence(failure)}: restarting all workers from the newest checkpoint")
            # A fresh rendezvous: the old file holds the dead group's.
            plan = self.plan_for()


def _say(f: IO[str], text: str) -> None:
    f.seek(0)
    f.truncate()
    f.write(text + "\n")
    f.flush()


@contextlib.contextmanager
def running_here(workdir: Path) -> Iterator[IO[str]]:
    """Hold the work directory's run state while a run lives (another runner there is refused); `_say` the end."""
    workdir.mkdir(parents=True, exist_ok=True)
    with open(workdir / RUN_STATE_FILE, "a+") as f:  # not inherited: the lock is the runner's alone
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LocalRunError(f"{workdir}: another braintrain run is running there") from None
        _say(f, f"its runner (pid {os.getpid()}) ended without a summary")
        yield f


def ended(workdir: Path) -> Optional[str]:
    """None while a runner holds `workdir`, else how its last run ended ("" when unknown)."""
    try:
        with open(workdir / RUN_STATE_FILE) as f:
            try:
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return None
            return f.read().strip()
    except FileNotFoundError:
        return ""


def request_checkpoint(workdir: Path) -> str:
    """Ask the run in `workdir` for a checkpoint at its next step boundary; returns the request's text.

    The same file the operator writes into the job's ConfigMap: rank 0 reads it, the ranks agree in their vote.
    A run that is not running would never answer: LocalRunError says so.
    """
    return _request(workdir, CHECKPOINT_REQUEST_FILE, "")


def request_profile(workdir: Path, steps: int) -> str:
    """Ask the run in `workdir` for a profile of `steps` steps from its next step boundary on, on every rank;
    returns the request's text (`<steps> <when>`), passed on as request_checkpoint's is."""
    return _request(workdir, PROFILE_REQUEST_FILE, f"{steps} ")


def _request(workdir: Path, name: str, prefix: str) -> str:
    """Write a new request into the file `name` beside the running run's trainer.yaml."""
    path = request_file(workdir.resolve(), name)
    if not path.with_name(CONFIG_FILE).is_file():
        raise LocalRunError(f"{workdir}: no braintrain run here (no {path.with_name(CONFIG_FILE)})")
    last = ended(workdir.resolve())
    if last is not None:
        raise LocalRunError(f"{workdir}: the run is not running" + (f" (last: {last})" if last else ""))
    request = prefix + format_time() + f" {time.time_ns() % 1_000_000_000:09d}"  # new every time, and says when
    staged = path.with_name(path.name + ".tmp")
    staged.write_text(request + "\n")
    staged.replace(path)  # the trainer never reads half a request
    return request


def _said(worker: LocalWorker) -> Optional[tuple[str, str]]:
    """(reason, line) the worker's trainers wrote as its termination message, if any."""
    try:
        return parse_termination(worker.termination_log.read_text(errors="replace"))
    except OSError:
        return None


def _failure(worker: LocalWorker, code: int, plan: LocalPlan) -> WorkerFailure:
    reason, line = _said(worker) or (ERROR, f"exit code {code}, no reason from the trainer")
    return WorkerFailure(worker.name, reason, line, plan.job.spec.run_policy.failure_policy.action(reason))


def checkpoint_root(plan: LocalPlan) -> Optional[location.Root]:
    """Where the trainers keep their checkpoints: the local folder, or the object store's prefix (checkpoint.uri)."""
    if plan.checkpoint_dir is not None:
        return plan.checkpoint_dir
    uri = plan.job.spec.checkpoint.uri
    return location.root_of(uri) if uri is not None else None


def newest_committed(root: location.Root) -> Optional[Candidate]:
    """The newest checkpoint with a manifest (what the trainer resumes from), in a folder or an object store."""
    return next((c for c in location.store_for(root).list_checkpoints(root) if c.manifest is not None), None)


def _set_aside(plan: LocalPlan) -> list[location.Root]:
    """The set-aside folders (prefixes) where the checkpoints are."""
    root = checkpoint_root(plan)
    return [] if root is None else list(location.store_for(root).set_aside_folders(root))


def _prepare(plan: LocalPlan) -> None:
    for folder in plan.dirs:
        folder.mkdir(parents=True, exist_ok=True)
    for path, text in plan.files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    # A document from an earlier run would show stale progress.
    plan.progress_file.unlink(missing_ok=True)


def _summary(plan: LocalPlan, runner: _Runner, status: str, restarts: int, message: str, wall_seconds: float,
             set_aside_before: set[Path], overrides: tuple[str, ...]) -> RunSummary:
    doc = read_progress(plan.progress_file)
    root = checkpoint_root(plan)
    last = newest_committed(root) if root is not None else None
    return RunSummary(
        status=status,
        step=max(last.step if last else 0, doc.step if doc else 0),
        total_steps=plan.total_steps,
        loss=doc.loss if doc else None,
        first_loss=runner.first_loss,
        tokens_per_second=doc.tokens_per_second if doc else None,
        wall_seconds=wall_seconds,
        checkpoint=str(last.path) if last else None,
        restarts=restarts,
        message=message,
        reason=runner.reason if status == "Failed" else "",
        eval_loss=doc.eval_loss if doc else None,
        first_eval_loss=runner.first_eval_loss,
        goodput=doc.goodput if doc else None,
        # Made by this run's trainers (checkpoint.resumeFrom): where the checkpoints that were in the way went.
        set_aside=tuple(str(p) for p in _set_aside(plan) if p not in set_aside_before),
        overrides=overrides,
        in_pod_restarts=(doc.in_pod_restarts or 0) if doc else 0,
        last_in_pod_restart=(doc.last_in_pod_restart or "") if doc else "",
    )


def run_job(
    manifest: Mapping[str, Any],
    *,
    base_dir: Path,
    workdir: Optional[Path] = None,
    claims: Optional[Path] = None,
    stream: Optional[TextIO] = None,
    defaults: Optional[OperatorDefaults] = None,
    overrides: tuple[str, ...] = (),
) -> int:
    """Run the job's workers locally; the exit code is 0 only when it succeeded. `stream`: the display's (None:
    sys.stdout as it is when called). `overrides`: the `--set`s already applied to `manifest`, which the summary
    lists."""
    stream = stream if stream is not None else sys.stdout
    # One metrics port for the whole run (trainer.yaml, which carries it, is written once), held until the
    # run ends so that nobody takes it before a rank 0 listens on it, at any attempt.
    with held_port() as metrics_port:
        return _run(planner(manifest, base_dir=base_dir, workdir=workdir, metrics_port=metrics_port, claims=claims,
                            defaults=defaults), stream, overrides)


def _run(plan_for: Callable[[], LocalPlan], stream: TextIO, overrides: tuple[str, ...]) -> int:
    plan = plan_for()
    check_storage(plan.job, job_vocabulary(plan.job))
    unsupported = cluster_only(plan.job)
    if unsupported is not None:
        raise LocalRunError(unsupported)
    if importlib.util.find_spec("torch") is None:
        raise LocalRunError("braintrain run needs torch here: pip install 'brain-train[trainer]'")
    unbound = missing_claim(plan, Path.is_dir)
    if unbound is not None:
        raise LocalRunError(unbound)
    done = _start_point(plan)
    if done is not None and done.step >= plan.total_steps:
        print(
            f"braintrain: {plan.job_name} is already complete: {done.path} holds step {done.step} "
            f"of {plan.total_steps}; raise spec.training.steps to train further",
            file=stream,
        )
        return 0
    with running_here(plan.workdir) as state:
        return _supervise(plan_for, plan, done, stream, state, overrides)


def _start_point(plan: LocalPlan) -> Optional[Candidate]:
    """What the trainers will start from, checkpoint.resumeFrom applied (they refuse a step that is not committed).
    An object store that cannot be reached is named here, before any worker starts."""
    root = checkpoint_root(plan)
    if root is None:
        return None
    checkpoint, run = plan.job.spec.checkpoint, run_id(plan.job)
    try:
        refused = resume_from.refusal(root, checkpoint, run)
        start = resume_from.start_point(root, checkpoint, run)
    except Exception as exc:
        if not location.is_bucket(root):
            raise
        raise LocalRunError(f"spec.checkpoint.uri {root}: {bucket.explain(exc, root)}") from None
    if refused is not None:
        raise LocalRunError(f"spec.checkpoint.resumeFrom: {refused}")
    return start


def _supervise(plan_for: Callable[[], LocalPlan], plan: LocalPlan, done: Optional[Candidate], stream: TextIO,
               state: IO[str], overrides: tuple[str, ...]) -> int:
    """Run the attempts, then print the summary and leave it in the run state."""
    _prepare(plan)
    # Before any step is computed: a folder without room for the next checkpoint fails now.
    if plan.checkpoint_dir is not None:
        short = local_shortfall(plan.job, free=shutil.disk_usage(plan.checkpoint_dir).free, folder=str(plan.checkpoint_dir))
        if short is not None:
            raise LocalRunError(short)
    display = make_display(stream, job_name=plan.job_name, total_steps=plan.total_steps)
    set_aside_before = set(_set_aside(plan))
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
    summary = _summary(plan, runner, status, restarts, message, time.monotonic() - started, set_aside_before,
                       overrides)
    print("\n".join(summary_lines(summary)), file=stream, flush=True)
    _say(state, f"{status} at step {summary.step}/{summary.total_steps}" + (f" ({message})" if message else ""))
    if status == "Succeeded":
        return 0
    return 128 + runner.stop_signal if runner.stop_signal is not None else 1
