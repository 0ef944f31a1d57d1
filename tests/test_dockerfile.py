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


def test_entrypoints_are_exec_form_and_the_pods_run_the_trainers():
    from brain_operator.backends.shared.workers import COMMAND

    # tini as PID 1 starting torchrun's quiet agent: the pods name the same command (a pod's command replaces it).
    assert json.loads(STAGES["trainer"].all("ENTRYPOINT")[-1]) == list(COMMAND) == [
        "tini", "--", "python", "-m", "brain_trainer.agent"]
    assert json.loads(STAGES["trainer"].all("CMD")[-1]) == ["-m", "brain_trainer", "--config", "/etc/brain/trainer.yaml"]
    assert json.loads(STAGES["operator"].all("ENTRYPOINT")[-1]) == ["braintrain"]
    assert json.loads(STAGES["operator"].all("CMD")[-1])[0] == "operator"
    assert any(re.search(r"apt-get install .*\btini=", run) for run in STAGES["trainer"].all("RUN"))


def test_no_frontend_is_pulled_by_a_moving_tag():
    first = DOCKERFILE.read_text().splitlines()[0]
    assert not re.match(r"#\s*syntax\s*=", first) or "@sha256:" in first, first


FLAVOURS = ("cpu", "cu130")
ARCHITECTURES = ("amd64", "arm64")


def _bind_sources(run: str) -> list[str]:
    return re.findall(r"--mount=type=bind,(?:from=\S+?,)?source=([^,\s]+)", run)


def test_trainer_installs_only_its_flavours_lock_for_its_architecture():
    args = dict(arg.partition("=")[::2] for arg in STAGES["trainer"].all("ARG"))
    assert args["TORCH_FLAVOUR"] == "cpu" and "TARGETARCH" in args
    assert args["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    sources = [s for run in STAGES["trainer"].all("RUN") for s in _bind_sources(run)]
    assert sources == ["requirements/trainer-${TORCH_FLAVOUR}-${TARGETARCH}.lock", "/wheels"]
    assert [s for run in STAGES["operator"].all("RUN") for s in _bind_sources(run)] == ["requirements/operator.lock", "/wheels"]
    for flavour in FLAVOURS:
        for arch in ARCHITECTURES:
            assert (REPO / "requirements" / f"trainer-{flavour}-{arch}.lock").is_file(), (flavour, arch)


def test_the_wheel_is_built_without_isolation_from_a_hashed_build_backend():
    [run] = STAGES["wheel"].all("RUN")
    assert _bind_sources(run) == ["requirements/build.lock"]
    install, build = run.index("pip install"), run.index("pip wheel")
    assert install < build and "--require-hashes -r /tmp/build.lock" in run and "--no-build-isolation" in run[build:]
    backend = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    assert _names(backend) <= set(_hashed_pins((LOCKS / "build.lock").read_text()))


def test_every_download_may_trust_a_proxys_authority_given_as_a_build_secret():
    for name, stage in STAGES.items():
        for run in stage.all("RUN"):
            if "--require-hashes" in run:
                assert "--mount=type=secret,id=ca" in run and "PIP_CERT=/run/secrets/ca" in run, name


def _wheel_guard() -> str:
    """The trainer's install of the project's wheel up to pip, with /wheels a parameter."""
    [run] = [run for run in STAGES["trainer"].all("RUN") if "from=wheel" in run]
    return run[run.index("set -- "):run.index("&& pip install")].replace("/wheels/", '"$WHEELS"/')


def test_an_empty_wheel_stage_is_named_before_pip_runs(tmp_path):
    environment = {"PATH": "/usr/bin:/bin", "WHEELS": str(tmp_path)}
    empty = processes.run(["sh", "-c", _wheel_guard()], env=environment, timeout=30)
    assert empty.returncode == 1
    assert "the wheel stage produced no wheel in /wheels" in empty.stderr
    (tmp_path / "brain_train-0.1.0-py3-none-any.whl").touch()
    built = processes.run(["sh", "-c", _wheel_guard()], env=environment, timeout=30)
    assert built.returncode == 0, built.stderr


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


def _hashed_pins(lock: str) -> dict[str, str]:
    """{name: version} of the pins that carry their hashes: each `name[extras]==version \\` then `--hash=` lines."""
    pins = re.findall(r"^([a-z0-9][a-z0-9._-]*)(?:\[[^\]]*\])?==(\S+) \\\n(?:\s+--hash=sha256:[0-9a-f]{64}(?: \\)?\n)+", lock, re.M)
    return dict(pins)


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[ ;]", req, maxsplit=1)[0].lower().replace("_", "-") for req in requirements}


def test_every_pip_install_checks_hashes_or_installs_only_the_projects_own_wheel():
    installs = [run for stage in STAGES.values() for run in stage.all("RUN") if re.search(r"\bpip3? install\b", run)]
    assert len(installs) == 5
    for run in installs:
        from_locks = "--require-hashes" in run and re.search(r" -r \S+\.lock", run)
        own_wheel = "--no-deps" in run and "/wheels/" in run and " -r " not in run
        assert from_locks or own_wheel, run


def test_every_lock_carries_a_hash_for_every_pin_and_names_no_index():
    for path in LOCKS.glob("*.lock"):
        lock = path.read_text()
        pins = re.findall(r"^[a-z0-9][^\n]*==", lock, re.M)
        assert pins, path.name
        assert not re.search(r"^--(extra-)?index-url|^--find-links|file://", lock, re.M), path.name  # no machine's mirror
        assert len(_hashed_pins(lock)) == len(pins), f"{path.name}: every pin carries its hashes"


def test_the_locks_cover_what_each_image_needs():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    base = _names(pyproject["project"]["dependencies"])
    trainer = base | _names(pyproject["project"]["optional-dependencies"]["trainer"])
    operator = _hashed_pins((LOCKS / "operator.lock").read_text())
    assert base <= set(operator) and "torch" not in operator
    # The torch development pins (Makefile), one the trainer supports (pyproject's range, version.py).
    [torch_pin] = re.findall(r"^TORCH_PIN := torch==(\S+)$", (REPO / "Makefile").read_text(), re.MULTILINE)
    assert torch_refusal(torch_pin) is None
    for flavour in FLAVOURS:
        for arch in ARCHITECTURES:
            pins = _hashed_pins((LOCKS / f"trainer-{flavour}-{arch}.lock").read_text())
            assert trainer <= set(pins), (flavour, arch)
            cuda = {name for name in pins if name.startswith("nvidia-")}
            if (flavour, arch) == ("cpu", "amd64"):  # PyTorch's CPU build: no CUDA libraries
                assert pins["torch"] == f"{torch_pin}+cpu" and not cuda
            elif flavour == "cpu":  # aarch64: the CPU index's build where reachable, else PyPI's
                assert pins["torch"] in (torch_pin, f"{torch_pin}+cpu")
            else:  # PyPI's torch, built for the CUDA version the flavour is named after (cu130: CUDA 13.0)
                assert pins["torch"] == torch_pin
                assert pins["nvidia-cuda-runtime"].startswith(f"{flavour[2:-1]}.{flavour[-1]}."), pins
