"""What agents write: ``log()`` lines and their stdout/stderr, as lines with an address.

The runtime hands each line to ``Runtime(on_output=...)`` as it is written (from the worker
thread running the agent), and keeps the last ones per agent in a bounded :class:`OutputTail`
(``AgentProcess.output``) for reports. Stdout and stderr arrive in chunks; :class:`LineSplitter`
cuts them into lines, holding a partial line until its newline or the end of the agent's
turn. Rejected: output as events in ``Runtime.events`` (an agent printing in a loop would push
every crash and restart out of the bounded event log).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "LOG_LEVELS",
    "OUTPUT_TAIL_BYTES",
    "OUTPUT_TAIL_LINES",
    "AgentOutput",
    "LineSplitter",
    "OutputTail",
    "level_number",
]

OUTPUT_TAIL_LINES = 200
"""Lines kept per agent for reports (older ones are counted in ``OutputTail.dropped``)."""
OUTPUT_TAIL_BYTES = 64 * 1024
"""Characters of text kept per agent for reports."""
MAX_LINE = 8192
"""A longer line is cut into pieces of this many characters."""

LOG_LEVELS = {"debug": 10, "info": 20, "warning": 30, "warn": 30, "error": 40, "critical": 50}
"""Level names a guest's ``log(text, level)`` may use; any other counts as ``info``."""

Stream = Literal["log", "stdout", "stderr"]

# What a line of stdout or stderr is, for filtering: print() output is info, stderr a warning.
_STREAM_LEVEL = {"stdout": "info", "stderr": "warning"}


def level_number(level: str) -> int:
    """The severity of a level name (``debug`` 10 ... ``critical`` 50; unknown: info)."""
    return LOG_LEVELS.get(level.lower(), LOG_LEVELS["info"])


@dataclass(frozen=True, slots=True)
class AgentOutput:
    """One line an agent wrote: a ``log()`` call, or a line of its stdout or stderr.

    ``level`` is the log call's level; stdout lines are ``info`` and stderr lines ``warning``.
    """

    address: str
    stream: Stream
    text: str
    level: str = "info"
    time: float = field(default_factory=time.time)

    def to_json(self) -> dict[str, object]:
        return {"stream": self.stream, "level": self.level, "text": self.text, "time": self.time}


def stream_level(stream: Stream) -> str:
    return _STREAM_LEVEL.get(stream, "info")


class OutputTail:
    """The last lines of one agent: at most ``lines`` lines and ``max_bytes`` characters."""

    def __init__(self, lines: int = OUTPUT_TAIL_LINES, max_bytes: int = OUTPUT_TAIL_BYTES) -> None:
        self.lines = lines
        self.max_bytes = max_bytes
        self.dropped = 0
        """Lines written but no longer kept (the oldest go first)."""
        self._items: deque[AgentOutput] = deque()
        self._size = 0

    def add(self, item: AgentOutput) -> None:
        self._items.append(item)
        self._size += len(item.text)
        while self._items and (len(self._items) > self.lines or self._size > self.max_bytes):
            self._size -= len(self._items.popleft().text)
            self.dropped += 1

    def items(self) -> list[AgentOutput]:
        return list(self._items)


class LineSplitter:
    """Bytes of one stream in, whole lines (decoded, without the newline) out to ``emit``."""

    def __init__(self, emit: Callable[[str], None]) -> None:
        self._emit = emit
        self._partial = b""

    def feed(self, data: bytes) -> None:
        data = self._partial + data
        *lines, self._partial = data.split(b"\n")
        for line in lines:
            self._line(line)
        while len(self._partial) > MAX_LINE:
            piece, self._partial = self._partial[:MAX_LINE], self._partial[MAX_LINE:]
            self._line(piece)

    def flush(self) -> None:
        """Emit a partial line (the turn ended without its newline)."""
        if self._partial:
            piece, self._partial = self._partial, b""
            self._line(piece)

    def _line(self, raw: bytes) -> None:
        text = raw.decode("utf-8", "replace").removesuffix("\r")
        for start in range(0, max(len(text), 1), MAX_LINE):
            self._emit(text[start : start + MAX_LINE])
