"""Shell scripts: shellcheck-clean, and `make kind-e2e` plans without tools and refuses without them."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import yaml
from processes import run

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
E2E = REPO / "deploy" / "kind" / "e2e.sh"
SKIP_DIRS = {".git", ".venv", "runs", "__pycache__", ".pytest_cache", ".hypothesis", "build", "dist"}
E2E_TOOLS = ("docker", "kind", "kubectl", "helm")
PLAN = (
    "kind create cluster --name brain-e2e --config",
    "make --directory",
    "kind load docker-image --name brain-e2e",
    "kubectl apply --filename",
    "helm upgrade --install brain-operator",
    "helm test brain-operator --namespace brain-system",
    "kubectl apply --namespace brain-jobs --filename",
    "kubectl wait --namespace brain-jobs --filename",
    "'jsonpath={.status.phase}=Succeeded'",
    "kubectl get --namespace brain-jobs",
)


def shell_scripts() -> list[Path]:
    """Every *.sh and every file whose shebang names a shell, outside caches and the venv."""
    found = []
    for folder, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        for name in files:
            path = Path(folder, name)
            if name.endswith(".sh"):
                found.append(path)
                continue
            with path.open("rb") as handle:
                first = handle.readline(100)
            if first.startswith(b"#!") and first.split(b"/")[-1].split()[-1] in (b"sh", b"bash"):
                found.append(path)
    return sorted(found)


def test_shellcheck_reports_nothing_on_every_shell_script():
    scripts = shell_scripts()
    assert E2E in scripts and REPO / ".ci" / "run" in scripts
    result = run([BIN / "shellcheck", "--severity=style", *scripts], timeout=120)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_e2e_script_is_strict():
    lines = E2E.read_text().splitlines()
    assert lines[0] == "#!/usr/bin/env bash"
    assert "set -euo pipefail" in lines
    assert os.access(E2E, os.X_OK)


def _path_with(tmp_path: Path, *tools: str) -> dict[str, str]:
    """An environment whose PATH holds only the named real executables."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for tool in tools:
        real = shutil.which(tool, path=f"{BIN}{os.pathsep}{os.environ['PATH']}")
        assert real, f"{tool} is needed to run this test"
        (folder / tool).symlink_to(real)
    return {"PATH": str(folder), "HOME": str(tmp_path)}


def test_make_kind_e2e_dry_run_prints_the_plan_and_runs_none_of_it(tmp_path):
    # Only bash on PATH: had the dry run executed any step, kind/docker/kubectl/helm would be missing.
    env = _path_with(tmp_path, "bash")
    make = shutil.which("make")
    result = run([make, "--no-print-directory", "kind-e2e", "DRY_RUN=1", "TEARDOWN=1"], cwd=REPO, env=env, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    positions = [out.find(command) for command in PLAN]
    assert -1 not in positions and positions == sorted(positions), out
    assert "cpu-gloo.yaml" in out and "namespaces.yaml" in out
    # The image the example job names is the one built and loaded into kind.
    job = yaml.safe_load((REPO / "deploy" / "examples" / "cpu-gloo.yaml").read_text())
    load = next(line for line in out.splitlines() if line.startswith("+ kind load docker-image"))
    assert job["spec"]["image"] in load.split() and f"TRAINER_IMAGE={job['spec']['image']}" in out
    repository, _, tag = job["spec"]["image"].rpartition(":")
    assert f"trainer.image.repository={repository}" in out and f"trainer.image.tag={tag}" in out
    assert out.rstrip().endswith("+ kind delete cluster --name brain-e2e"), out
    for tool in E2E_TOOLS:
        assert f"missing required tool: {tool}" in result.stderr


def test_kind_e2e_without_the_tools_names_each_missing_one_and_stops(tmp_path):
    result = run(["/bin/bash", E2E], env=_path_with(tmp_path), timeout=60)
    assert result.returncode != 0
    for tool in E2E_TOOLS:
        assert f"missing required tool: {tool}\n" in result.stderr
    assert "kind create cluster" not in result.stdout


def test_kind_e2e_names_only_the_tools_that_are_missing(tmp_path):
    result = run(["/bin/bash", E2E], env=_path_with(tmp_path, "kubectl"), timeout=60)
    assert result.returncode != 0
    missing = sorted(line.rsplit(" ", 1)[1] for line in result.stderr.splitlines() if line.startswith("missing required tool:"))
    assert missing == ["docker", "helm", "kind"]
