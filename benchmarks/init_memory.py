"""Peak host memory per rank at initialisation: the whole model built first vs meta-device init.

    .venv/bin/python benchmarks/init_memory.py [--preset 1b] [--worlds 2 4] [--all-ranks]

The 1b preset, FSDP2 full_shard, on CPU. Side by side for each world size:

    whole   torch.manual_seed, BrainAI built whole on the CPU and initialised,
            then sharded (what the trainer did before meta-device init)
    meta    the trainer's own path (loop.wrap.build_and_wrap): built on the meta
            device, sharded, each rank allocating and filling only its shards

Each rank runs alone in a fresh process with the `fake` process group (one
process acts as rank r of world w; collectives return at once, every
allocation is that rank's own), one after another: the whole-model arm at 4
ranks would otherwise need four whole models in memory at the same time.
`tests/trainer/test_meta_init.py` checks the meta arm on 4 real gloo ranks.
The peak is the process's maximum resident set (ru_maxrss). By default rank
0 of each world size is measured (ranks differ only by padding);
--all-ranks measures every rank. Target: meta / whole <= 1.5 / world size.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

MB = 1e6


def child(arm: str, preset: str, world: int, rank: int) -> dict:
    import resource

    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    torch.set_num_threads(1)
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    from brain_trainer.config import TrainerConfig
    from brain_trainer.parallel.fsdp import FSDPWrapper
    from brain_trainer.observe.memory_report import held_parameter_bytes
    from brain_trainer.model.brain_ai import build_model
    from brain_trainer.loop.wrap import build_and_wrap
    from brain_trainer.parallel.run_layout import RunLayout

    cfg = TrainerConfig.from_dict(
        {"model": {"preset": preset}, "distributed": {"strategy": "fsdp", "fsdp_sharding": "full_shard"}}
    ).resolved()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if arm == "whole":
        torch.manual_seed(cfg.training.seed)
        model = FSDPWrapper(build_model(cfg.model), cfg.distributed).setup(rank, world)
    else:
        _, model, _ = build_and_wrap(cfg, RunLayout.from_environment(cfg.distributed, rank, world, torch.device("cpu")))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"peak": peak, "before": before, "held": held_parameter_bytes(model)}


def measure(arm: str, preset: str, world: int, rank: int) -> dict:
    done = subprocess.run(
        [sys.executable, __file__, "--child", arm, preset, str(world), str(rank)],
        capture_output=True, text=True, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="1b")
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--all-ranks", action="store_true", help="measure every rank, not only rank 0")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        arm, preset, world, rank = args.child
        print(json.dumps(child(arm, preset, int(world), int(rank))))
        return

    from brain_trainer.config.presets import param_count

    whole_fp32 = 4 * param_count(args.preset)
    print(f"preset {args.preset}: {whole_fp32 / MB:.0f} MB of fp32 parameters; FSDP2 full_shard on CPU, peak resident set per rank")
    print(f"{'world':>5} {'rank':>4} {'whole build MB':>15} {'meta init MB':>13} {'held MB':>8} {'ratio':>6} {'target':>7}")
    for world in args.worlds:
        for rank in range(world) if args.all_ranks else [0]:
            whole = measure("whole", args.preset, world, rank)
            meta = measure("meta", args.preset, world, rank)
            ratio = meta["peak"] / whole["peak"]
            target = 1.5 / world
            print(f"{world:>5} {rank:>4} {whole['peak'] / MB:>15.0f} {meta['peak'] / MB:>13.0f} {meta['held'] / MB:>8.0f} "
                  f"{ratio:>6.3f} {target:>7.3f}{'' if ratio <= target else '  (above target)'}")
    print("process before building (torch imported, group joined): "
          f"{meta['before'] / MB:.0f} MB; ratio = meta init / whole build")


if __name__ == "__main__":
    main()
