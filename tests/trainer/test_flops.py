"""FLOPs and MFU: the counted FLOPs per token (model.flop_count), their formula (config.model_flops), MFU (observe.flops)."""

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from brain_trainer.config import ModelConfig, TrainerConfig
from brain_trainer.config.model_flops import six_n_flops_per_token, training_flops_per_token
from brain_trainer.config.presets import param_count, preset_config
from brain_trainer.contract import PROGRESS_FILE_ENV, Progress
from brain_trainer.loop.loss import loss_fn
from brain_trainer.loop.train import train
from brain_trainer.model.brain_ai import BrainAI
from brain_trainer.model.flop_count import COUNTS, count_training_flops, counted_flops_per_token
from brain_trainer.observe.flops import mfu, peak_flops


@pytest.mark.parametrize("preset, seq_len, vocab_size", [
    ("minimal", 128, None),
    ("minimal", 512, 4096),  # a tokenizer's vocabulary: a wider head
    ("1b", 2048, None),
    ("3b", 1000, None),  # not a multiple of the recurrence's chunk
    ("7b", 4096, 128256),
])
def test_the_formula_is_what_flop_counter_mode_counts_on_the_real_model(preset, seq_len, vocab_size):
    """Tolerance: none. The formula mirrors the modules term by term, so the estimate's figure is the trainer's."""
    counted = counted_flops_per_token(ModelConfig(preset=preset, vocab_size=vocab_size), seq_len, loss_fn)
    model = preset_config(preset, **({} if vocab_size is None else {"vocab_size": vocab_size}))
    assert counted == training_flops_per_token(model, seq_len)


def test_attention_makes_the_count_grow_with_the_sequence_length():
    cfg = ModelConfig(preset="1b")
    short, long = (counted_flops_per_token(cfg, seq_len, loss_fn) for seq_len in (1024, 2048))
    # 1,024 more keys per token in each of 18 causal layers: 2 matmuls x 2 FLOPs x d_model, x3 for backward.
    assert long - short == 18 * 1024 * 2 * 2 * 2048 * 3
    # The usual 6N counts the embeddings as if multiplied and leaves attention out: 11% low at 2,048 tokens.
    assert six_n_flops_per_token(param_count("1b")) / long == pytest.approx(0.891, abs=1e-3)


def test_the_meta_count_is_a_real_steps_count():
    """One real CPU step of a batch of 3 (math attention: the kernel FlopCounterMode sees on meta) counts 3x one
    sequence on meta; the fused CPU kernel would be invisible to FlopCounterMode, hence the math path."""
    torch.manual_seed(0)
    model = BrainAI.from_preset("minimal")
    tokens = torch.randint(0, 256, (3, 64))
    with sdpa_kernel(SDPBackend.MATH):
        real = count_training_flops(model, tokens, loss_fn)
    assert model.reasoning.blocks[0].q.weight.grad is not None  # the backward ran
    assert real == 3 * 64 * counted_flops_per_token(ModelConfig(preset="minimal"), 64, loss_fn)


@pytest.mark.parametrize("groups", [1, 8])
def test_a_convolutions_gradients_cost_what_its_forward_does(groups):
    """FlopCounterMode's own formula counts a depthwise convolution's weight gradient d_model times over."""
    conv = nn.Conv1d(8, 8, 4, groups=groups)
    x = torch.randn(2, 8, 32, requires_grad=True)
    forward = FlopCounterMode(display=False)
    with forward:
        y = conv(x)
    both = FlopCounterMode(display=False, custom_mapping=COUNTS)
    with both:
        y.sum().backward()
    assert both.get_total_flops() == 2 * forward.get_total_flops() == 2 * (2 * 2 * 29 * 8 * (8 // groups) * 4)


def test_a_model_that_cannot_run_on_meta_is_not_counted():
    assert counted_flops_per_token(ModelConfig(entrypoint="user_models:data_dependent"), 16, loss_fn) is None


def test_mfu_in_progress_and_log_uses_the_counted_flops(tmp_path, monkeypatch, caplog):
    """A real run on the CPU with a configured peak: MFU = tokens/s x the counted FLOPs per token / peak."""
    for key, value in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT="0").items():
        monkeypatch.setenv(key, value)
    progress = tmp_path / "progress.json"
    monkeypatch.setenv(PROGRESS_FILE_ENV, str(progress))
    peak, seq_len = 1e9, 32
    cfg = TrainerConfig.from_dict({
        "training": {"steps": 4, "seq_len": seq_len, "micro_batch_size": 2, "log_interval": 2},
        "checkpoint": {"enabled": False},
        "metrics": {"port": 0, "peak_flops": peak},
    })
    with caplog.at_level("INFO", logger="brain_trainer"):
        train(cfg)
    final = Progress.from_json(progress.read_text())
    counted = training_flops_per_token(preset_config("minimal"), seq_len)
    assert final.mfu == pytest.approx(final.tokens_per_second * counted / peak, rel=1e-12)
    assert f"model FLOPs per token: {counted:.3g} at sequence length {seq_len}" in caplog.text
    assert f"mfu {final.mfu:.1%}" in caplog.text


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
    per_token = 42e9
    # 8 H100s at 9,420 tokens/s each at 42 GFLOPs per token: 42e9 x 75,360 / (8 x 989e12) = 0.40
    assert mfu(8 * 9420, per_token, 989e12, 8) == pytest.approx(0.40, abs=1e-3)
    assert mfu(1000.0, per_token, None, 8) is None


def test_braintrain_estimate_prints_the_count_the_trainer_makes(capsys):
    from brain_operator.cli import main

    example = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "gpu-7b-fsdp.yaml"
    assert main(["estimate", str(example)]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("model FLOPs per token"))
    counted = counted_flops_per_token(ModelConfig(preset="7b"), 4096, loss_fn)
    assert line == (f"model FLOPs per token: {counted:.3g} at sequence length 4096, forward and backward "
                    f"(6 x parameters: {six_n_flops_per_token(param_count('7b')):.3g})")
