"""A real MCP server for the capability tests, run as its own process (stdio or HTTP).

``python -m tests.capabilities.mcp_server [stdio | http PORT]``. Its tools read and write a
small in-memory file table (``read``, ``write``, ``listing``), compute (``add``; ``shout``,
whose result is text blocks only), and misbehave on request
(``big``: a result of N bytes; ``garbage``: a line that is not JSON-RPC; ``hang``: never
answers; ``die``: the process exits mid-call; ``fail``: an error result). ``starts`` counts
the process's starts in a file named by MTY_TEST_STARTS, so a test can see a restart, and
MTY_TEST_PIDS names a file each start appends its pid to (a test checks the process is gone).

Over HTTP (``http PORT``, 0 for any free port) it binds 127.0.0.1 itself and prints
``listening on URL`` on stdout once the socket listens, so a test reads the URL instead of
polling a port; with MTY_TEST_TOKEN set, every request must carry ``Authorization: Bearer`` that
token (``mty sandbox serve``'s own ``BearerAuth``), else 401.
"""

from __future__ import annotations

import os
import socket
import sys

import anyio
from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

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


@app.tool(structured_output=False)
def shout(text: str, times: int = 1) -> list[str]:
    """``text`` in capitals, ``times`` text blocks (no structured content: plain text)."""
    return [text.upper()] * times


@app.tool()
def big(size: int) -> str:
    """A string of ``size`` bytes."""
    return "x" * size


@app.tool()
def garbage() -> str:
    """Write a line that is not JSON-RPC to the wire, then answer.

    The SDK's stdio server diverts fd 1 (and so ``print``) to stderr and writes its messages
    to a private duplicate, so the line goes to that duplicate."""
    from mcp.server import stdio

    claim = stdio._claims.get(1)
    wire = claim.private_fd if claim is not None and claim.private_fd is not None else 1
    os.write(wire, b"this is not json\n")
    return "done"


@app.tool()
async def hang() -> str:
    """Never answer (asleep on the event loop, so a shutdown can cancel it; a sleeping
    thread would hold up the HTTP server's exit)."""
    await anyio.sleep(3600)
    return "late"


@app.tool()
def die() -> str:
    """End the process in the middle of the call."""
    os._exit(3)


@app.tool()
def fail(message: str) -> str:
    """Fail with ``message`` (a ToolError: the SDK passes its text on, unlike a crash's)."""
    raise ToolError(message)


def main() -> None:
    starts = os.environ.get("MTY_TEST_STARTS")
    if starts:
        with open(starts, "a") as out:
            out.write("start\n")
    pids = os.environ.get("MTY_TEST_PIDS")
    if pids:
        with open(pids, "a") as out:
            out.write(f"{os.getpid()}\n")
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        _serve_http(int(sys.argv[2]), os.environ.get("MTY_TEST_TOKEN"))
    else:
        app.run("stdio")
    # A `hang` call's worker thread would keep the interpreter from exiting for an hour.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _serve_http(port: int, token: str | None) -> None:
    """Streamable HTTP on 127.0.0.1:``port``; the URL on stdout once the socket listens."""
    import uvicorn

    from mighty.sandbox._mcp_http import BearerAuth

    asgi = app.streamable_http_app(host="127.0.0.1")
    if token:
        asgi = BearerAuth(asgi, token)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(64)
    print(f"listening on http://127.0.0.1:{sock.getsockname()[1]}/mcp", flush=True)
    config = uvicorn.Config(asgi, log_level="warning", lifespan="on", timeout_graceful_shutdown=2)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
