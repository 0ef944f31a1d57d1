"""The images' locks against the real indexes, as pip's finder sees them before it downloads anything.

For every pin of every lock (requirements/*.lock): the version is on the index, each hash the lock names is the
hash of one of that version's files, and one of those files is a wheel the image can install (CPython 3.11, Linux
on the lock's architecture), so `pip install --require-hashes -r LOCK` in the image finds what it checks. PyPI
answers with its JSON simple API (PEP 691), one request per project; torch's x86_64 CPU build comes from PyTorch's
CPU index, or, where that is unreachable, from pip's configured find-links (requirements/lock.sh does the same).
No wheel is downloaded.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

import pytest
from packaging.tags import Tag, cpython_tags, compatible_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
LOCKS = REPO / "requirements"
PYPI = "https://pypi.org/simple"
ARCHS = {"amd64": "x86_64", "arm64": "aarch64"}
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==(\S+) \\\n((?:\s+--hash=sha256:[0-9a-f]{64}(?: \\)?\n)+)", re.M)


def _torch_source():
    spec = importlib.util.spec_from_file_location("torch_source", LOCKS / "torch_source.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pins(lock: str) -> dict[str, tuple[str, set[str]]]:
    """{name: (version, hashes)} of a lock's pins."""
    return {canonicalize_name(name): (version, set(re.findall(r"sha256:([0-9a-f]{64})", hashes)))
            for name, version, hashes in PIN.findall(lock)}


def installable_tags(arch: str) -> set[Tag]:
    """What pip in the image (CPython 3.11 on glibc 2.36, Debian 12) installs on `arch` (x86_64 or aarch64)."""
    platforms = [f"manylinux_2_{minor}_{arch}" for minor in range(36, 4, -1)]
    platforms += [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}", f"linux_{arch}"]
    return {*cpython_tags((3, 11), platforms=platforms), *compatible_tags((3, 11), "cp311", platforms)}


def problems(lock: str, arch: str, files: dict[str, list[tuple[str, str]]]) -> list[str]:
    """What pip would refuse, given `files`: {name: [(filename, sha256)]} of each pinned project on its index."""
    tags = installable_tags(arch)
    found = []
    for name, (version, hashes) in pins(lock).items():
        of_version = {}
        for filename, digest in files.get(name, []):
            try:
                _, wheel_version, _, wheel_tags = parse_wheel_filename(filename)
            except InvalidWheelFilename:
                continue  # an sdist, or a wheel of long ago whose name today's rules refuse
            if wheel_version == Version(version):
                of_version[digest] = bool(wheel_tags & tags)
        if not of_version:
            found.append(f"{name}=={version}: no wheel of that version on the index")
        elif unknown := hashes - set(of_version) - sdist_hashes(name, version, files):
            found.append(f"{name}=={version}: hashes not on the index: {sorted(unknown)}")
        elif not any(of_version.get(digest) for digest in hashes):
            found.append(f"{name}=={version}: no hashed wheel installs on CPython 3.11, Linux {arch}")
    return found


def sdist_hashes(name: str, version: str, files: dict[str, list[tuple[str, str]]]) -> set[str]:
    return {digest for filename, digest in files.get(name, []) if filename.endswith((f"-{version}.tar.gz", f"-{version}.zip"))}


@cache
def pypi_files(name: str) -> tuple[tuple[str, str], ...]:
    request = urllib.request.Request(f"{PYPI}/{name}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        listing = json.load(response)
    return tuple((f["filename"], f["hashes"].get("sha256", "")) for f in listing["files"])


@cache
def torch_cpu_files() -> tuple[tuple[str, str], ...]:
    """torch's files where lock.sh takes its CPU build from: PyTorch's CPU index, else pip's find-links."""
    source = _torch_source()
    if source.reachable(f"{source.CPU_INDEX}/torch/"):
        with urllib.request.urlopen(f"{source.CPU_INDEX}/torch/", timeout=60) as response:
            page = response.read().decode()
        return tuple(re.findall(r'href="[^"]*?/?([^/"#]+\.whl)#sha256=([0-9a-f]{64})"', page))
    settings = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    folders = " ".join(re.findall(r"^\S*\.find-links='(.*)'$", settings, re.M)[:1]).split()
    wheels = [w for folder in folders for w in Path(folder.removeprefix("file://")).glob("torch-*.whl")]
    return tuple((w.name, hashlib.file_digest(w.open("rb"), "sha256").hexdigest()) for w in wheels)


def index_files(lock_name: str, lock: str) -> dict[str, list[tuple[str, str]]]:
    names = list(pins(lock))
    with ThreadPoolExecutor(max_workers=16) as pool:
        files = dict(zip(names, (list(f) for f in pool.map(pypi_files, names))))
    if lock_name.startswith("trainer-cpu-"):
        files["torch"] += torch_cpu_files()
    return files


def lock_files() -> list[Path]:
    return sorted(LOCKS.glob("*.lock"))


@pytest.mark.parametrize("path", lock_files(), ids=lambda p: p.name)
def test_every_pin_of_every_lock_is_on_its_index_with_those_hashes_and_installs_there(path):
    lock = path.read_text()
    assert pins(lock) and len(pins(lock)) == len(re.findall(r"^[A-Za-z0-9][^\n]*==", lock, re.M)), "every pin carries hashes"
    arch = re.search(r"-(amd64|arm64)\.lock$", path.name)
    for machine in [ARCHS[arch.group(1)]] if arch else ARCHS.values():
        assert problems(lock, machine, index_files(path.name, lock)) == [], f"{path.name} on {machine}"


def test_the_check_finds_an_unknown_version_a_foreign_hash_and_a_wheel_for_another_machine():
    digest = "ab" * 32
    lock = f"a==1.0 \\\n    --hash=sha256:{'00' * 32}\nb==2.0 \\\n    --hash=sha256:{digest}\nc==3.0 \\\n    --hash=sha256:{digest}\n"
    files = {
        "a": [("a-1.0-py3-none-any.whl", "11" * 32)],
        "c": [("c-3.0-cp311-cp311-manylinux_2_17_x86_64.whl", digest)],
    }
    assert problems(lock, "aarch64", files) == [
        f"a==1.0: hashes not on the index: {['00' * 32]}",
        "b==2.0: no wheel of that version on the index",
        "c==3.0: no hashed wheel installs on CPython 3.11, Linux aarch64",
    ]
    assert problems(lock.split("b==")[0], "x86_64", {"a": [("a-1.0-py3-none-any.whl", "00" * 32)]}) == []
