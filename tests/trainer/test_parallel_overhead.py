"""benchmarks/parallel_overhead.py at its smallest: every layout of each world size gets a step time and both ratios
against DDP on the same ranks (the values are the machine's, not checked), DDP's own ratios are 1."""

import os
import re
import sys
from pathlib import Path

from processes import run

ROOT = Path(__file__).resolve().parents[2]
BENCHMARK = ROOT / "benchmarks" / "parallel_overhead.py"
LINE = re.compile(r"^  (?P<layout>\S+(?: x dp\d+)?) +step +[\d.]+ ms +\d+ tokens/s  "
                  r"step time x(?P<step>[\d.]+)  tokens/s x(?P<tokens>[\d.]+)$")


def test_prints_a_ratio_against_ddp_per_layout():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(ROOT / part) for part in ("trainer", "operator", "tests"))}
    done = run([sys.executable, BENCHMARK, "--world-sizes", "2", "--tensor-parallel", "2", "--pipeline-parallel",
                "2", "--micro-batches", "2", "--steps", "1", "--warmup", "1", "--micro-batch", "1", "--seq-len", "8"],
               timeout=600, env=env)
    assert done.returncode == 0, done.stderr
    sections = done.stdout.split("world size ")[1:]
    found = {}
    for section in sections:
        world, *lines = section.strip().splitlines()
        matches = [LINE.match(line) for line in lines]
        assert all(matches), lines
        found[world.rstrip(":")] = {m["layout"]: (float(m["step"]), float(m["tokens"])) for m in matches}
    # one world size: the script's loop over world sizes runs the same code for each
    assert {world: list(rows) for world, rows in found.items()} == {"2": ["ddp", "fsdp", "tp2 x dp1", "pp2 x dp1"]}
    assert all(rows["ddp"] == (1.0, 1.0) for rows in found.values())
    assert all(step > 0 and tokens > 0 for rows in found.values() for step, tokens in rows.values())
