"""The byte sizes the planner counts in, and how it prints them (torch-free)."""

from __future__ import annotations

MIB = 1024**2
GIB = 1024**3
RUNTIME_OVERHEAD_BYTES = 1 * GIB  # the CUDA context, communication buffers and allocator slack

PARAM_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
ADAM_MOMENT_BYTES = 8  # exp_avg and exp_avg_sq in fp32
MASTER_WEIGHT_BYTES = 4  # fp32 copy kept by the optimizer when parameters are 16-bit
LOGIT_BYTES = 4  # logits and log-probabilities are float32 for the loss


def gib_rows(rows: list[tuple[str, int]]) -> list[str]:
    """A summary's table: one indented line per (term, bytes), in GiB."""
    return [f"  {name:<17}{size / GIB:9.2f} GiB" for name, size in rows]


def quantity(size: int) -> str:
    """Bytes as a Kubernetes quantity: whole Gi when exact, else Mi."""
    return f"{size // GIB}Gi" if size % GIB == 0 else f"{-(-size // MIB)}Mi"
