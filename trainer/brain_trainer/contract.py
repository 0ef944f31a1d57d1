"""The contract between the operator and the trainer: every name, path, code and document both halves use.

Torch-free; the operator and the trainer both import it, so no literal of the
contract is written twice (docs/architecture.md, "The contract").
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Mapping, Optional

from .schema import ConfigError, from_dict, setting, to_dict, valid_fields

# -- how a worker starts the trainer --

TRAINER_MODULE = "brain_trainer"
# What a local worker pod runs instead of `torchrun`: the same agent, without a traceback when it is stopped.
AGENT_MODULE = "brain_trainer.agent"
CONFIG_FLAG = "--config"
CONFIG_FILE = "trainer.yaml"
# Beside trainer.yaml (another key of the same ConfigMap): a new non-empty content asks the
# workers to commit a checkpoint at the next step boundary (the job's brain.ai/checkpoint-now
# annotation; `braintrain checkpoint` locally).
CHECKPOINT_REQUEST_FILE = "checkpoint-request"
# Beside it, the same way: a new content "<steps> [anything]" asks every rank to profile that many steps from
# the next step boundary (the job's brain.ai/profile-now annotation; `braintrain profile` locally).
PROFILE_REQUEST_FILE = "profile-request"


def profile_request_steps(request: str) -> int:
    """The steps a profile request asks for: its first word, a whole number >= 1; ValueError naming what is wrong."""
    word = request.split(maxsplit=1)[0] if request.split() else ""
    if not word.isdigit() or int(word) < 1:
        raise ValueError(f"a profile request is '<steps> [anything]' with steps a whole number >= 1, got {request!r}")
    return int(word)


def trainer_args(config_path: str) -> list[str]:
    """What follows `torchrun` (or `python`) to train with the config at `config_path`."""
    return ["-m", TRAINER_MODULE, CONFIG_FLAG, config_path]


# -- the launch environment --

# torchrun's own settings and the rank variables it gives each worker: what decides how a job launches.
LAUNCH_ENV_PREFIXES = ("PET_", "TORCHELASTIC_")
TORCH_RANK_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
LAUNCH_ENV_KEYS = (*TORCH_RANK_VARIABLES, "GROUP_RANK")
RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"


def restart_count(env: Mapping[str, str] = os.environ) -> int:
    """Worker-group restarts so far, as torchrun counts them (0 when torchrun did not start this process)."""
    raw = env.get(RESTART_COUNT_ENV, "0")
    return int(raw) if raw.isdigit() else 0


# torchrun's run id (its --rdzv-id: the job's uid): one goodput ledger per run.
RUN_ID_ENV = "TORCHELASTIC_RUN_ID"
# Where rank 0 also writes its progress document (the local runner sets it).
PROGRESS_FILE_ENV = "BRAIN_PROGRESS_FILE"
# Kubernetes reads a container's termination message from this file.
TERMINATION_LOG = "/dev/termination-log"
TERMINATION_LOG_ENV = "BRAIN_TERMINATION_LOG"
# Who holds the checkpoint volume (checkpoint/lease.py), as `lease_holder` writes it: the operator names
# the job and its uid, the local runner the job and its work directory. Equal text is one holder: its new
# worker groups (torchrun restarts, replaced pods) take the volume over at once.
LEASE_HOLDER_ENV = "BRAIN_LEASE_HOLDER"
# The checkpoint volume's claim, when it is one: a refused start names it.
CHECKPOINT_CLAIM_ENV = "BRAIN_CHECKPOINT_CLAIM"


def lease_holder(job_name: str, instance: Optional[str]) -> str:
    """`job NAME (INSTANCE)`: the job's uid in a cluster, its work directory locally."""
    return f"job {job_name} ({instance})" if instance else f"job {job_name}"


def job_name(env: Mapping[str, str] = os.environ) -> str:
    """The job's name, from its lease holder (a name has no spaces); "" where no operator or runner started us."""
    words = env.get(LEASE_HOLDER_ENV, "").split()
    return words[1] if len(words) > 1 and words[0] == "job" else ""


# The failure reasons (comma-separated) that fail the job without a restart
# (runPolicy.failurePolicy: FailJob): a trainer failing with one also stops its
# torchrun agent, so that torchrun does not restart the workers in the pod.
FAIL_FAST_ENV = "BRAIN_FAIL_FAST"

# -- rank 0's HTTP endpoint --

METRICS_PORT = 9400
METRICS_PORT_NAME = "metrics"
METRICS_PATH = "/metrics"
PROGRESS_PATH = "/progress"

# -- exit codes and termination messages --

# Why a trainer ended, as `brain.ai/<reason>: <one human line>` in the
# termination log, with an exit code per reason (docs/training.md, "When
# training fails"). The operator reads the reason back (`parse_termination`)
# into the job's conditions and events and decides with it whether to restart
# (runPolicy.failurePolicy); torchrun reports its own exit code, so the
# message, not the code, is what crosses the pod boundary.
REASON_PREFIX = "brain.ai/"
# The trainer was asked to stop (SIGTERM: preemption, eviction, scale-down),
# committed a checkpoint and exited. Retry it; it is not a failure.
PREEMPTED_REASON = "preempted"
STORAGE_FULL = "storage-full"  # ENOSPC/EDQUOT writing a checkpoint, or a save that would not fit
OUT_OF_MEMORY = "out-of-memory"  # host MemoryError or accelerator OOM
DATA_ERROR = "data-error"  # a missing, damaged or undecodable dataset
CONFIG_ERROR_REASON = "config-error"  # a configuration the trainer refuses
COLLECTIVE_TIMEOUT = "collective-timeout"  # a process-group timeout, or a peer that vanished
STALLED = "stalled"  # the hang watchdog stopped a rank that made no progress
FENCED = "fenced"  # a newer worker group (or another job) took the checkpoint volume: this group's commit was refused
NETWORK_ERROR = "network-error"  # the preflight all-reduce or barrier did not complete: a rank missing, a broken network
ERROR = "error"  # anything else: the exception's type and first line
# reason -> exit code. 75 is EX_TEMPFAIL ("try again later"), 65 EX_DATAERR and
# 73 EX_CANTCREAT in sysexits.h; 2 is the usual usage-error code; 80-84 are ours.
EXIT_CODES = {
    PREEMPTED_REASON: 75,
    STORAGE_FULL: 73,
    OUT_OF_MEMORY: 80,
    DATA_ERROR: 65,
    CONFIG_ERROR_REASON: 2,
    COLLECTIVE_TIMEOUT: 81,
    STALLED: 82,
    FENCED: 83,
    NETWORK_ERROR: 84,
    ERROR: 1,
}
REASONS = tuple(EXIT_CODES)
# Reasons a rank reports when something else took it down (a peer's failure, a
# stop request): when several pods fail together, any other reason names the
# cause better, and a stop explains a peer's broken collective.
SECONDARY_REASONS = (PREEMPTED_REASON, COLLECTIVE_TIMEOUT)
PREEMPTED = EXIT_CODES[PREEMPTED_REASON]
CONFIG_ERROR = EXIT_CODES[CONFIG_ERROR_REASON]
# The termination message of a preemption (pods.is_disruption looks for it).
PREEMPTED_MESSAGE = REASON_PREFIX + PREEMPTED_REASON
# Kubernetes keeps at most 4096 bytes of a termination message.
TERMINATION_MESSAGE_MAX = 4096


def termination_message(reason: str, line: str) -> str:
    """`brain.ai/<reason>: <line>`, on one line, within what Kubernetes keeps."""
    text = f"{REASON_PREFIX}{reason}: {' '.join(line.split())}"
    return text[:TERMINATION_MESSAGE_MAX]


_TERMINATION = re.compile(rf"{re.escape(REASON_PREFIX)}([a-z-]+)(?::[ ]?([^\n]*))?")


def parse_termination(message: Optional[str]) -> Optional[tuple[str, str]]:
    """(reason, line) of a trainer's termination message; None for any other text (torchrun's, a log tail)."""
    match = _TERMINATION.search(message or "")
    if match is None or match.group(1) not in EXIT_CODES:
        return None
    return match.group(1), (match.group(2) or "").strip()


def cause_rank(reason: str) -> int:
    """How well a reason explains a group's failure, best first: any primary reason, then preempted, then
    collective-timeout (`min(failures, key=...)` picks the one to report)."""
    return SECONDARY_REASONS.index(reason) + 1 if reason in SECONDARY_REASONS else 0


# -- checkpoint folders --

CHECKPOINT_PREFIX = "step-"
STEP_DIGITS = 8
TMP_SUFFIX = ".tmp"
MANIFEST_FILE = "manifest.json"
_STEP_DIR = re.compile(rf"^{CHECKPOINT_PREFIX}(\d{{{STEP_DIGITS},}})$")


def step_dir_name(step: int) -> str:
    """`step-00000040`: the committed checkpoint of `step`."""
    return f"{CHECKPOINT_PREFIX}{step:0{STEP_DIGITS}d}"


def step_of(name: str) -> Optional[int]:
    """The step a committed checkpoint folder's name holds; None for any other name."""
    match = _STEP_DIR.match(name)
    return int(match.group(1)) if match else None


def checkpoint_path(root: str, step: int) -> str:
    """Where the checkpoint of `step` is committed below the checkpoint folder `root`."""
    return f"{root.rstrip('/')}/{step_dir_name(step)}"


# -- times, as Kubernetes writes them --

TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def format_time(moment: Optional[datetime] = None) -> str:
    """RFC 3339 in UTC, second precision (now when no moment is given)."""
    return (moment or datetime.now(timezone.utc)).astimezone(timezone.utc).strftime(TIME_FORMAT)


def parse_time(text: str) -> datetime:
    return datetime.strptime(text, TIME_FORMAT).replace(tzinfo=timezone.utc)


# -- the progress document --


@dataclass
class Goodput:
    """Where the job's wall time went, across restarts (brain_trainer.goodput)."""

    ratio: float = setting(minimum=0, help="Productive seconds over wall seconds")
    wall_seconds: float = setting(minimum=0, help="From the first trainer's start to the latest entry")
    productive_seconds: float = setting(0.0, minimum=0, help="Steps that moved the job past the furthest step reached")
    recomputed_seconds: float = setting(0.0, minimum=0, help="Steps run again after a restart (work lost since the last commit)")
    checkpoint_seconds: float = setting(0.0, minimum=0, help="The training loop waiting for checkpoint saves")
    initialization_seconds: float = setting(0.0, minimum=0, help="Trainer starts up to their first step: process group, build, restore")
    evaluation_seconds: float = setting(0.0, minimum=0, help="Evaluation passes")
    waiting_seconds: float = setting(0.0, minimum=0, help="Between trainers: restarts, rendezvous, rescheduling")


@dataclass
class Progress:
    """Rank 0's latest progress report: written at each logging step, served at /progress."""

    step: int = setting(minimum=0, help="Optimizer steps completed")
    total_steps: Optional[int] = setting(None, minimum=0, help="Optimizer steps the job will run")
    loss: Optional[float] = setting(None, help="Training loss of the last logged step, averaged over ranks")
    tokens_per_second: Optional[float] = setting(None, minimum=0, help="Training throughput over all ranks")
    mfu: Optional[float] = setting(
        None, minimum=0, help="Model FLOPs utilisation: counted training FLOPs x tokens/s over the devices' peak "
        "(metrics.peakFlops or a known GPU's); absent on CPU"
    )
    eta_seconds: Optional[float] = setting(None, minimum=0, help="Estimated seconds until the last step")
    last_checkpoint_step: Optional[int] = setting(None, minimum=0, help="Step of the newest committed checkpoint (status shows it as lastCheckpoint)")
    eval_loss: Optional[float] = setting(None, help="Held-out loss of the newest evaluation on the validation split, over all ranks")
    checkpoint_request: Optional[str] = setting(None, help="The newest checkpoint request answered (the brain.ai/checkpoint-now value)")
    checkpoint_request_step: Optional[int] = setting(None, minimum=0, help="Step of the checkpoint committed for checkpointRequest")
    checkpoint_interval_steps: Optional[int] = setting(
        None, minimum=0, help="Steps between checkpoints in use (chosen by Young/Daly under intervalSteps auto)"
    )
    goodput: Optional[Goodput] = setting(None, help="Where the job's wall time went (status shows it as goodput)")
    restarts: Optional[int] = setting(
        None, minimum=0, help="Worker-group restarts of the run, each once: a failure on any node, a pod replaced"
    )
    in_pod_restarts: Optional[int] = setting(
        None, minimum=0, help="Of those, the ones torchrun made inside rank 0's pod (elastic.maxRestarts)"
    )
    last_in_pod_restart: Optional[str] = setting(
        None, help="Why the latest of them happened: the failed attempt's reason and line"
    )
    profile: Optional[str] = setting(None, help="The folder of the run's profile (spec.profiling) once rank 0 wrote its "
                                     "trace there; every rank writes its own at the same step")
    updated_at: Optional[str] = setting(None, help="When it was written (RFC 3339, UTC)")

    def to_json(self) -> str:
        return json.dumps(to_dict(self), sort_keys=True) + "\n"

    @classmethod
    def read(cls, doc: Any) -> Optional["Progress"]:
        """The well-formed fields of a parsed document; None without a valid step (no document, garbage).

        A field holding NaN, Infinity or a number past JSON_SAFE_INTEGER (anywhere inside it) is left out: the
        document comes over the network from a worker, and such a number would fail the operator's
        arithmetic or reach the status patch.
        """
        if isinstance(doc, Mapping):
            doc = {key: value for key, value in doc.items() if _numbers_in_range(value)}
        try:
            return from_dict(cls, valid_fields(cls, doc))
        except ConfigError:
            return None

    @classmethod
    def from_json(cls, text: str | bytes) -> Optional["Progress"]:
        """`read` of JSON text; None for text that is not JSON (a torn write, a foreign writer)."""
        try:
            return cls.read(json.loads(text))
        except ValueError:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            return None


# RFC 8259 section 6: the integers every JSON reader holds exactly. A progress document's numbers are counts,
# seconds and ratios far below it.
JSON_SAFE_INTEGER = 2**53 - 1


def _numbers_in_range(value: Any) -> bool:
    """Every number in `value` finite and within ±JSON_SAFE_INTEGER (NaN compares false, so it fails too)."""
    if isinstance(value, bool):
        return True
    if isinstance(value, (int, float)):
        return abs(value) <= JSON_SAFE_INTEGER
    if isinstance(value, Mapping):
        return all(_numbers_in_range(v) for v in value.values())
    if isinstance(value, list):
        return all(_numbers_in_range(v) for v in value)
    return True


def eta_seconds(step: int, total_steps: int, seconds_per_step: float) -> float:
    return max(0, total_steps - step) * seconds_per_step


def perplexity(loss: float) -> float:
    """exp(loss), the held-out loss as readers quote it; capped where exp would overflow a float (~709)."""
    return math.exp(min(loss, 700.0))
