"""The Makefile: `make demo` trains again each time it runs, installs only the trainer extra, and `make clean` keeps the venv.

The demo's real run takes minutes, so `braintrain` here is a stand-in that
records how it was called (and, for `prepare`, writes the manifest the real
one would): the Makefile's own logic (what it installs, which folder each run
gets, what is prepared once) runs for real, with GNU make.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from processes import run

REPO = Path(__file__).resolve().parents[1]
MAKE = shutil.which("make")
# With the torch development pins (the supported range would let pip pick another build), from the source
# requirements/torch_source.py picks.
TORCH_SOURCE = "$(.venv/bin/python requirements/torch_source.py)"
TRAINER_ONLY = f"-m pip install --quiet {TORCH_SOURCE} -e '.[trainer]' 'torch==2.13.0'"
WITH_DEV = f"-m pip install --quiet {TORCH_SOURCE} -e '.[trainer,dev]' 'torch==2.13.0'"
DATA_CLAIM = "stdlib-tokens"

BRAINTRAIN = f"""#!{sys.executable}
import json, pathlib, sys
args = sys.argv[1:]
with open("calls.jsonl", "a") as log:
    log.write(json.dumps(args) + "\\n")
if args[0] == "prepare":
    out = pathlib.Path(args[args.index("--out") + 1])
    out.mkdir(parents=True)
    (out / "manifest.json").write_text("{{}}")
"""


def make(*args: str, cwd: Path = REPO) -> str:
    result = run([MAKE, "--no-print-directory", *args], cwd=cwd, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def dry_run(target: str) -> list[str]:
    """The commands `make TARGET` would run on a fresh checkout (-B: as if nothing were built yet)."""
    return make("-n", "-B", target).splitlines()


def test_the_demo_installs_the_trainer_extra_and_the_tests_the_dev_extra_too():
    demo = dry_run("demo")
    assert any(line.endswith(TRAINER_ONLY) for line in demo), demo
    assert not any("dev" in line for line in demo), demo
    assert any(line.startswith(".venv/bin/braintrain prepare") for line in demo)
    test = dry_run("test")
    assert any(line.endswith(WITH_DEV) for line in test), test
    assert test[-1] == ".venv/bin/python -m pytest -q"


def test_setup_says_which_torch_it_installed():
    setup = dry_run("setup")
    install = next(i for i, line in enumerate(setup) if line.endswith(WITH_DEV))
    assert setup[install + 1].endswith("""-c 'import torch; print(f"make setup: installed torch {torch.__version__}")'""")


def test_the_image_targets_run_their_scripts_and_lock_installs_uv_first():
    assert dry_run("images") == ["bash deploy/images/build.sh"]
    assert dry_run("image-check") == ["bash deploy/images/check.sh"]
    lock = make("-n", "lock").splitlines()  # lock.sh runs in requirements/: the venv's paths are absolute
    assert lock[-2:] == [".venv/bin/python -m pip install --quiet uv",
                         f"UV={REPO}/.venv/bin/uv PYTHON={REPO}/.venv/bin/python bash requirements/lock.sh"]


def test_clean_keeps_the_venv_and_distclean_removes_it():
    assert make("-n", "clean").splitlines() == ["rm -rf runs .pytest_cache"]
    assert make("-n", "distclean").splitlines() == ["rm -rf runs .pytest_cache", "rm -rf .venv"]


def sandbox(tmp_path: Path) -> Path:
    """A checkout whose venv is installed (its stamp newer than pyproject.toml) and whose braintrain is the stand-in."""
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(REPO / name, tmp_path / name)
    bin = tmp_path / ".venv" / "bin"
    bin.mkdir(parents=True)
    (bin / "python").symlink_to(sys.executable)
    (bin / "braintrain").write_text(BRAINTRAIN)
    (bin / "braintrain").chmod(0o755)
    stamp = tmp_path / ".venv" / ".installed-trainer"
    stamp.touch()
    older = stamp.stat().st_mtime - 60
    os.utime(tmp_path / "pyproject.toml", (older, older))
    return tmp_path


def test_every_demo_trains_in_a_fresh_folder_on_the_dataset_prepared_once(tmp_path):
    checkout = sandbox(tmp_path)
    make("demo", cwd=checkout)
    make("demo", cwd=checkout)
    calls = [json.loads(line) for line in (checkout / "calls.jsonl").read_text().splitlines()]
    assert [c[0] for c in calls] == ["prepare", "run", "run"]  # prepared once, trained twice
    data = checkout / "runs" / "claims" / DATA_CLAIM / "stdlib"
    assert calls[0][calls[0].index("--out") + 1] == "runs/claims/stdlib-tokens/stdlib"
    runs = []
    for call in calls[1:]:
        assert call[:2] == ["run", "deploy/examples/local-tokens.yaml"]
        workdir, claims = (Path(call[call.index(flag) + 1]) for flag in ("--workdir", "--claims"))
        assert workdir.parent == claims.parent and workdir.parent.parent == Path("runs/demo")
        assert not (checkout / workdir).exists()  # braintrain run makes it: nothing of an earlier run is in it
        # the only claim there: the data, the one dataset prepared; the checkpoint claim starts empty
        assert [p.name for p in (checkout / claims).iterdir()] == [DATA_CLAIM]
        assert (checkout / claims / DATA_CLAIM / "stdlib").resolve() == data.resolve()
        runs.append(workdir.parent)
    assert runs[0] != runs[1]
