"""Host tools for the MCP server tests: `mty sandbox serve --tools tests.sandbox_mcp.tools:TOOLS`."""

from __future__ import annotations

import threading

from mighty.sandbox import RunContext


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def shout(text: str) -> str:
    """The text in upper case."""
    return text.upper()


def note(text: str) -> None:
    """Print on the host's stdout, which is the MCP channel (the server must keep it off)."""
    print(text, end="")


def steps(ctx: RunContext, n: int) -> int:
    """Take n steps, reporting each as progress."""
    for i in range(n):
        ctx.progress("step", done=i + 1, total=n)
    return n


TOOLS = [add, shout, note, steps]


_MEETINGS: dict[str, threading.Barrier] = {}
_MEETINGS_LOCK = threading.Lock()


def meet(key: str, parties: int) -> int:
    """Wait until `parties` calls with this key are all here (at most 60 s); the count met."""
    with _MEETINGS_LOCK:
        barrier = _MEETINGS.setdefault(key, threading.Barrier(parties, timeout=60))
    barrier.wait()
    return parties


# `mty sandbox serve --http` tests: `meet` only succeeds if calls really run at the same time.
HTTP_TOOLS = [add, shout, note, meet]
