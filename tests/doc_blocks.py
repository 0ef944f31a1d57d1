"""The runnable command blocks of the Markdown docs (pure).

A fenced block whose info string is a shell language followed by the word
`runnable` is run by tests/test_doc_blocks.py:

    ```bash runnable
    braintrain validate --local deploy/examples/local-minimal.yaml
    ```

GitHub highlights it as bash (it reads the first word only). The block runs as
one bash script, as if pasted into a shell, under `set -e -o pipefail`: its
commands share the folder and the variables, and every command must succeed.
A command is a line plus the lines its trailing backslashes continue; blank
lines and `#` comment lines are none. `script` says which command failed by
its line in the doc.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

MARKER = "runnable"
SHELLS = ("bash", "sh", "shell")
_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


@dataclass(frozen=True)
class Command:
    line: int  # 1-based line of the doc where the command starts
    text: str  # its lines, continuations included, for the shell to read


@dataclass(frozen=True)
class Block:
    doc: str  # the doc's path as the failure names it (relative to the repo)
    line: int  # 1-based line of the opening fence
    commands: tuple[Command, ...]

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}"


class DocBlockError(ValueError):
    """A block marked runnable that cannot be run as written; the message names the doc and line."""


def runnable_blocks(text: str, doc: str) -> list[Block]:
    """Every block of `text` marked runnable, in order."""
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        fence, words = opening["fence"], opening["info"].split()
        end = next((j for j in range(i + 1, len(lines)) if _closes(lines[j], fence)), None)
        if MARKER in words[1:]:
            if words[0] not in SHELLS:
                raise DocBlockError(f"{doc}:{i + 1}: a runnable block must be one of {', '.join(SHELLS)}, got {words[0]!r}")
            if end is None:
                raise DocBlockError(f"{doc}:{i + 1}: the runnable block is never closed")
            commands = _commands(lines[i + 1:end], first_line=i + 2, indent=len(opening["indent"]))
            if not commands:
                raise DocBlockError(f"{doc}:{i + 1}: the runnable block holds no command")
            if commands[-1].text.endswith("\\"):
                raise DocBlockError(f"{doc}:{commands[-1].line}: the command continues past the end of its block")
            blocks.append(Block(doc, i + 1, tuple(commands)))
        i = len(lines) if end is None else end + 1
    return blocks


def _closes(line: str, fence: str) -> bool:
    stripped = line.strip()
    return stripped.startswith(fence[0] * len(fence)) and set(stripped) == {fence[0]}


def _commands(body: list[str], first_line: int, indent: int) -> list[Command]:
    commands: list[Command] = []
    pending: list[str] = []
    start = first_line
    for number, raw in enumerate(body, first_line):
        line = raw[indent:] if raw[:indent].strip() == "" else raw.lstrip()  # a block indented in a list item
        if not pending:
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            start = number
        pending.append(line)
        if not line.endswith("\\"):
            commands.append(Command(start, "\n".join(pending)))
            pending = []
    if pending:  # a backslash on the block's last line: refused by the caller
        commands.append(Command(start, "\n".join(pending)))
    return commands


def script(block: Block, failed_at: Path) -> str:
    """The block as a bash script that writes the doc line of the command that failed into `failed_at`."""
    lines = ["set -e -o pipefail", f"trap 'echo \"$DOC_LINE\" > {shlex.quote(str(failed_at))}' ERR"]
    for command in block.commands:
        lines += [f"DOC_LINE={command.line}", command.text]
    return "\n".join(lines) + "\n"


def doc_files(repo: Path) -> list[Path]:
    """The docs whose blocks are run: README.md and docs/*.md."""
    return [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]
