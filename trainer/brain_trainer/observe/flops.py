"""Model FLOPs utilisation (pure, torch-free): achieved training FLOP/s over the devices' peak.

The FLOPs per token are the model's own, counted once at start
(model/flop_count.py; config/model_flops.py is the same figure as a formula),
without recomputation: PaLM's MFU, so figures compare across jobs and devices.
"""

from __future__ import annotations

from typing import Optional

# Dense bf16 tensor-core peak of one device in FLOP/s (vendor data sheets), matched by
# substring of torch.cuda.get_device_name(), most specific first.
PEAK_FLOPS: tuple[tuple[str, float], ...] = (
    ("GB200", 2.5e15),
    ("B200", 2.25e15),
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),
    ("H800", 989e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
)


def peak_flops(device_name: Optional[str], override: Optional[float] = None) -> Optional[float]:
    """One device's peak: the configured figure, else the table's for a known GPU, else None (CPU, unknown)."""
    if override is not None:
        return override
    if device_name is None:
        return None
    return next((peak for key, peak in PEAK_FLOPS if key in device_name), None)


def mfu(tokens_per_second: float, flops_per_token: float, peak_per_device: Optional[float], devices: int) -> Optional[float]:
    """The fraction of the devices' peak the training achieves; None without a peak."""
    if peak_per_device is None:
        return None
    return tokens_per_second * flops_per_token / (peak_per_device * devices)
