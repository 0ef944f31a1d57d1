"""The Dockerfile: hadolint-clean, non-root numeric users, no SSH or passwords, small layers."""

from __future__ import annotations

import json
import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import processes

from brain_trainer.version import torch_refusal

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "Dockerfile"
RUNTIME_STAGES = ("trainer", "operator")
SSH_SERVERS = re.compile(r"\b(openssh-server|sshd|dropbear|ssh-server)\b", re.IGNORECASE)
# Setting a password; `getent passwd` only reads the user table.
PASSWORD_SETTERS = re.compile(r"chpasswd|(?<!getent )\bpasswd\s|--password", re.IGNORECASE)
CREDENTIAL_NAMES = re.compile(r"PASSWORD|PASSWD|SECRET|TOKEN|API_KEY|CREDENTIAL", re.IGNORECASE)


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


def parse_stages(text: str) -> list[Stage]:
    """Stages of a Dockerfile: continuation lines joined, comments dropped."""
    logical, pending = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    stages: list[Stage] = []
    for line in logical:
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            match = re.fullmatch(r"(\S+)\s+AS\s+(\S+)", args.strip(), re.IGNORECASE)
            assert match, f"every stage is named: {line}"
            stages.append(Stage(name=match.group(2), base=match.group(1)))
        elif stages:
            stages[-1].instructions.append((keyword, args.strip()))
    return stages


STAGES = {stage.name: stage for stage in parse_stages(DOCKERFILE.read_text())}


def test_hadolint_reports_nothing():
    hadolint = Path(sys.executable).parent / "hadolint"
    result = processes.run([hadolint, "--format", "json", "--no-fail", DOCKERFILE], timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


def test_both_targets_exist_and_run_as_a_non_root_numeric_user():
    assert set(RUNTIME_STAGES) <= set(STAGES)
    for name in RUNTIME_STAGES:
        stage = STAGES[name]
        keywords = [keyword for keyword, _ in stage.instructions]
        users = stage.all("USER")
        assert users, f"{name}: no USER"
        uid, _, gid = users[-1].partition(":")
        assert uid.isdigit() and int(uid) > 0, f"{name}: USER {users[-1]!r} must be a non-root numeric uid"
        assert gid == "" or (gid.isdigit() and int(gid) > 0), f"{name}: USER {users[-1]!r} group"
        last_user = len(keywords) - 1 - keywords[::-1].index("USER")
        assert not {"RUN", "COPY", "ADD"} & set(keywords[last_user:]), f"{name}: work after the final USER runs as it"


def test_the_parser_sees_a_root_user_and_work_after_it():
    stage = parse_stages("FROM x AS a\nUSER 0\nRUN \\\n  echo hi\n")[0]
    assert stage.all("USER") == ["0"] and stage.all("RUN") == ["echo hi"]


def test_no_ssh_server_no_passwords_no_credentials():
    for name, stage in STAGES.items():
        for keyword, args in stage.instructions:
            assert not SSH_SERVERS.search(args), f"{name}: {keyword} {args}"
            assert not PASSWORD_SETTERS.search(args), f"{name}: {keyword} {args}"
            assert keyword != "EXPOSE" or "22" not in args.split(), f"{name}: exposes ssh"
            if keyword in ("ENV", "ARG"):
                assert not CREDENTIAL_NAMES.search(args), f"{name}: {keyword} {args}"
    assert SSH_SERVERS.search("apt-get install -y openssh-server")
    assert PASSWORD_SETTERS.search("echo root:x | chpasswd") and PASSWORD_SETTERS.search("passwd -d root")
    assert not PASSWORD_SETTERS.search("getent passwd 1000")


def test_layers_stay_small():
    for name, stage in STAGES.items():
        for run in stage.all("RUN"):
            if re.search(r"\bpip3? (install|wheel)\b", run):
                assert "--no-cache-dir" in run, f"{name}: {run}"
            if "apt-get install" in run:
                assert "--no-install-recommends" in run and "rm -rf /var/lib/apt/lists/*" in run, f"{name}: {run}"
        # The wheel builder's sources never reach a runtime image: only bind mounts of its output.
        if name in RUNTIME_STAGES:
            assert not [c for c in stage.all("COPY") if "--from=wheel" in c], name


def test_entrypoints_are_exec_form():
    assert json.loads(STAGES["trainer"].all("ENTRYPOINT")[-1]) == ["torchrun"]
    assert json.loads(STAGES["trainer"].all("CMD")[-1]) == ["-m", "brain_trainer", "--config", "/etc/brain/trainer.yaml"]
    assert json.loads(STAGES["operator"].all("ENTRYPOINT")[-1]) == ["braintrain"]
    assert json.loads(STAGES["operator"].all("CMD")[-1])[0] == "operator"


def test_trainer_takes_base_torch_flavour_and_index_as_build_args():
    args = dict(arg.partition("=")[::2] for arg in STAGES["trainer"].all("ARG"))
    assert args["TORCH_FLAVOUR"] == "cpu" and args["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/${TORCH_FLAVOUR}"
    assert STAGES["trainer"].base == "${BASE_IMAGE}"
    assert any('"/tmp/requirements/torch-${TORCH_FLAVOUR}.lock"' in run and '"${TORCH_INDEX_URL}"' in run
               for run in STAGES["trainer"].all("RUN"))


def test_operator_image_installs_no_torch():
    installs = " ".join(STAGES["operator"].all("RUN"))
    assert "pip install" in installs
    assert "torch" not in installs and "[trainer]" not in installs


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as a regex: `*` stays within one path segment, `**/` spans folders."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path, or a folder above it, decides."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        regex = _pattern_regex(pattern.lstrip("!").rstrip("/"))
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            ignored = not negate
    return ignored


def test_dockerignore_sends_only_what_the_build_copies():
    patterns = [
        line.strip() for line in (REPO / ".dockerignore").read_text().splitlines() if line.strip() and not line.startswith("#")
    ]
    copied = [source.rstrip("/") for copy in STAGES["wheel"].all("COPY") for source in copy.split()[:-1]]
    assert copied == ["pyproject.toml", "README.md", "LICENSE", "trainer", "operator"]
    for kept in (*copied, "trainer/brain_trainer/config/sections.py", "operator/brain_operator/cli.py"):
        assert (REPO / kept).exists() and not dockerignored(kept, patterns), kept
    for dropped in (".venv/bin/python", ".git/HEAD", "runs/job/ckpt", "tests/conftest.py", "charts/brain-operator/Chart.yaml",
                    "trainer/brain_trainer/config/__pycache__/sections.cpython-311.pyc"):
        assert dockerignored(dropped, patterns), dropped


def _final_uid(stage: str) -> int:
    return int(STAGES[stage].all("USER")[-1].partition(":")[0])


def test_images_run_as_the_uid_their_pods_ask_for():
    import helm_python as helm
    import yaml
    from brain_operator.backends.shared.common import RUN_AS_USER

    assert _final_uid("trainer") == RUN_AS_USER
    with helm.Chart.load(REPO / "charts" / "brain-operator") as chart:
        deployment = yaml.safe_load(chart.render(name="brain", namespace="ops")["brain-operator/templates/deployment.yaml"])
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == _final_uid("operator")


LOCKS = REPO / "requirements"
PIN = re.compile(r"^([a-z0-9][a-z0-9._-]*)==(\S+)", re.M)


def _hashed_pins(lock: str) -> dict[str, str]:
    """{name: version} of the pins that carry their hashes: each `name==version \\` then `--hash=sha256:` lines."""
    pins = re.findall(r"^([a-z0-9][a-z0-9._-]*)==(\S+) \\\n(?:\s+--hash=sha256:[0-9a-f]{64}(?: \\)?\n)+", lock, re.M)
    return dict(pins)


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[ ;]", req, maxsplit=1)[0].lower().replace("_", "-") for req in requirements}


def test_every_pip_install_checks_hashes_or_installs_only_the_projects_own_wheel():
    installs = [run for stage in STAGES.values() for run in stage.all("RUN") if re.search(r"\bpip3? install\b", run)]
    assert len(installs) == 4
    for run in installs:
        from_locks = "--require-hashes" in run and re.search(r" -r \S+\.lock", run)
        own_wheel = "--no-deps" in run and "/wheels/" in run and " -r " not in run
        assert from_locks or own_wheel, run


def test_every_lock_carries_a_hash_for_every_pin_and_names_no_index():
    for path in LOCKS.glob("*.lock"):
        lock = path.read_text()
        pins = PIN.findall(lock)
        assert pins, path.name
        assert not re.search(r"^--(extra-)?index-url|^--find-links", lock, re.M), path.name  # no machine's own mirror
        if path.name == "torch-cu128.lock":
            continue  # not yet locked: the Dockerfile refuses it (below)
        assert len(_hashed_pins(lock)) == len(pins), f"{path.name}: every pin carries its hashes"


def test_the_locks_cover_what_each_image_needs():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    base = _names(pyproject["project"]["dependencies"])
    trainer = base | _names(pyproject["project"]["optional-dependencies"]["trainer"])
    trainer_lock = _hashed_pins((LOCKS / "trainer.lock").read_text())
    assert trainer - {"torch"} <= set(trainer_lock) and "torch" not in trainer_lock
    assert base <= set(_hashed_pins((LOCKS / "operator.lock").read_text()))
    # The torch development pins (Makefile), one the trainer supports (pyproject's range, version.py).
    [torch_pin] = re.findall(r"^TORCH_PIN := (\S+)$", (REPO / "Makefile").read_text(), re.MULTILINE)
    assert torch_refusal(torch_pin.removeprefix("torch==")) is None
    for path in LOCKS.glob("torch-*.lock"):
        pins = dict(PIN.findall(path.read_text()))
        flavour = path.stem.removeprefix("torch-")
        assert f"torch=={pins['torch']}" == f"{torch_pin}+{flavour}", path.name  # the project's torch, that build
        # Installed together with trainer.lock: a distribution both pin has one version.
        assert all(trainer_lock[name] == version for name, version in pins.items() if name in trainer_lock), path.name


def _hash_guard() -> str:
    """The trainer's torch install up to pip, its paths this checkout's: the check that a flavour's lock is hashed."""
    [run] = [run for run in STAGES["trainer"].all("RUN") if "torch-${TORCH_FLAVOUR}.lock" in run]
    guard = run[run.index('lock="'):run.index("&& pip install")]
    return guard.replace("/tmp/requirements/", f"{LOCKS}/")


def test_a_flavour_whose_lock_has_no_hash_is_refused_before_pip_runs():
    environment = {"PATH": "/usr/bin:/bin", "TORCH_INDEX_URL": "https://download.pytorch.org/whl/cu128"}
    refused = processes.run(["bash", "-c", _hash_guard()], env={**environment, "TORCH_FLAVOUR": "cu128"}, timeout=30)
    assert refused.returncode == 1
    assert refused.stderr.strip() == ("requirements/torch-cu128.lock is missing or carries no hashes: run 'make lock "
                                      "TORCH_FLAVOUR=cu128' where https://download.pytorch.org/whl/cu128 is reachable")
    unknown = processes.run(["bash", "-c", _hash_guard()], env={**environment, "TORCH_FLAVOUR": "rocm9"}, timeout=30)
    assert unknown.returncode == 1 and "torch-rocm9.lock is missing" in unknown.stderr
    hashed = processes.run(["bash", "-c", _hash_guard()], env={**environment, "TORCH_FLAVOUR": "cpu"}, timeout=30)
    assert hashed.returncode == 0, hashed.stderr
