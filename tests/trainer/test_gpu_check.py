"""benchmarks/gpu_check.sh and benchmarks/async_save.py where a CPU can check them: the check refuses to start
without CUDA (exit 2, one line), and the async-save measurement runs end to end on the CPU."""

import json
import os
import sys
from pathlib import Path

from processes import run

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_without_cuda_exits_2_with_one_line(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": "", "TMPDIR": str(tmp_path)}
    done = run(["bash", ROOT / "benchmarks" / "gpu_check.sh"], timeout=120, env=env)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and "gpu_check: no CUDA device" in done.stderr
    assert list(tmp_path.iterdir()) == []  # nothing left behind


def test_async_save_measures_each_save_against_a_raw_write(tmp_path):
    out = tmp_path / "async_save.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        str(ROOT / part) for part in ("trainer", "operator"))}
    done = run([sys.executable, ROOT / "benchmarks" / "async_save.py", "--device", "cpu", "--saves", "2",
                "--dir", tmp_path / "disk", "--json", out], timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert [(s["kind"], s["step"]) for s in report["saves"]] == [("async", 1), ("async", 2), ("final", 3)]
    for save in report["saves"]:
        assert save["bytes"] > 4_000_000  # the minimal preset's weights and AdamW moments, 12 bytes per parameter
        assert 0 <= save["stall_s"] <= save["save_s"]
        assert save["over_raw"] == save["gb_per_s"] / report["raw_gb_per_s"]
    final = report["saves"][-1]
    assert final["stall_s"] == final["save_s"]  # the final save blocks the loop throughout
    assert list((tmp_path / "disk").iterdir()) == []  # its checkpoints and raw file are removed
    assert "save/raw" in done.stdout


def test_the_checks_job_is_valid_and_its_resume_has_more_steps(tmp_path, capsys):
    """The manifest gpu_check.sh runs, and the copy it resumes with: the sed there must hit exactly one line."""
    from brain_operator.cli import main

    manifest = ROOT / "benchmarks" / "gpu_check.yaml"
    assert main(["validate", "--local", str(manifest)]) == 0
    text = manifest.read_text()
    assert text.count("\n    steps: 40\n") == 1
    assert "sed 's/^    steps: 40$/    steps: 80/' benchmarks/gpu_check.yaml" in (ROOT / "benchmarks" / "gpu_check.sh").read_text()
    resume = tmp_path / "resume.yaml"
    resume.write_text(text.replace("\n    steps: 40\n", "\n    steps: 80\n"))
    assert main(["validate", "--local", str(resume)]) == 0
    out = capsys.readouterr().out
    assert "valid BrainTrainingJob 'gpu-check' (1 x 1 processes)" in out
