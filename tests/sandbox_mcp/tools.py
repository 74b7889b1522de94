"""Host tools for the MCP server tests: `mty sandbox serve --tools tests.sandbox_mcp.tools:TOOLS`."""

from __future__ import annotations


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def shout(text: str) -> str:
    """The text in upper case."""
    return text.upper()


def note(text: str) -> None:
    """Print on the host's stdout, which is the MCP channel (the server must keep it off)."""
    print(text, end="")


TOOLS = [add, shout, note]
