"""The goodput ledger (pure, torch-free): where a job's wall time went, across every restart.

Rank 0 keeps one ledger per run (the torchrun run id: the job's uid in a
cluster) in the checkpoint folder, which outlives pods and worker groups:

- productive: optimizer steps that moved the job past the furthest step it
  had reached (the high-water mark);
- recomputed: steps run again after a restart, up to the high-water mark
  (the work lost since the last commit);
- checkpoint: the loop waiting for saves (staging, blocking saves, the final commit);
- initialization: a trainer's start up to its first step (importing torch,
  process group, build, restore), and that first step itself when the blocks
  are compiled (torch.compile compiles them lazily, at their first call);
- evaluation: evaluation passes on the held-out split;
- waiting: between one trainer's last ledger entry and the next trainer's
  start: restarts, rendezvous, rescheduling; where the previous trainer died,
  also the moments it ran after its last entry.

Every trainer start after the first is a restart; those torchrun made inside
rank 0's pod (elastic.maxRestarts) are also counted as in-pod restarts, with
the reason of the latest. What one cost is in the parts above: waiting (the
failed attempt's end to the next start), initialization, and the steps
recomputed since the last commit.

Each part is measured by its own clock; wall time is the span from the first
trainer's start to the last entry, so the parts adding up to it is a check.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Optional

from ..contract import Goodput

PRODUCTIVE, RECOMPUTED, CHECKPOINT, INITIALIZATION, EVALUATION, WAITING = (
    "productive", "recomputed", "checkpoint", "initialization", "evaluation", "waiting",
)
KINDS = (PRODUCTIVE, RECOMPUTED, CHECKPOINT, INITIALIZATION, EVALUATION, WAITING)


@dataclass(frozen=True)
class Ledger:
    run_id: str
    started_at: float  # epoch seconds: the first trainer's start
    updated_at: float  # epoch seconds: the latest entry
    high_water: int = 0  # the furthest step any trainer of the run completed
    restarts: int = 0  # trainers of the run after the first: worker-group restarts caused on any node, pod replacements
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(KINDS, 0.0))
    in_pod_restarts: int = 0  # of the restarts, those torchrun made inside rank 0's pod (elastic.maxRestarts)
    last_in_pod_restart: str = ""  # why the latest of them happened: `reason: line`
    agent: str = ""  # rank 0's torchrun agent at the latest start (host:pid) ...
    agent_restarts: int = 0  # ... and its count of restarts then (TORCHELASTIC_RESTART_COUNT)

    @classmethod
    def begin(cls, previous: Optional["Ledger"], run_id: str, now: float, *, agent: str = "", agent_restarts: int = 0,
              restarted_after: Optional[str] = None) -> "Ledger":
        """This trainer's ledger: the run's, one restart more, with the gap since its last entry as waiting; or a new one.

        `agent` and `agent_restarts` say which torchrun started this trainer and how often it had restarted its
        workers after a failure (TORCHELASTIC_RESTART_COUNT), the latest because of `restarted_after`. A start by
        the agent of the previous one is an in-pod restart, also when torchrun restarted for a peer pod's failure
        without counting it; a new agent (a replaced pod) brings the restarts it made before this start.
        """
        if previous is None or previous.run_id != run_id:
            base = cls(run_id=run_id, started_at=now, updated_at=now)
            in_pod = agent_restarts
        else:
            base = replace(previous.add(WAITING, max(0.0, now - previous.updated_at), now), restarts=previous.restarts + 1)
            in_pod = max(1, agent_restarts - previous.agent_restarts) if previous.agent == agent else agent_restarts
        return replace(
            base,
            # Attempts that died before their first entry (or without a ledger on disk) are restarts too: torchrun
            # counted them.
            restarts=max(base.restarts, base.in_pod_restarts + in_pod),
            in_pod_restarts=base.in_pod_restarts + in_pod,
            last_in_pod_restart=(restarted_after or "") if in_pod else base.last_in_pod_restart,
            agent=agent,
            agent_restarts=agent_restarts,
        )

    def add(self, kind: str, seconds: float, now: float) -> "Ledger":
        return replace(self, seconds={**self.seconds, kind: self.seconds[kind] + seconds}, updated_at=now)

    def step(self, step: int, seconds: float, now: float, kind: Optional[str] = None) -> "Ledger":
        """A completed optimizer step: productive past the high-water mark, else recomputed; or `kind`, whose
        time it mostly was (a compiling first step: initialization). The step counts as reached all the same."""
        kind = kind or (PRODUCTIVE if step > self.high_water else RECOMPUTED)
        return replace(self.add(kind, seconds, now), high_water=max(self.high_water, step))

    @property
    def wall_seconds(self) -> float:
        return self.updated_at - self.started_at

    @property
    def ratio(self) -> Optional[float]:
        """Productive time over wall time; None before any time has passed."""
        return self.seconds[PRODUCTIVE] / self.wall_seconds if self.wall_seconds > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: Any) -> Optional["Ledger"]:
        """A ledger read back; None for anything else (a foreign or damaged file starts a new one)."""
        try:
            seconds = {kind: float(doc["seconds"][kind]) for kind in KINDS}
            return cls(run_id=str(doc["run_id"]), started_at=float(doc["started_at"]),
                       updated_at=float(doc["updated_at"]), high_water=int(doc["high_water"]),
                       restarts=int(doc["restarts"]), seconds=seconds,
                       # Absent from a ledger an older trainer wrote: the run continues with none counted.
                       in_pod_restarts=int(doc.get("in_pod_restarts", 0)),
                       last_in_pod_restart=str(doc.get("last_in_pod_restart", "")),
                       agent=str(doc.get("agent", "")), agent_restarts=int(doc.get("agent_restarts", 0)))
        except (TypeError, KeyError, ValueError):
            return None


def summary(ledger: Ledger) -> Goodput:
    """What the progress document, status.goodput and the run summary show."""
    return Goodput(ratio=ledger.ratio or 0.0, wall_seconds=ledger.wall_seconds,
                   **{f"{kind}_seconds": seconds for kind, seconds in ledger.seconds.items()})
