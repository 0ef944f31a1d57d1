"""MFU (brain_trainer.observe.flops): pure."""

import pytest

from brain_trainer.observe.flops import mfu, peak_flops, training_flops_per_token


@pytest.mark.parametrize("name, peak", [
    ("NVIDIA H100 80GB HBM3", 989e12),
    ("NVIDIA H100 PCIe", 756e12),
    ("NVIDIA H200", 989e12),
    ("NVIDIA A100-SXM4-80GB", 312e12),
    ("NVIDIA L4", 121e12),
    ("NVIDIA L40S", 362e12),
    ("Tesla T4", None),
    (None, None),  # CPU
])
def test_known_gpus_have_their_bf16_dense_peak(name, peak):
    assert peak_flops(name) == peak


def test_a_configured_peak_wins_even_on_cpu():
    assert peak_flops("NVIDIA H100 80GB HBM3", 500e12) == 500e12
    assert peak_flops(None, 1e12) == 1e12


def test_mfu_is_achieved_over_peak_flops_of_all_devices():
    per_token = training_flops_per_token(7_000_000_000)
    assert per_token == 42e9
    # 8 H100s at 9,420 tokens/s each on a 7B model: 42e9 x 75,360 / (8 x 989e12) = 0.40
    assert mfu(8 * 9420, per_token, 989e12, 8) == pytest.approx(0.40, abs=1e-3)
    assert mfu(1000.0, per_token, None, 8) is None
