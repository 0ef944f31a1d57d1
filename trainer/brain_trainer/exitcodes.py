"""Exit codes and termination messages shared by the trainer and the operator (torch-free)."""

# The trainer was asked to stop (SIGTERM: preemption, eviction, scale-down),
# committed a checkpoint and exited. Retry it; it is not a failure.
# 75 is EX_TEMPFAIL in sysexits.h: "try again later".
PREEMPTED = 75

# Written to the container's termination log (/dev/termination-log) alongside
# PREEMPTED, so the operator can tell a preemption even when torchrun
# reports its own exit code.
PREEMPTED_MESSAGE = "brain.ai/preempted"
