"""One version, written in pyproject.toml: both packages and the chart's appVersion read it; one license."""

from __future__ import annotations

import sys
import tomllib
from importlib import metadata
from pathlib import Path

import brain_operator
import brain_trainer
import pytest
import yaml
from brain_trainer import version
from processes import run

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_both_packages_report_the_pyproject_version():
    assert brain_trainer.__version__ == brain_operator.__version__ == PYPROJECT["version"]
    assert metadata.version(version.DISTRIBUTION) == PYPROJECT["version"]


def test_the_chart_app_version_is_the_project_version():
    chart = yaml.safe_load((REPO / "charts" / "brain-operator" / "Chart.yaml").read_text())
    assert chart["appVersion"] == PYPROJECT["version"], "set appVersion in charts/brain-operator/Chart.yaml"


def test_a_source_checkout_without_an_installed_distribution_reads_pyproject(tmp_path):
    # -I -S, run elsewhere: no site-packages and no egg-info on the path, so no brain-train
    # metadata; version.py needs only the standard library.
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('v', {str(REPO / 'trainer' / 'brain_trainer' / 'version.py')!r})\n"
        "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
        "from importlib import metadata\n"
        "try:\n    metadata.version(module.DISTRIBUTION); print('installed')\n"
        "except metadata.PackageNotFoundError:\n    print(module.__version__)\n"
    )
    done = run([sys.executable, "-I", "-S", "-c", code], timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == PYPROJECT["version"]


def test_no_pyproject_reads_as_unknown(tmp_path):
    assert version.source_version(tmp_path / "pyproject.toml") == version.UNKNOWN
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    assert version.source_version(tmp_path / "pyproject.toml") == version.UNKNOWN


def test_the_license_file_is_the_apache_license_pyproject_names():
    assert PYPROJECT["license"] == "Apache-2.0"
    text = (REPO / "LICENSE").read_text()
    assert text.split()[:5] == ["Apache", "License", "Version", "2.0,", "January"]
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX: How to apply the Apache License" in text
    # The distribution ships it (setuptools picks LICENSE up by name).
    assert "LICENSE" in (metadata.metadata(version.DISTRIBUTION).get_all("License-File") or [])


def test_pyproject_declares_the_torch_range_the_trainer_checks():
    [declared] = [req for req in PYPROJECT["optional-dependencies"]["trainer"] if req.startswith("torch")]
    assert declared == version.TORCH_REQUIREMENT == "torch>=2.11,<2.14"


@pytest.mark.parametrize("torch_version", ["2.11.0", "2.11.0+cu130", "2.12.1+cpu", "2.13.0", "2.13.0+cpu"])
def test_every_torch_of_the_range_is_supported(torch_version):
    assert version.torch_refusal(torch_version) is None


@pytest.mark.parametrize("torch_version", ["2.10.2+cu128", "2.14.0", "2.14.0a0+git1234", "3.0.0", "1.13.1", "nightly"])
def test_a_torch_outside_the_range_is_refused_in_one_line_naming_both(torch_version):
    line = version.torch_refusal(torch_version)
    assert line is not None and "\n" not in line
    assert f"torch {torch_version} is not supported" in line and version.TORCH_REQUIREMENT in line
