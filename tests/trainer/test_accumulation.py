"""GradientAccumulator: k micro-steps equal one big step, and ranks sync only on boundaries."""

import math

import pytest
import torch
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from brain_trainer import DDPWrapper, DistributedConfig, FSDPWrapper, GradientAccumulator
from brain_trainer.parallel.fsdp import unit_names
from harness import run_ranks
from parity import global_batches, lm_loss, minimal_model, optimizer_for, rank_slice, reference_gradients

K = 2  # micro-steps per optimizer step in the distributed runs
MICRO_BATCH = 2
CLIP = 0.05  # well below the initial gradient norm, so clipping really scales


def _capture_grads(optimizer, model):
    """Record the gradients the optimizer is about to apply (full tensors, also under FSDP)."""
    captured = []

    def hook(opt, args, kwargs):
        grads = {}
        for name, p in model.named_parameters():
            g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
            grads[name.removeprefix("module.")] = g.detach().clone()
        captured.append(grads)

    optimizer.register_step_pre_hook(hook)
    return captured


def _max_diff(a, b):
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def _norm(grads):
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads.values()])).item()


def _accumulate(model, acc, optimizer, micro_batches, counter):
    """The training loop's pattern; per micro-step: (stepped, reductions during it, logged grad norm)."""
    trace = []
    for micro_idx, tokens in enumerate(micro_batches):
        before = counter[0]
        with acc.sync_context(micro_idx):
            loss = lm_loss(model, tokens)
            stepped = acc.step(loss, optimizer, micro_idx)
        trace.append((stepped, counter[0] - before, acc.last_grad_norm))
    return trace


def _parameter_groups(model):
    """FSDP units (root included) that own a parameter no deeper unit owns: one reduce-scatter each."""
    units = ("",) + unit_names(model)
    owners = {max((u for u in units if not u or name.startswith(u + ".")), key=len)
              for name, _ in model.named_parameters()}
    return len(owners)


def _micro_batches(rank, world_size):
    """Two accumulation windows; each micro-step's global batch is sliced over the ranks."""
    return [rank_slice(t, rank, world_size) for t in global_batches(2 * K, MICRO_BATCH * world_size)]


def _ddp_run(rank, world_size):
    model = DDPWrapper(minimal_model(), DistributedConfig(strategy="ddp")).setup(rank, world_size)
    counter = [0]

    def counting_hook(state, bucket):
        counter[0] += 1
        return allreduce_hook(state, bucket)

    model.register_comm_hook(None, counting_hook)
    return _counted_accumulation(model, counter, rank, world_size)


def _fsdp_run(rank, world_size):
    model = FSDPWrapper(minimal_model(), DistributedConfig(strategy="fsdp")).setup(rank, world_size)
    counter = [0]
    for module in model.modules():
        if isinstance(module, FSDPModule):  # runs once per parameter group per gradient reduction
            module.set_all_reduce_hook(lambda reduced: counter.__setitem__(0, counter[0] + 1))
    return _counted_accumulation(model, counter, rank, world_size)


def _counted_accumulation(model, counter, rank, world_size):
    """K micro-steps through GradientAccumulator: the reduction count per micro-step and the stepped gradients."""
    optimizer = optimizer_for(model)
    captured = _capture_grads(optimizer, model)
    acc = GradientAccumulator(K, model=model, max_grad_norm=CLIP)
    trace = _accumulate(model, acc, optimizer, _micro_batches(rank, world_size), counter)
    return trace, captured[0]


def _accumulation_rank(rank, world_size):
    # the reference is computed here: gradients are too big to send back through the harness queue
    window = torch.cat(global_batches(2 * K, MICRO_BATCH * world_size)[:K])  # everything the first step saw
    reference = reference_gradients(window)
    reference_norm = _norm(reference)
    clipped = {k: g * (CLIP / (reference_norm + 1e-6)) for k, g in reference.items()}
    out = dict(reference_norm=reference_norm)
    for name, run in (("ddp", _ddp_run), ("fsdp", _fsdp_run)):
        trace, grads = run(rank, world_size)
        out[name] = dict(trace=trace, grad_diff=_max_diff(grads, clipped))
    return out


def test_ranks_sync_only_on_boundaries_and_accumulate_the_big_batch_gradient():
    results = run_ranks(_accumulation_rank, 2)
    groups = _parameter_groups(minimal_model())
    for result in results:
        assert result["reference_norm"] > 2 * CLIP  # so clipping really scaled
        for name in ("ddp", "fsdp"):
            run = result[name]
            stepped, reductions, norms = zip(*run["trace"])
            assert stepped == (False, True, False, True), name
            assert reductions[0] == reductions[2] == 0, (name, reductions)  # no traffic mid-window
            assert reductions[1] > 0 and reductions[3] > 0, (name, reductions)
            if name == "fsdp":  # one reduce-scatter per parameter group (DDP rebuilds its buckets after step 1)
                assert reductions[1] == reductions[3] == groups, reductions
            # the optimizer saw the clipped big-batch gradient; the logged norm is the unclipped one
            assert run["grad_diff"] <= 1e-6, (name, run["grad_diff"])
            assert math.isnan(norms[0]) and norms[1] == pytest.approx(result["reference_norm"], rel=1e-5), name


def _single_process_window(k, scaler=None, max_grad_norm=0.0):
    model = minimal_model()
    optimizer = optimizer_for(model)
    captured = _capture_grads(optimizer, model)
    acc = GradientAccumulator(k, scaler, model=model, max_grad_norm=max_grad_norm)
    stepped = []
    for micro_idx, tokens in enumerate(global_batches(k, 3, seed=7)):
        with acc.sync_context(micro_idx):
            stepped.append(acc.step(lm_loss(model, tokens), optimizer, micro_idx))
    return captured, stepped, acc


def test_k_micro_steps_equal_one_step_on_the_k_times_batch():
    captured, stepped, acc = _single_process_window(4)
    assert stepped == [False, False, False, True] and len(captured) == 1
    reference = reference_gradients(torch.cat(global_batches(4, 3, seed=7)))
    assert _max_diff(captured[0], reference) <= 1e-6
    assert acc.last_grad_norm == pytest.approx(_norm(reference), rel=1e-5)  # logged even without clipping


def test_grad_scaler_path_unscales_before_the_step():
    plain, _, _ = _single_process_window(2)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    scaled, stepped, _ = _single_process_window(2, scaler=scaler)
    assert stepped == [False, True]
    assert _max_diff(scaled[0], plain[0]) <= 1e-6  # powers of two scale exactly
    assert scaler.get_scale() == 2.0**10  # finite gradients: no back-off


def test_clipping_bounds_the_norm_the_optimizer_sees():
    captured, _, acc = _single_process_window(2, max_grad_norm=CLIP)
    assert acc.last_grad_norm > CLIP
    assert _norm(captured[0]) == pytest.approx(CLIP, rel=1e-4)


def test_boundaries_and_effective_batch():
    acc = GradientAccumulator(3)
    assert [acc.is_boundary(i) for i in range(7)] == [False, False, True, False, False, True, False]
    assert acc.effective_batch_size(8, 4) == 8 * 3 * 4
    assert math.isnan(acc.last_grad_norm)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: GradientAccumulator(0), r"accumulation_steps: must be an integer >= 1, got 0"),
        (lambda: GradientAccumulator(2.5), r"accumulation_steps: must be an integer >= 1, got 2.5"),
        (lambda: GradientAccumulator(2, max_grad_norm=float("nan")), r"max_grad_norm: must be >= 0, got nan"),
        (lambda: GradientAccumulator(2).is_boundary(-1), r"micro_idx: must be >= 0, got -1"),
        (lambda: GradientAccumulator(2).effective_batch_size(0, 2), r"micro_batch: must be an integer >= 1, got 0"),
        (lambda: GradientAccumulator(2).effective_batch_size(4, -1), r"world_size: must be an integer >= 1, got -1"),
    ],
)
def test_bad_arguments_name_the_argument(call, message):
    with pytest.raises(ValueError, match=message):
        call()
