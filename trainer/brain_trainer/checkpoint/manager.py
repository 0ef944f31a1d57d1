"""CheckpointManager: saves (asynchronous ones too), commit, resume, a full volume.

When to save is cadence.py's, and preemption (SIGTERM, checkpoint requests and the vote) is
resilience/preemption.py's: loop/boundary.py tells the manager what they decided (`after_step`, `finish`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator, Optional, TypeVar

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from ..config import CheckpointConfig
from ..contract import ERROR, RUN_ID_ENV, STORAGE_FULL, restart_count
from ..resilience.failures import Fatal, classify
from ..observe import commits
from ..schema import ConfigError, FieldError
from . import compat, location, resume_from, shards, staging, store
from .state import MODEL_PREFIX, TrainState, UnexpectedState

log = logging.getLogger(__name__)

_Read = TypeVar("_Read")  # what a rank read of a candidate checkpoint (_agreed)


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
    problems = location.store_for(folder).verify_files(folder, manifest["files"], mine)
    return [problem for problems in _gather(problems, group) for problem in problems]


def _size_text(size: int) -> str:
    return f"{size:,} bytes ({size / 1e6:.1f} MB)"


class CheckpointManager:
    """Saves TrainState into `cfg.dir` when told to (`after_step`, `finish`) and resumes from it.

    Collective: every rank constructs one and makes the same calls in the same
    order. Saves run on their own gloo group, so an asynchronous save's
    background collectives never interleave with the training loop's; `group`
    is the other one, for this thread (restore, barriers, and the preemption vote).
    """

    def __init__(self, cfg: CheckpointConfig, *, rank: int, world_size: int, config_hash: str,
                 manifest_fields: dict[str, Any] | None = None,
                 save_guard: Callable[[], ContextManager[Any]] = contextlib.nullcontext, checkpoint_bytes: int = 0):
        self.cfg = cfg
        # A checkpoint's size until one is committed (then that one's): what each save must find free.
        self.checkpoint_bytes = checkpoint_bytes
        self.save_guard = save_guard  # entered around each save the loop waits for (the hang watchdog's)
        self._requested: tuple[str, int] | None = None  # (request, step) saved for it, until committed
        self.answered: tuple[str, int] | None = None  # the newest request whose checkpoint is committed
        self.manifest_fields = manifest_fields or {}  # more facts for every manifest (the model, where it started from)
        self.rank = rank
        self.world_size = world_size
        self.config_hash = config_hash
        self.root = location.root_of(cfg.dir)  # a folder on a volume, or a bucket's prefix
        self.store = location.store_for(self.root)  # store or bucket: the same functions (location.py)
        self.last_committed: tuple[int, Path] | None = None
        self.last_stall_s = 0.0  # how long the latest save blocked the training loop
        self.stall_total_s = 0.0  # how long all saves of this trainer blocked it (the goodput ledger's)
        self._saved_step: int | None = None
        self._pending: Future | None = None  # the save in flight: written, then committed
        self._pending_step = 0  # its step
        self._staged: Future | None = None  # its copy to CPU memory
        # Asynchronous saves' copies to CPU memory, into buffers allocated after the first step (staging.py).
        self.stager: staging.Stager | None = None
        self._hook: Any = None
        # Two groups: async saves talk on one from a background thread; restore,
        # barriers and the preemption votes talk on the other from this thread.
        # Creating a group is a collective: only when checkpoints are on (the same on every rank).
        distributed = cfg.enabled and dist.is_initialized()
        self._save_group = dist.new_group(backend="gloo") if distributed else None
        self.group = dist.new_group(backend="gloo") if distributed else None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-commit")
        # One job writes the folder at a time, and only the newest worker group commits (lease.py).
        self._lease = location.lease_for(self.root, cfg.lease_seconds, rank=rank)

    def _take_lease(self) -> None:
        """Before the first restore or save (collective once; then nothing): the volume is this group's, or config-error."""
        self._lease.acquire(lambda refusal: _broadcast(refusal, self.group))

    # -- resume --

    def restore(self, state: TrainState) -> int | None:
        """Load the newest committed, intact checkpoint into state; returns its step or None.

        Then, before any step is computed, fail with storage-full when the
        folder has no room for the next checkpoint.
        """
        if not self.cfg.enabled:
            return None
        self._take_lease()
        step = self._restore(state)
        self._check_space("the next checkpoint")
        return step

    def _restore(self, state: TrainState) -> int | None:
        refused = candidates = None
        if self.rank == 0:
            # resume_from first: what it sets aside is no candidate.
            refused = resume_from.apply(self.root, self.cfg, os.environ.get(RUN_ID_ENV, ""))
            candidates = self.store.list_checkpoints(self.root)
            self.store.remove_stale(self.root)
        refused, candidates = _broadcast((refused, candidates), self.group)
        if refused is not None:  # every rank fails the same way, before any step
            raise ConfigError([FieldError("checkpoint.resume_from", refused)])
        partly_loaded: shards.RefusedCheckpoint | None = None
        for candidate in candidates:
            if candidate.manifest is None:
                if self.rank == 0:
                    log.warning("skipping %s: %s", candidate.path, candidate.error)
                continue
            problems = _verify(candidate.path, candidate.manifest, self.group)
            if problems:
                self._set_aside(candidate.path, f"is damaged ({'; '.join(problems)})")
                continue
            # A refusal is every rank's verdict; the checkpoint is moved aside, so no restart loads it again.
            template, refused = self._agreed(lambda: self._template(state, candidate))  # nothing read into place yet
            if refused is not None:
                self._set_aside(candidate.path, f"is refused ({refused})")
                continue
            try:
                self._load(state, candidate, template)
            except shards.RefusedCheckpoint as exc:
                # Other tensors may have been read into place already: an older checkpoint overwrites them all.
                self._set_aside(candidate.path, f"is refused ({exc})")
                partly_loaded = exc
                continue
            self._saved_step = state.step
            self.last_committed = (candidate.step, candidate.path)
            return state.step
        if partly_loaded is not None:
            # Nothing older to overwrite what the refused load read into place: this process's model is no
            # longer its initial one, and a restart (which no longer sees the refused checkpoint) starts clean.
            raise Fatal(ERROR, f"{partly_loaded}: no older committed checkpoint, and the refused one was partly "
                               "read into the model; a restart starts from scratch")
        if self.rank == 0:
            log.info("no committed checkpoint in %s: starting from scratch (torchrun restart count %s)",
                     self.root, restart_count())
        return None

    def _agreed(self, read: Callable[[], _Read]) -> tuple[_Read | None, shards.RefusedCheckpoint | None]:
        """`read` a candidate on every rank, then one verdict for all (collective): what this rank read, and the
        refusal of the lowest rank that refused, if any. The gather returns once every rank has finished or abandoned
        its read, so the folder is moved (_set_aside) under no reader, and every rank goes on to the same candidate."""
        try:
            value, refused = read(), None
        except shards.RefusedCheckpoint as exc:
            value, refused = None, exc.args
        found = next((problem for problem in _gather(refused, self.group) if problem is not None), None)
        return value, None if found is None else shards.RefusedCheckpoint(*found)

    def _set_aside(self, path: Path, verdict: str) -> None:
        """A checkpoint that must not be loaded, moved to .corrupt (collective, once every rank agreed and stopped
        reading it): kept for inspection, never retried."""
        if self.rank == 0:
            moved = self.store.quarantine(path)
            log.error("checkpoint %s %s; moved to %s, falling back to the previous committed checkpoint",
                      path, verdict, moved.name)
        _barrier(self.group)

    def _template(self, state: TrainState, candidate: store.Candidate) -> dict[str, Any]:
        """What this rank loads of the candidate, once its .metadata says the model fits (nothing read into place)."""
        saved = shards.saved_shapes(candidate.path)
        template = state.template(saved)
        # Before any load: every rank sees the same manifest and model, so all raise the same error, and
        # the error names the setting (DCP would say "Size mismatch" once per rank, and a restart retries it).
        misfit = compat.mismatch(candidate.manifest, self.manifest_fields, state.model_shapes(template),
                                 shards.tensor_shapes(saved, MODEL_PREFIX), candidate.path.name)
        if misfit is not None:
            raise misfit
        return template

    def _load(self, state: TrainState, candidate: store.Candidate, template: dict[str, Any]) -> None:
        manifest = candidate.manifest
        try:
            shards.load(template, candidate.path, self.group)
        except shards.RefusedCheckpoint:
            raise  # not this model's or optimizer's problem: the checkpoint's (_restore)
        except shards.LOAD_ERRORS as exc:
            failure = compat.load_failure(candidate.path.name, exc)
            if failure is None:
                raise  # an I/O error, out of memory, a lost peer: classified as it is, and retried
            raise failure from exc
        try:
            state.load_state_dict(template)
            unexpected = None
        except UnexpectedState as exc:
            unexpected = (shards.item_file(candidate.path, exc.key), str(exc))
        # Collective, as DCP's own refusals are: every rank sets the checkpoint aside, or none does.
        found = next((problem for problem in _gather(unexpected, self.group) if problem is not None), None)
        if found is not None:
            raise shards.RefusedCheckpoint(*found)
        if self.rank == 0:
            log.info(
                "resumed from %s: step %d, global sample index %d, saved at world size %s, now %d, torchrun restart count %s",
                candidate.path, state.step, state.sample_index, manifest.get("world_size"), self.world_size,
                restart_count(),
            )
            changes = compat.changes(manifest, self.manifest_fields, self.config_hash, candidate.path.name)
            if changes:
                log.warning("%s", changes)

    # -- saving --

    def after_step(self, state: TrainState, *, save: bool = False, request: Optional[str] = None) -> None:
        """Call after every optimizer step (state.step already advanced): `save` this step (the cadence's, or a
        request's), `request` the checkpoint request it answers (the vote's)."""
        if not self.cfg.enabled:
            return
        self._lease.raise_if_fenced()  # rank 0's renewals found a newer group: stop before more work
        if self.cfg.async_save and self.stager is None:
            self._warm_up(state)
        if request is not None:
            self._requested = (request, state.step)
            if self.rank == 0:
                log.info("checkpoint requested (%s): saving step %d", request, state.step)
        if save:
            with self.save_guard():
                self._save(state, blocking=not self.cfg.async_save)

    def _warm_up(self, state: TrainState) -> None:
        """After the first optimizer step (the optimizer's state exists now): the staging buffers of asynchronous
        saves are allocated in the background, so that no save waits for them (staging.py)."""
        self.stager = staging.Stager(pin=torch.cuda.is_available(), announce=self.rank == 0)
        self._hook = state.optimizer.register_step_pre_hook(self._before_optimizer_step)
        self.stager.allocate(state.state_dict())

    def finish(self, state: TrainState, request: Optional[str] = None) -> None:
        """Final save (answering the vote's `request`, if any); returns once it is committed on disk.

        Also the preemption checkpoint: the caller then leaves (Preemption.leave).
        """
        if not self.cfg.enabled:
            return
        if request is not None:
            self._requested = (request, state.step)
        with self.save_guard():
            self.wait()
            if state.step != self._saved_step:
                self._save(state, blocking=True)
            _barrier(self.group)  # rank 0 has committed before any rank returns
        self.close()  # releases the lease: a job re-created now takes the folder over at once

    def wait(self) -> None:
        """Block until the save in flight (if any) is written and committed; re-raise its error."""
        pending, self._pending, self._staged = self._pending, None, None
        if pending is not None:
            with self._explained(self._pending_step):
                pending.result()

    def close(self, *, wait: bool = True) -> None:
        """Release the commit thread, the staging hook and the volume's lease (idempotent): the run ended, however.

        wait=False is for a loop that failed: a save in flight is not waited
        for (it commits if it completes and this group is not fenced by then,
        else stays an uncommitted .tmp).
        """
        if wait:
            self.wait()
        self._executor.shutdown(wait=wait)
        # A failed run too: the job that starts next takes the folder at once (a fenced group releases nothing).
        self._lease.release()
        if self._hook is not None:
            self._hook.remove()
            if wait:  # else a save in flight may still be writing from the staged buffers
                self.stager.close()
            self._hook = self.stager = None

    def _needed_bytes(self) -> int:
        if self.last_committed is not None:
            manifest = self.store.read_manifest(self.last_committed[1])
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
        if self.rank == 0 and not location.is_bucket(self.root):  # a bucket reports no free space (bucket_lease probes it)
            needed = self._needed_bytes()
            self.root.mkdir(parents=True, exist_ok=True)
            if needed > shutil.disk_usage(self.root).free:
                verdict = self._storage_line(what, needed)
        verdict = _broadcast(verdict, self.group)
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
        self._take_lease()
        self.wait()  # at most one save in flight
        self._check_space(f"the checkpoint of step {state.step}")
        started = time.perf_counter()
        self.stall_total_s += started - waiting
        folder = self.store.tmp_dir(self.root, state.step)
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
                if self.stager is not None:  # the final save of asynchronous ones: into the same buffers
                    state_dict = self.stager.stage_now(state_dict)
                shards.save(state_dict, folder, self.group)
                self._commit(folder, fields, started, blocking=True)
        else:
            assert self.stager is not None  # after_step warmed up
            self._staged, written = shards.async_save(state_dict, folder, self._save_group, self.stager)
            self._pending = self._executor.submit(self._commit_when_written, written, folder, fields, started)
            self._pending_step = state.step
        self.last_stall_s = time.perf_counter() - started
        self.stall_total_s += self.last_stall_s
        self._saved_step = state.step

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
        self._commit(folder, fields, started, blocking=False)

    def _commit(self, folder: Path, fields: dict[str, Any], started: float, blocking: bool) -> None:
        # DCP returns on every rank only after all shards and .metadata are written.
        if self.rank != 0:
            return
        final = self.root / store.step_dir_name(fields["step"])
        self._lease.check()  # also before the manifest: a newer group's start may have removed this .tmp
        manifest = self.store.commit(folder, final, {**fields, **self._lease.manifest_fields()}, self._lease.check)
        self.last_committed = (fields["step"], final)
        if self._requested is not None and self._requested[1] <= fields["step"]:
            self.answered, self._requested = self._requested, None
        size = sum(f["size"] for f in manifest["files"].values())
        took = time.perf_counter() - started
        # A blocking save blocks the loop throughout. An asynchronous one's only later wait (the next optimizer
        # step's, for its copy) is over or next to nothing by now: the copy ended before the files were written.
        stall = took if blocking else self.last_stall_s
        log.info("checkpoint %s committed: %.1f MB in %.2f s, the training loop blocked %.3f s", final, size / 1e6,
                 took, stall)
        commits.committed(commits.Commit(fields["step"], size, took))
        for path in self.store.apply_retention(self.root, self.cfg.keep_last):
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
    folder = location.root_of(path)
    group = dist.group.WORLD if dist.is_initialized() else None
    manifest = location.store_for(folder).read_manifest(folder)
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
