"""CheckpointManager: when to save, asynchronous saves, commit, resume, preemption, a full volume."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from ..config import AUTO, CheckpointConfig
from ..contract import PREEMPTED, PREEMPTED_REASON, STORAGE_FULL
from ..failures import Fatal, classify, write_termination
from ..launcher import restart_count
from ..young_daly import FIRST_INTERVAL_STEPS, interval_steps
from . import shards, store
from .state import TrainState, rng_key

log = logging.getLogger(__name__)


class Preempted(SystemExit):
    """Raised after the preemption checkpoint is committed; exits with PREEMPTED."""

    def __init__(self) -> None:
        super().__init__(PREEMPTED)


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used for a reason a fallback would hide (e.g. another model)."""


# -- collectives over a group, degrading to local values in a single process --


def _broadcast(obj: Any, group: dist.ProcessGroup | None) -> Any:
    if group is None:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def _gather(obj: Any, group: dist.ProcessGroup | None) -> list[Any]:
    if group is None:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def _barrier(group: dist.ProcessGroup | None) -> None:
    if group is not None:
        dist.barrier(group=group)


_SHARD_WRITER = re.compile(r"^__(\d+)_")  # DCP's shard file names: __<rank>_<n>.distcp


def _checker(name: str, index: int, saved_world: Any, world: int) -> int:
    """The rank that verifies a file: for a shard, the rank that takes over its writer's part of the
    state (whose load then reads the file again from the page cache), else one in turn."""
    writer = _SHARD_WRITER.match(name)
    if writer and isinstance(saved_world, int) and 0 <= int(writer.group(1)) < saved_world:
        return int(writer.group(1)) * world // saved_world
    return index % world


def _verify(folder: Path, manifest: dict[str, Any], group: dist.ProcessGroup | None) -> list[str]:
    """Check every file against the manifest, each rank reading its share; all ranks get all problems."""
    rank, world = (dist.get_rank(group), dist.get_world_size(group)) if group is not None else (0, 1)
    mine = [name for index, name in enumerate(sorted(manifest["files"]))
            if _checker(name, index, manifest.get("world_size"), world) == rank]
    problems = store.verify_files(folder, manifest["files"], mine)
    return [problem for problems in _gather(problems, group) for problem in problems]


def steps_between_votes(period_s: float, step_s: float) -> int:
    """Steps until the next preemption vote, for votes about period_s apart (at least every step)."""
    return max(1, int(period_s / step_s)) if step_s > 0 else 1


def _size_text(size: int) -> str:
    return f"{size:,} bytes ({size / 1e6:.1f} MB)"


class CheckpointManager:
    """Saves TrainState every `interval_steps` into `cfg.dir` and resumes from it.

    Collective: every rank constructs one and makes the same calls in the same
    order. Saves run on their own gloo group, so an asynchronous save's
    background collectives never interleave with the training loop's.
    """

    def __init__(self, cfg: CheckpointConfig, *, rank: int, world_size: int, config_hash: str,
                 manifest_fields: dict[str, Any] | None = None,
                 save_guard: Callable[[], ContextManager[Any]] = contextlib.nullcontext,
                 request_file: Path | None = None, checkpoint_bytes: int = 0):
        self.cfg = cfg
        # A checkpoint's size until one is committed (then that one's): what each save must find free.
        self.checkpoint_bytes = checkpoint_bytes
        self.save_guard = save_guard  # entered around each save the loop waits for (the hang watchdog's)
        # Rank 0 reads checkpoint requests (contract.CHECKPOINT_REQUEST_FILE) and the vote carries them to every
        # rank: one reader, so ranks whose copies of the file update at different times still agree.
        self.request_file = request_file if rank == 0 else None
        self._request_seen = self._read_request()  # a request from before this start is not repeated
        self._requested: tuple[str, int] | None = None  # (request, step) saved for it, until committed
        self.answered: tuple[str, int] | None = None  # the newest request whose checkpoint is committed
        # intervalSteps auto (young_daly.py): every rank computes the same interval from what the votes agree on.
        self.auto = cfg.interval_steps == AUTO
        self.interval = FIRST_INTERVAL_STEPS if self.auto else int(cfg.interval_steps)
        self.mtbf_s = 0.0  # set by rank 0 (its goodput ledger knows the run's failures); the vote shares it
        self.mtbf_source = ""
        self._last_save_step = 0
        self.manifest_fields = manifest_fields or {}  # more facts for every manifest (the model, where it started from)
        self.rank = rank
        self.world_size = world_size
        self.config_hash = config_hash
        self.root = Path(cfg.dir)
        self.last_committed: tuple[int, Path] | None = None
        self.last_stall_s = 0.0  # how long the latest save blocked the training loop
        self.stall_total_s = 0.0  # how long all saves of this trainer blocked it (the goodput ledger's)
        self._saved_step: int | None = None
        self._pending: Future | None = None  # the save in flight: written, then committed
        self._pending_step = 0  # its step
        self._staged: Future | None = None  # its copy to CPU memory
        self._stager: Any = None
        self._hook: Any = None
        self._stop_requested = False
        self._previous_handler: Any = None
        self._next_vote: int | None = None  # step of the next preemption vote; None: the next step
        self._last_vote: tuple[int, float] | None = None  # (step, time.perf_counter()) of the latest vote
        # Two groups: async saves talk on one from a background thread; restore,
        # barriers and the SIGTERM votes talk on the other from this thread.
        # Creating a group is a collective: only when checkpoints are on (the same on every rank).
        distributed = cfg.enabled and dist.is_initialized()
        self._save_group = dist.new_group(backend="gloo") if distributed else None
        self._group = dist.new_group(backend="gloo") if distributed else None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-commit")
        if cfg.enabled and threading.current_thread() is threading.main_thread():
            self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self._stop_requested = True  # acted on after the current step, by every rank at once

    # -- resume --

    def restore(self, state: TrainState) -> int | None:
        """Load the newest committed, intact checkpoint into state; returns its step or None.

        Then, before any step is computed, fail with storage-full when the
        folder has no room for the next checkpoint.
        """
        if not self.cfg.enabled:
            return None
        step = self._restore(state)
        self._check_space("the next checkpoint")
        return step

    def _restore(self, state: TrainState) -> int | None:
        candidates = None
        if self.rank == 0:
            candidates = store.list_checkpoints(self.root)
            store.remove_stale(self.root)
        for candidate in _broadcast(candidates, self._group):
            if candidate.manifest is None:
                if self.rank == 0:
                    log.warning("skipping %s: %s", candidate.path, candidate.error)
                continue
            problems = _verify(candidate.path, candidate.manifest, self._group)
            if problems:
                if self.rank == 0:
                    moved = store.quarantine(candidate.path)
                    log.error(
                        "checkpoint %s is damaged (%s); moved to %s, falling back to the previous committed checkpoint",
                        candidate.path, "; ".join(problems), moved.name,
                    )
                _barrier(self._group)
                continue
            self._load(state, candidate)
            self._saved_step = self._last_save_step = state.step
            self.last_committed = (candidate.step, candidate.path)
            return state.step
        if self.rank == 0:
            log.info("no committed checkpoint in %s: starting from scratch (torchrun restart count %s)",
                     self.root, restart_count())
        return None

    def _load(self, state: TrainState, candidate: store.Candidate) -> None:
        manifest = candidate.manifest
        template = state.state_dict()
        if rng_key(self.rank) not in shards.saved_keys(candidate.path):
            template.pop("rng")  # more ranks than at save time: this one keeps its own RNG
        try:
            shards.load(template, candidate.path, self._group)
        except Exception as exc:
            raise CheckpointError(f"checkpoint {candidate.path} does not fit this model/optimizer: {exc}") from exc
        state.load_state_dict(template)
        if self.rank == 0:
            log.info(
                "resumed from %s: step %d, global sample index %d, saved at world size %s, now %d, torchrun restart count %s",
                candidate.path, state.step, state.sample_index, manifest.get("world_size"), self.world_size,
                restart_count(),
            )
            if manifest.get("config_hash") != self.config_hash:
                log.warning("%s was written with config %s, this run has %s", candidate.path, manifest.get("config_hash"), self.config_hash)

    # -- saving --

    def after_step(self, state: TrainState) -> None:
        """Call after every optimizer step (state.step already advanced)."""
        if not self.cfg.enabled:
            return
        interval = self.interval
        if self.auto:
            saving = state.step - self._last_save_step >= interval
        else:
            saving = bool(interval) and state.step % interval == 0
        # A save is collective anyway, so the ranks vote before each one as well.
        if saving or self._next_vote is None or state.step >= self._next_vote:
            stop, request = self._vote(state.step)
            if stop:
                self._preempt(state)
            if request is not None:
                saving = True
                self._requested = (request, state.step)
                if self.rank == 0:
                    log.info("checkpoint requested (%s): saving step %d", request, state.step)
        if saving:
            with self.save_guard():
                self._save(state, blocking=not self.cfg.async_save)

    def _vote(self, step: int) -> tuple[bool, str | None]:
        """(whether any rank got SIGTERM, a new checkpoint request or None). Collective: every rank votes at the same steps.

        One all-reduce of (SIGTERM seen, seconds since the previous vote, rank
        0 saw a new request); from the slowest rank's time per step, every rank
        computes the same next vote step, about `preemption_vote_seconds` later.
        Only rank 0 knows a request's text; the others save all the same.
        """
        now = time.perf_counter()
        request = self._new_request()
        if self._group is None:  # nothing to agree on: look after every step, for free
            if self.auto and self._last_vote and step > self._last_vote[0]:
                self._choose_interval(self.last_stall_s, self.mtbf_s, (now - self._last_vote[1]) / (step - self._last_vote[0]))
            self._last_vote = (step, now)
            return self._stop_requested, request
        since = now - self._last_vote[1] if self._last_vote else 0.0
        votes = torch.tensor([float(self._stop_requested), since, float(request is not None), self.last_stall_s,
                              self.mtbf_s], dtype=torch.float64)
        dist.all_reduce(votes, op=dist.ReduceOp.MAX, group=self._group)
        stop, since = bool(votes[0]), float(votes[1])
        steps = step - self._last_vote[0] if self._last_vote else 0
        self._next_vote = step + steps_between_votes(self.cfg.preemption_vote_seconds, since / steps if steps else 0.0)
        self._last_vote = (step, now)
        if self.auto and steps:
            self._choose_interval(float(votes[3]), float(votes[4]), since / steps)
        return stop, (request or "") if votes[2] else None

    def _choose_interval(self, stall_s: float, mtbf_s: float, step_s: float) -> None:
        """intervalSteps auto: Young/Daly's interval once a save's stall is measured (the slowest rank's figures)."""
        if stall_s <= 0 or mtbf_s <= 0:
            return
        chosen = interval_steps(stall_s, mtbf_s, step_s)
        if chosen != self.interval and self.rank == 0:
            log.info("checkpoint interval (auto): %d steps, by Young/Daly from a %.3g s checkpoint stall, %.3g s steps "
                     "and a mean time between failures of %.0f s (%s)", chosen, stall_s, step_s, mtbf_s, self.mtbf_source)
        self.interval = chosen

    def _read_request(self) -> str:
        if self.request_file is None:
            return ""
        try:
            return self.request_file.read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            return ""  # no request yet (the key is absent until the first one)

    def _new_request(self) -> str | None:
        """Rank 0: the request file's content if it is new and not empty."""
        request = self._read_request()
        if not request or request == self._request_seen:
            return None
        self._request_seen = request
        return request

    def finish(self, state: TrainState) -> None:
        """Final save; returns once it is committed on disk (after a SIGTERM since the last vote: Preempted)."""
        if not self.cfg.enabled:
            return
        stop, request = self._vote(state.step)
        if stop:
            self._preempt(state)
        if request is not None:  # the final save answers it
            self._requested = (request, state.step)
        with self.save_guard():
            self.wait()
            if state.step != self._saved_step:
                self._save(state, blocking=True)
            _barrier(self._group)
        self.close()

    def wait(self) -> None:
        """Block until the save in flight (if any) is written and committed; re-raise its error."""
        pending, self._pending, self._staged = self._pending, None, None
        if pending is not None:
            with self._explained(self._pending_step):
                pending.result()

    def close(self, *, wait: bool = True) -> None:
        """Release the commit thread, the staging hook and the SIGTERM handler (idempotent).

        wait=False is for a loop that failed: a save in flight is not waited
        for (it commits if it completes, else stays an uncommitted .tmp), and
        SIGTERM gets its default meaning back so the process can be stopped.
        """
        if wait:
            self.wait()
        self._executor.shutdown(wait=wait)
        if self._hook is not None:
            self._hook.remove()
            if wait:  # else a save in flight may still be writing from the staged buffers
                self._stager.close()
            self._hook = self._stager = None
        if self._previous_handler is not None:
            signal.signal(signal.SIGTERM, self._previous_handler)
            self._previous_handler = None

    def _preempt(self, state: TrainState) -> None:
        if self.rank == 0:
            log.warning("SIGTERM: saving step %d before exiting with code %d", state.step, PREEMPTED)
        with self.save_guard():
            self.wait()
            if state.step != self._saved_step:
                self._save(state, blocking=True)
            _barrier(self._group)  # rank 0 has committed before any rank exits
        write_termination(PREEMPTED_REASON, f"SIGTERM: step {state.step} committed, exiting to be restarted")
        self.close()
        raise Preempted()

    def _needed_bytes(self) -> int:
        if self.last_committed is not None:
            manifest = store.read_manifest(self.last_committed[1])
            return sum(f["size"] for f in manifest["files"].values())
        return self.checkpoint_bytes

    def _storage_line(self, what: str, needed: int) -> str:
        free = shutil.disk_usage(self.root).free
        return (f"{what} needs {_size_text(needed)}, {_size_text(free)} free in {self.root} "
                f"(checkpoint.keep_last={self.cfg.keep_last}: that many committed checkpoints and the one being "
                "written must fit; committed checkpoints were kept)")

    def _check_space(self, what: str) -> None:
        """Fail with storage-full before writing a checkpoint that cannot fit. Collective: rank 0 decides."""
        verdict = None
        if self.rank == 0:
            needed = self._needed_bytes()
            self.root.mkdir(parents=True, exist_ok=True)
            if needed > shutil.disk_usage(self.root).free:
                verdict = self._storage_line(what, needed)
        verdict = _broadcast(verdict, self._group)
        if verdict is not None:
            raise Fatal(STORAGE_FULL, verdict)

    @contextlib.contextmanager
    def _explained(self, step: int) -> Iterator[None]:
        """A save that ran out of space: its uncommitted folder removed, storage-full with the figures."""
        try:
            yield
        except BaseException as exc:
            reason, line = classify(exc)
            if reason != STORAGE_FULL or isinstance(exc, Fatal):
                raise
            if self.rank == 0:
                shutil.rmtree(store.tmp_dir(self.root, step), ignore_errors=True)
            what = f"the checkpoint of step {step}"
            raise Fatal(STORAGE_FULL, f"{line}: {self._storage_line(what, self._needed_bytes())}") from exc

    def _save(self, state: TrainState, blocking: bool) -> None:
        waiting = time.perf_counter()
        self.wait()  # at most one save in flight
        self._check_space(f"the checkpoint of step {state.step}")
        started = time.perf_counter()
        self.stall_total_s += started - waiting
        folder = store.tmp_dir(self.root, state.step)
        fields = {
            "step": state.step,
            "sample_index": state.sample_index,
            "world_size": self.world_size,
            "torch_version": torch.__version__,
            "config_hash": self.config_hash,
            **self.manifest_fields,
        }
        state_dict = state.state_dict()
        if blocking:
            with self._explained(state.step):
                shards.save(state_dict, folder, self._group)
                self._commit(folder, fields, started)
        else:
            if self._stager is None:
                self._stager = shards.background_stager()
                self._hook = state.optimizer.register_step_pre_hook(self._before_optimizer_step)
            self._staged, written = shards.async_save(state_dict, folder, self._save_group, self._stager)
            self._pending = self._executor.submit(self._commit_when_written, written, folder, fields, started)
            self._pending_step = state.step
        self.last_stall_s = time.perf_counter() - started
        self.stall_total_s += self.last_stall_s
        self._saved_step = self._last_save_step = state.step

    def _before_optimizer_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        # The copy to CPU memory overlaps the next forward and backward; only the
        # optimizer step changes what is being copied, so it waits here.
        staged, self._staged = self._staged, None
        if staged is not None:
            blocked = time.perf_counter()
            staged.result()
            waited = time.perf_counter() - blocked
            self.last_stall_s += waited
            self.stall_total_s += waited

    def _commit_when_written(self, written: Future, folder: Path, fields: dict[str, Any], started: float) -> None:
        written.result()
        self._commit(folder, fields, started)

    def _commit(self, folder: Path, fields: dict[str, Any], started: float) -> None:
        # DCP returns on every rank only after all shards and .metadata are written.
        if self.rank != 0:
            return
        final = self.root / store.step_dir_name(fields["step"])
        manifest = store.commit(folder, final, fields)
        self.last_committed = (fields["step"], final)
        if self._requested is not None and self._requested[1] <= fields["step"]:
            self.answered, self._requested = self._requested, None
        size = sum(f["size"] for f in manifest["files"].values())
        log.info("checkpoint %s committed: %.1f MB in %.2f s", final, size / 1e6, time.perf_counter() - started)
        for path in store.apply_retention(self.root, self.cfg.keep_last):
            log.info("retention (keep_last=%d): deleted %s", self.cfg.keep_last, path)


# -- single-shot model checkpoints (FSDPWrapper.save/load_distributed_checkpoint) --


def save_model(path: str | os.PathLike, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
    """Save model (and optimizer) state, sharded, committed atomically to `path`. Collective."""
    final = Path(path)
    folder = final.with_name(final.name + store.TMP_SUFFIX)
    group = dist.group.WORLD if dist.is_initialized() else None
    rank = dist.get_rank() if group is not None else 0
    if rank == 0 and folder.exists():
        shutil.rmtree(folder)
    _barrier(group)
    if optimizer is None:
        state_dict: dict[str, Any] = {"model": get_model_state_dict(model)}
    else:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state_dict = {"model": model_sd, "optim": optim_sd}
    shards.save(state_dict, folder, group)
    if rank == 0:
        world = dist.get_world_size() if group is not None else 1
        store.commit(folder, final, {"step": None, "world_size": world, "torch_version": torch.__version__})
    _barrier(group)


def load_model(path: str | os.PathLike, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
    """Load a checkpoint written by save_model (or CheckpointManager) at any world size. Collective."""
    folder = Path(path)
    group = dist.group.WORLD if dist.is_initialized() else None
    manifest = store.read_manifest(folder)
    problems = _verify(folder, manifest, group)
    if problems:
        raise store.ManifestError(f"checkpoint {folder} is damaged: {'; '.join(problems)}")
    if optimizer is None:
        state_dict: dict[str, Any] = {"model": get_model_state_dict(model)}
        shards.load(state_dict, folder, group)
        set_model_state_dict(model, state_dict["model"])
    else:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state_dict = {"model": model_sd, "optim": optim_sd}
        shards.load(state_dict, folder, group)
        set_state_dict(model, optimizer, model_state_dict=state_dict["model"], optim_state_dict=state_dict["optim"])
