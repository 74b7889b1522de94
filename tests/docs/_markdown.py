"""The code blocks of a Markdown page, and what the page says to do with each.

A block is run according to the HTML comment on the line right before its fence (blank lines
between are allowed):

- ``<!-- not run: REASON -->``: skipped; the reason must say why (it starts a server, ...).
- ``<!-- file: PATH -->``: written to PATH in the page's working directory, for later blocks
  (a WIT file, a handler, a manifest); any language.
- no comment: a ``python`` block is executed, a ``sh`` block is run one command per line; any
  other language is an error, so every block is either run or marked on purpose.

A ``# -> TEXT`` comment at the end of a line is the output the line prints; ``...`` in TEXT
stands for anything. Checked for ``sh`` commands and ``python`` ``print`` lines.

Rejected: pytest-markdown-docs (well kept, on PyPI): it runs python blocks only, marked by
fence info strings, and has no notion of shell commands or of files for later blocks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Block", "blocks", "expected_output", "matches"]

_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_MARK = re.compile(r"^<!--\s*(?P<kind>not run|file)\s*:\s*(?P<value>.*?)\s*-->$")
_EXPECT = re.compile(r"\s#\s->\s(?P<text>.*)$")


@dataclass(frozen=True)
class Block:
    """One fenced code block."""

    path: Path
    line: int
    """1-based line of the opening fence."""
    lang: str
    code: str
    mark: str | None
    """``not run`` or ``file``, from the comment before the fence; None without one."""
    value: str
    """The reason (not run) or the path (file); empty without a mark."""

    @property
    def where(self) -> str:
        """``README.md:74``, for messages."""
        return f"{self.path.name}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """Every fenced code block of the page, in order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        fence = opening["fence"]
        start = index
        index += 1
        body: list[str] = []
        while index < len(lines) and not lines[index].strip().startswith(fence):
            body.append(lines[index])
            index += 1
        index += 1
        mark, value = _mark_before(lines, start)
        lang = opening["info"].strip().split(" ")[0].lower()
        found.append(Block(path, start + 1, lang, "\n".join(body) + "\n", mark, value))
    return found


def _mark_before(lines: list[str], fence: int) -> tuple[str | None, str]:
    before = fence - 1
    while before >= 0 and not lines[before].strip():
        before -= 1
    if before < 0:
        return None, ""
    found = _MARK.match(lines[before].strip())
    if found is None:
        return None, ""
    return found["kind"], found["value"]


def expected_output(line: str) -> str | None:
    """The ``# -> TEXT`` a line ends with, or None."""
    found = _EXPECT.search(line)
    return None if found is None else found["text"].strip()


def matches(expected: str, output: str) -> bool:
    """Whether ``output`` holds the pieces of ``expected`` between its ``...``, in order."""
    position = 0
    for piece in (p.strip() for p in expected.split("...")):
        if not piece:
            continue
        found = output.find(piece, position)
        if found < 0:
            return False
        position = found + len(piece)
    return True
