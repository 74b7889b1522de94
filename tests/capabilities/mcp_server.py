"""A real MCP server for the capability tests, run as its own process (stdio or HTTP).

``python -m tests.capabilities.mcp_server [stdio | http PORT]``. Its tools read and write a
small in-memory file table (``read``, ``write``, ``listing``), and misbehave on request
(``big``: a result of N bytes; ``garbage``: a line that is not JSON-RPC; ``hang``: never
answers; ``die``: the process exits mid-call; ``fail``: an error result). ``starts`` counts
the process's starts in a file named by MTY_TEST_STARTS, so a test can see a restart.
"""

from __future__ import annotations

import os
import sys
import time

from mcp.server import MCPServer

app = MCPServer("mighty-test-files")
_FILES: dict[str, str] = {"hello.txt": "hello, world"}


@app.tool()
def read(path: str) -> str:
    """Read a file of the table."""
    if path not in _FILES:
        raise ValueError(f"no file {path}")
    return _FILES[path]


@app.tool()
def write(path: str, text: str) -> int:
    """Write a file of the table; returns the characters written."""
    _FILES[path] = text
    return len(text)


@app.tool()
def listing() -> list[str]:
    """The names in the table."""
    return sorted(_FILES)


@app.tool()
def add(a: int, b: int = 1) -> int:
    """Add two integers."""
    return a + b


@app.tool()
def big(size: int) -> str:
    """A string of ``size`` bytes."""
    return "x" * size


@app.tool()
def garbage() -> str:
    """Write a line that is not JSON-RPC to stdout, then answer."""
    sys.stdout.write("this is not json\n")
    sys.stdout.flush()
    return "done"


@app.tool()
def hang() -> str:
    """Never answer."""
    time.sleep(3600)
    return "late"


@app.tool()
def die() -> str:
    """End the process in the middle of the call."""
    os._exit(3)


@app.tool()
def fail(message: str) -> str:
    """Fail with ``message``."""
    raise RuntimeError(message)


def main() -> None:
    starts = os.environ.get("MTY_TEST_STARTS")
    if starts:
        with open(starts, "a") as out:
            out.write("start\n")
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        app.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        app.run("stdio")


if __name__ == "__main__":
    main()
