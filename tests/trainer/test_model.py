"""BrainAI: parameter counts, causality, gradients to every parameter, meta init, wrap units, entrypoints."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from brain_trainer import BrainAI, ConfigError
from brain_trainer.config import ModelConfig
from brain_trainer.model.brain_ai import SCAN_CHUNK, Spike, build_model, gated_scan
from brain_trainer.config.presets import (
    MODEL_PRESETS,
    NOMINAL_PARAMS,
    STACKS,
    module_param_counts,
    param_count,
    wrap_unit_params,
)
from harness import run_ranks


def _minimal(seed: int = 0) -> BrainAI:
    torch.manual_seed(seed)
    return BrainAI.from_preset("minimal")


def _lm_loss(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


@pytest.mark.parametrize("name", list(MODEL_PRESETS))
def test_preset_parameter_counts_on_meta(name):
    with torch.device("meta"):
        model = BrainAI.from_preset(name)
    real = sum(p.numel() for p in model.parameters())
    assert real == param_count(name)
    assert abs(real - NOMINAL_PARAMS[name]) <= 0.1 * NOMINAL_PARAMS[name]
    per_module = {n: sum(p.numel() for p in m.parameters()) for n, m in model.named_children()}
    assert per_module == module_param_counts(MODEL_PRESETS[name])
    assert all(p.is_meta for p in model.parameters())


def test_forward_shape_deterministic_and_causal():
    model = _minimal()
    torch.manual_seed(1)
    tokens = torch.randint(0, 256, (2, 45))  # not a multiple of the scan chunk
    logits = model(tokens)
    assert logits.shape == (2, 45, 256) and logits.dtype == torch.float32
    assert torch.equal(logits, model(tokens))
    # change one byte: earlier logits must not move, that position's must
    for t in (0, SCAN_CHUNK - 1, SCAN_CHUNK + 3, 44):
        changed = tokens.clone()
        changed[:, t] = (changed[:, t] + 1) % 256
        out = model(changed)
        torch.testing.assert_close(out[:, :t], logits[:, :t], rtol=0, atol=1e-6)
        assert not torch.allclose(out[:, t], logits[:, t])


def test_every_parameter_gets_a_nonzero_gradient():
    model = _minimal()
    _lm_loss(model, torch.randint(0, 256, (4, 65))).backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert missing == []


def test_seeded_construction_is_reproducible():
    a, b, c = _minimal(7), _minimal(7), _minimal(8)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), name
    assert not all(torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters()))


def test_meta_model_materialises_with_to_empty_and_init_weights():
    with torch.device("meta"):
        model = BrainAI.from_preset("minimal")
    model.to_empty(device="cpu")
    torch.manual_seed(3)
    model.init_weights()
    reference = _minimal()
    torch.manual_seed(3)
    reference.init_weights()
    # init_weights alone decides every value: the uninitialised storage left no trace
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.equal(p, q), name
    assert torch.isfinite(model(torch.randint(0, 256, (2, 32)))).all()


def test_wrap_units_run_in_forward_order_and_cover_every_parameter():
    model = _minimal()
    units = model.wrap_units()
    finished: list[torch.nn.Module] = []
    for unit in units:
        unit.register_forward_hook(lambda module, args, out: finished.append(module))
    model(torch.randint(0, 256, (1, 8)))
    assert finished == units
    # blocks and the modules without blocks partition the parameters
    leaves = [u for u in units if not any(o is not u and o in set(u.modules()) for o in units)]
    owned = [id(p) for u in leaves for p in u.parameters()]
    assert sorted(owned) == sorted(id(p) for p in model.parameters())
    assert [sum(p.numel() for p in u.parameters()) for u in leaves] == wrap_unit_params(model.cfg)
    assert len(leaves) == 3 + sum(len(getattr(model, name).blocks) for name in STACKS)


def test_sequence_longer_than_max_seq_len_is_refused():
    model = BrainAI.from_preset("minimal", max_seq_len=16)
    with pytest.raises(ValueError, match="max_seq_len 16"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_a_resized_vocabulary_embeds_predicts_and_hashes_its_ids():
    """Bytes hash as they always did (begin-of-sequence 256); a large vocabulary stays in range without overflow."""
    with torch.device("meta"):
        bytes_model, large = BrainAI.from_preset("minimal"), BrainAI.from_preset("minimal", vocab_size=200_000)
    assert large.encoders.embed.num_embeddings == large.heads.lm_head.out_features == 200_000
    tokens = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(0))
    for order in (2, 3):
        padded = F.pad(tokens, (order - 1, 0), value=256)
        ids = torch.full_like(tokens, order)
        for i in range(order):
            ids = ids * 257 + padded[:, i : i + 40]
        assert torch.equal(bytes_model.encoders.ngram_ids(tokens, order), ids * 2654435761 % 2**32 % 12288)
    wide = torch.randint(0, 200_000, (2, 40), generator=torch.Generator().manual_seed(1))
    buckets = large.encoders.ngram_ids(wide, 3)
    assert 0 <= buckets.min() and buckets.max() < 12288 and len(buckets.unique()) > 60


def test_preset_errors_name_the_field():
    with pytest.raises(ConfigError) as err:
        BrainAI.from_preset("400b")
    assert err.value.errors[0].path == "model.preset" and "'400b'" in str(err.value)
    with pytest.raises(ConfigError) as err:
        BrainAI.from_preset("minimal", n_heads=3)
    assert err.value.errors[0].path == "model.n_heads"
    with pytest.raises(ConfigError) as err:
        BrainAI.from_preset("minimal", depth=3)
    assert err.value.errors[0].path == "model.depth"


def test_gated_scan_matches_the_sequential_recurrence():
    torch.manual_seed(0)
    for T in (1, SCAN_CHUNK, 3 * SCAN_CHUNK + 5):
        log_a = -4.0 * torch.rand(2, T, 3, dtype=torch.float64)
        log_a[:, T // 2] = -1e-6  # near-perfect memory next to strong forgetting
        b = torch.rand(2, T, 3, dtype=torch.float64)
        h, expected = torch.zeros(2, 3, dtype=torch.float64), []
        for t in range(T):
            h = log_a[:, t].exp() * h + b[:, t]
            expected.append(h)
        got = gated_scan(log_a.float(), b.float())
        torch.testing.assert_close(got.double(), torch.stack(expected, 1), rtol=1e-5, atol=1e-6)


def test_spike_is_a_step_with_surrogate_gradient():
    v = torch.tensor([-1.0, -0.1, 0.2, 2.0], requires_grad=True)
    spikes = Spike.apply(v, 5.0)
    spikes.sum().backward()
    assert spikes.tolist() == [0.0, 0.0, 1.0, 1.0]
    torch.testing.assert_close(v.grad, 1 / (1 + 5.0 * v.detach().abs()) ** 2)


def test_build_model_from_preset_and_entrypoint(tmp_path, monkeypatch):
    (tmp_path / "factory_models.py").write_text(
        textwrap.dedent(
            """
            import torch

            class Factory:
                @staticmethod
                def tiny():
                    return torch.nn.Sequential(torch.nn.Embedding(256, 8), torch.nn.Linear(8, 256))

            def not_a_module():
                return 42

            def broken():
                raise RuntimeError("no weights here")

            NOT_CALLABLE = 3
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    # Its own module name: tests/trainer/user_models.py is the one other tests import as `user_models`.
    monkeypatch.delitem(sys.modules, "factory_models", raising=False)
    assert isinstance(build_model(ModelConfig(preset="minimal")), BrainAI)
    tiny = build_model(ModelConfig(entrypoint="factory_models:Factory.tiny"))
    assert tiny(torch.zeros(2, 5, dtype=torch.long)).shape == (2, 5, 256)

    cases = {
        "no_such_module_xyz:make": "cannot import module 'no_such_module_xyz'",
        "factory_models:missing": "has no attribute 'missing'",
        "factory_models:NOT_CALLABLE": "is not callable",
        "factory_models:not_a_module": "must return a torch.nn.Module, returned int",
        "factory_models:broken": "raised RuntimeError: no weights here",
    }
    for value, message in cases.items():
        with pytest.raises(ConfigError) as err:
            build_model(ModelConfig(entrypoint=value))
        (error,) = err.value.errors
        assert error.path == "model.entrypoint"
        assert message in error.message and repr(value) in error.message


def _ddp_two_steps(rank: int, world_size: int) -> float:
    torch.manual_seed(0)
    model = DistributedDataParallel(BrainAI.from_preset("minimal"), find_unused_parameters=False)
    data = torch.Generator().manual_seed(100 + rank)  # each rank its own batch
    for _ in range(2):  # DDP reports parameters left without gradient on the step after
        model.zero_grad()
        _lm_loss(model, torch.randint(0, 256, (2, 33), generator=data)).backward()
        assert all(p.grad.abs().sum() > 0 for p in model.parameters())
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    gathered = [torch.empty_like(grads) for _ in range(world_size)]
    dist.all_gather(gathered, grads)
    assert torch.equal(gathered[0], gathered[1]), "DDP gradients differ across ranks"
    return grads.norm().item()


def test_ddp_without_unused_parameter_search_averages_gradients():
    rank0, rank1 = run_ranks(_ddp_two_steps, 2)
    assert rank0 == rank1 > 0
