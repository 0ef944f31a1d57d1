"""The preflight (resilience/preflight.py): two gloo ranks run one all-reduce and a barrier before the first step; a
rank that never joins is named, with the network's variables, within the preflight's timeout, as network-error."""

import os
import sys
import textwrap

from processes import start

import brain_trainer
from brain_trainer import contract
from brain_trainer.parallel.launcher import held_port

HERE = os.path.dirname(os.path.abspath(__file__))
# The children import this checkout's trainer, whatever the working directory.
TRAINER_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(brain_trainer.__file__)))

# One rank: join the process group, then (unless held back until `release` exists) the preflight.
RANK = textwrap.dedent("""
    import os, pathlib, sys, time
    from datetime import timedelta
    import torch, torch.distributed as dist
    from brain_trainer.resilience.preflight import run_preflight
    rank, held, release = int(os.environ["RANK"]), sys.argv[1] == "held", pathlib.Path(sys.argv[2])
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=120))
    print(f"rank {rank} in the group", flush=True)
    if held:
        while not release.exists():  # a rank stuck before the first step (a slow build, a lost node)
            time.sleep(0.05)
        os._exit(0)
    done = run_preflight(float(sys.argv[3]), rank, 2, torch.device("cpu"), ranks_per_node=2)  # one node
    print(f"preflight {done.all_reduce_seconds:.3f} {done.barrier_seconds:.3f}", flush=True)
""")


def rank(tmp_path, port, index, held, seconds="2"):
    env = {**os.environ, "RANK": str(index), "LOCAL_RANK": str(index), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "NCCL_SOCKET_IFNAME": "eth0",
           "BRAIN_TERMINATION_LOG": str(tmp_path / f"term{index}"),
           "PYTHONPATH": os.pathsep.join([TRAINER_ROOT, os.environ.get("PYTHONPATH", "")])}
    return start([sys.executable, "-c", RANK, "held" if held else "joins", tmp_path / "release", seconds],
                 timeout=120, env=env, cwd=HERE)


def test_a_rank_that_never_joins_the_preflight_is_named_within_its_timeout(tmp_path):
    with held_port() as port, rank(tmp_path, port, 0, held=False) as rank0, rank(tmp_path, port, 1, held=True) as rank1:
        code = rank0.wait()
        (tmp_path / "release").touch()
        rank1.wait()
    assert code == contract.EXIT_CODES[contract.NETWORK_ERROR], rank0.output[-3000:]
    reason, line = contract.parse_termination((tmp_path / "term0").read_text())
    assert reason == contract.NETWORK_ERROR
    # Both ranks share one node here, so rank 1 is named with the host that node's rank 0 reported.
    assert line.startswith("rank 1 (pod ") and "did not join the all-reduce within 2 s; NCCL_SOCKET_IFNAME=eth0" in line
    assert f"network-error: {line}" in rank0.output


def test_ranks_that_join_pass_the_preflight_and_say_how_long_it_took(tmp_path):
    with held_port() as port, rank(tmp_path, port, 0, False, "60") as rank0, rank(tmp_path, port, 1, False, "60") as rank1:
        codes = [rank0.wait(), rank1.wait()]
    assert codes == [0, 0], rank0.output[-3000:]
    assert all("preflight " in r.output for r in (rank0, rank1)) and not (tmp_path / "term0").exists()


def test_doctor_prints_the_variables_the_backend_the_devices_and_a_timed_all_reduce(capsys, monkeypatch):
    from brain_operator.cli import main

    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth0")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TRAINER_ROOT, os.environ.get("PYTHONPATH", "")]))
    example = os.path.join(HERE, "..", "..", "deploy", "examples", "local-minimal.yaml")
    assert main(["doctor", example]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "  NCCL_SOCKET_IFNAME=eth0" in out and "backend: gloo (distributed.backend: gloo)" in out
    assert out[out.index("devices:") + 1].startswith("  cpu") or out[out.index("devices:") + 1].startswith("  cuda")
    assert out[-1].startswith("preflight (2 processes, gloo, within 60 s): all-reduce ") and " ms, barrier " in out[-1]


def test_doctor_reads_the_job_with_its_overrides(capsys):
    from brain_operator.cli import main

    example = os.path.join(HERE, "..", "..", "deploy", "examples", "local-minimal.yaml")
    assert main(["doctor", example, "--set", "nodes=0"]) == 1
    assert "spec.nodes: must be >= 1, got 0 (--set nodes=0)" in capsys.readouterr().err
