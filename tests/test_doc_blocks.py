"""The docs cannot drift (issue 26, point 10): every command block in README.md and docs/*.md marked
```bash runnable``` runs, as a reader would run it, and exits 0.

Each block runs in a fresh folder holding a copy of `deploy/` (the example jobs the docs name), with only
this checkout's venv and the system's own folders on PATH and none of this shell's variables (no
BRAIN_TRAINER_IMAGE a reader would not have). A failure names the doc, the line and the command.
tests/doc_blocks.py says how a block is marked and read.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
from doc_blocks import Block, Command, DocBlockError, doc_files, runnable_blocks, script
from processes import run

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
COPIED = ("deploy",)  # what the commands may read, copied so that nothing they write lands in the checkout
COMMAND_TIMEOUT_S = 60  # per command: a runnable one is cheap (validate, render, estimate, a tiny prepare)
BLOCKS = [block for doc in doc_files(REPO) for block in runnable_blocks(doc.read_text(), str(doc.relative_to(REPO)))]


def reader_env(home: Path) -> dict[str, str]:
    """A fresh login's environment: the venv first on PATH, and this checkout's packages (as `make setup`'s
    editable install would give)."""
    packages = os.pathsep.join(str(REPO / part) for part in ("trainer", "operator"))
    return {"PATH": os.pathsep.join((str(BIN), "/usr/local/bin", "/usr/bin", "/bin")), "HOME": str(home),
            "LANG": "C.UTF-8", "PYTHONPATH": packages}


def test_the_docs_mark_commands_runnable_in_the_readme_and_the_guides():
    docs = {block.doc for block in BLOCKS}
    assert "README.md" in docs and len(docs) >= 3, docs
    commands = " ".join(command.text for block in BLOCKS for command in block.commands)
    for verb in ("validate", "render", "estimate", "prepare"):
        assert f"braintrain {verb}" in commands, f"no runnable block shows braintrain {verb}"


@pytest.mark.parametrize("block", BLOCKS, ids=str)
def test_a_runnable_block_runs_and_exits_0(block: Block, tmp_path):
    work, failed_at = tmp_path / "work", tmp_path / "failed-at"
    work.mkdir()
    for name in COPIED:
        shutil.copytree(REPO / name, work / name)
    done = run(["bash", "-c", script(block, failed_at)], cwd=work, env=reader_env(tmp_path),
               timeout=COMMAND_TIMEOUT_S * len(block.commands))
    if done.returncode != 0:
        line = int(failed_at.read_text()) if failed_at.exists() else block.line
        text = next((command.text for command in block.commands if command.line == line), "the block")
        pytest.fail(f"{block.doc}:{line}: `{text}` exited {done.returncode}\n{done.stdout}{done.stderr}")


# -- how blocks are found (pure) --

DOC = """\
# Title

```bash
make demo
```

```bash runnable
# a comment
braintrain validate --local a.yaml

braintrain render b.yaml \\
    --backend pytorchjob
```

1. In a list:

   ````sh runnable
   echo "```"
   ````

```yaml runnable-ish
a: 1
```
"""


def test_only_marked_shell_blocks_are_found_with_each_command_and_its_line():
    found = runnable_blocks(DOC, "doc.md")
    assert found == [
        Block("doc.md", 7, (Command(9, "braintrain validate --local a.yaml"),
                            Command(11, "braintrain render b.yaml \\\n    --backend pytorchjob"))),
        Block("doc.md", 17, (Command(18, 'echo "```"'),)),
    ]
    assert str(found[0]) == "doc.md:7"


@pytest.mark.parametrize(("text", "complaint"), [
    ("```python runnable\nprint(1)\n```\n", "doc.md:1: a runnable block must be one of bash, sh, shell, got 'python'"),
    ("intro\n```bash runnable\nbraintrain validate a.yaml\n", "doc.md:2: the runnable block is never closed"),
    ("```bash runnable\n# only a comment\n```\n", "doc.md:1: the runnable block holds no command"),
    ("```bash runnable\ntrue\nbraintrain render \\\n```\n", "doc.md:3: the command continues past the end of its block"),
])
def test_a_marked_block_that_cannot_run_is_refused_naming_the_line(text, complaint):
    with pytest.raises(DocBlockError) as caught:
        runnable_blocks(text, "doc.md")
    assert str(caught.value) == complaint


def test_a_failing_command_fails_its_block_naming_the_doc_and_line(tmp_path):
    doc = "text\n\n```bash runnable\nJOB=missing.yaml\nbraintrain validate \\\n  \"$JOB\"\necho never\n```\n"
    (block,) = runnable_blocks(doc, "guide.md")
    with pytest.raises(pytest.fail.Exception) as caught:
        test_a_runnable_block_runs_and_exits_0(block, tmp_path)
    first, *output = str(caught.value).splitlines()
    assert first == 'guide.md:5: `braintrain validate \\' and output[0] == '  "$JOB"` exited 1'
    assert "missing.yaml" in output[1] and "never" not in str(caught.value), "the variable carried; the block stopped"
