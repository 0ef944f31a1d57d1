"""The operator's logs: kopf's text or JSON formats, and every line about a job naming it."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
import threading
from pathlib import Path

import kopf
import pytest
from fake_cluster import FakeCluster
from processes import run

from brain_operator import __version__, handlers, logs
from brain_operator.spec import API_VERSION, KIND, OperatorDefaults

NS, NAME = "team-a", "demo"
JOB = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"namespace": NS, "name": NAME, "uid": "u-1"}}
TEXT_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\] \S+\s+\[(?P<level>[A-Z]+)\s*\] (?P<message>.*)$")


@pytest.fixture
def root_logging():
    """kopf.configure changes the root logger (and asyncio's): put them back afterwards."""
    root, aio = logging.getLogger(), logging.getLogger("asyncio")
    saved = root.handlers[:], root.level, aio.handlers[:], aio.propagate
    yield
    root.handlers[:], aio.handlers[:] = saved[0], saved[2]
    root.setLevel(saved[1])
    aio.propagate = saved[3]


class Failing(FakeCluster):
    """The API server is unreachable for this job: every read fails."""

    def get_job(self, namespace, name):
        raise ConnectionError("API server unreachable")


class Noted(logging.Handler):
    """Sets `seen` once a record whose message contains `text` is handled."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text, self.seen = text, threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen.set()


def log_a_job_three_ways() -> None:
    """What an operator logs about a job: kopf's per-object logger in a handler, ours, and a failed resync."""
    kopf.LocalObjectLogger(body=JOB, settings=kopf.OperatorSettings()).info("Handler 'on_job' succeeded.")
    logs.job_logger(logging.getLogger("brain_operator.reconcile"), NS, NAME).debug("planned %d pods", 2)
    context = handlers.Context(client=Failing(), defaults=OperatorDefaults(image="img:1"))
    context.remember(NS, NAME, True)
    noted = Noted("reconcile failed")
    logging.getLogger().addHandler(noted)

    async def one_failed_resync():
        task = asyncio.create_task(handlers.resync_forever(context, interval=0))
        try:
            assert await asyncio.to_thread(noted.seen.wait, 30)
        finally:
            task.cancel()

    try:
        asyncio.run(one_failed_resync())
    finally:
        logging.getLogger().removeHandler(noted)


def test_json_lines_parse_and_carry_the_job(capsys, root_logging):
    logs.configure("json", verbose=True)
    log_a_job_three_ways()
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    about_the_job = [line for line in lines if "object" in line]
    messages = [line["message"] for line in about_the_job]
    assert messages[:2] == ["Handler 'on_job' succeeded.", "planned 2 pods"]
    assert any(message.startswith("reconcile failed; trying again in") for message in messages)
    for line in about_the_job:
        assert (line["object"]["namespace"], line["object"]["name"], line["object"]["kind"]) == (NS, NAME, KIND)
        assert line["timestamp"] and line["severity"] in {"debug", "info", "warn", "error"}
    failed = next(line for line in about_the_job if line["message"].startswith("reconcile failed"))
    assert failed["severity"] == "error" and "API server unreachable" in failed["exc_info"]


def test_text_lines_are_timestamped_and_prefixed_with_the_job(capsys, root_logging):
    logs.configure("text")
    log_a_job_three_ways()
    lines = [TEXT_LINE.match(line) for line in capsys.readouterr().err.splitlines() if line.startswith("[")]
    assert all(lines), "every line starts with a timestamp, the logger and the level"
    messages = [(match["level"], match["message"]) for match in lines]
    assert ("INFO", f"[{NS}/{NAME}] Handler 'on_job' succeeded.") in messages
    assert any(level == "ERROR" and message.startswith(f"[{NS}/{NAME}] reconcile failed") for level, message in messages)
    # INFO unless --verbose: the debug line is not written.
    assert not any("planned" in message for _, message in messages)


def test_an_unknown_format_is_refused():
    with pytest.raises(ValueError, match="text, json"):
        logs.configure("yaml")


def test_the_operator_command_configures_logging_before_it_needs_a_cluster(tmp_path):
    # No credentials anywhere: the operator logs its start in the asked format, then fails in one line.
    env = {"KUBECONFIG": str(tmp_path / "absent"), "HOME": str(tmp_path), "PATH": ""}
    done = run(
        [Path(sys.executable).with_name("braintrain"), "operator", "--namespace", NS, "--namespace", "team-b",
         "--log-format", "json", "--verbose"],
        env=env, timeout=120,
    )
    first, last = done.stderr.strip().splitlines()[0], done.stderr.strip().splitlines()[-1]
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert json.loads(first)["message"] == f"brain-operator {__version__} watching namespaces {NS}, team-b"
    assert last.startswith("braintrain: no Kubernetes credentials:")


def test_the_log_format_is_one_of_two(capsys):
    from brain_operator.cli import main

    with pytest.raises(SystemExit) as done:
        main(["operator", "--all-namespaces", "--log-format", "yaml"])
    assert done.value.code == 2 and "invalid choice: 'yaml'" in capsys.readouterr().err
