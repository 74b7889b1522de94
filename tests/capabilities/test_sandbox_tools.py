"""Code mode calls a real MCP server's tools: ``Sandbox(tools=mcp_tools(client, only=[...]))``.

Sandboxed code calls the selected tools as Python functions (sync and awaited); only those
exist; arguments are checked against the tool's input schema before the server is called;
``describe_tools()`` shows typed signatures; a server's failures arrive as ``ToolError``
kinds; a recorded run replays with the server stopped (``replay_trace`` and ``mty replay``).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mighty.capabilities import McpClient, mcp_tools
from mighty.sandbox import Sandbox
from mighty.trace import ReplayEvent, replay_trace
from tests.capabilities.conftest import StdioServer, make_stdio_server, pid_alive

READY = 120.0


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[StdioServer, McpClient]]:
    """One stdio test server and its connected client for the module."""
    made = make_stdio_server(tmp_path_factory.mktemp("sandbox"))
    with McpClient(made.server) as client:
        client.wait_ready(READY)
        yield made, client


@pytest.fixture(scope="module")
def box(interpreter: object, served: tuple[StdioServer, McpClient]) -> Iterator[Sandbox]:
    """A sandbox given three of the server's tools: read, add and shout."""
    _, client = served
    with Sandbox(tools=mcp_tools(client, only=["read", "add", "shout"]), pool=1) as sandbox:
        yield sandbox


def test_code_calls_the_servers_tools_as_functions(box: Sandbox) -> None:
    """The selected tools are plain functions: positional and keyword arguments, defaults."""
    result = box.run(
        "a = add(2, 3)\n"
        "b = add(a=10)\n"
        "text = read(path='hello.txt')\n"
        "loud = shout('hi', times=2)\n"
        "[a, b, text, loud]"
    )
    assert result.ok, result.error
    assert result.value == [5, 11, "hello, world", "HI\nHI"]
    assert result.usage.tool_calls == 4


def test_async_code_calls_them_concurrently(box: Sandbox) -> None:
    """Inside async code each call is awaitable, and gather runs them together."""
    result = box.run("import asyncio\nawait asyncio.gather(*[add(a=i, b=i) for i in range(10)])")
    assert result.ok, result.error
    assert result.value == [2 * i for i in range(10)]


def test_only_the_selected_tools_exist(box: Sandbox) -> None:
    """A tool of the server that was not selected is not there: calling it is a NameError."""
    assert sorted(box.tools) == ["add", "read", "shout"]
    result = box.run("write(path='x.txt', text='no')")
    assert not result.ok
    assert result.error is not None
    assert result.error.kind == "exception"
    assert "NameError" in result.error.message
    assert "write" in result.error.message
    probe = box.run("[name for name in ('read', 'write', 'listing', 'die') if name in globals()]")
    assert probe.value == ["read"]


def test_arguments_are_checked_against_the_schema(box: Sandbox) -> None:
    """Wrong types are a ToolError before the server is called; missing/unknown: TypeError."""
    code = (
        "seen = []\n"
        "for call in (lambda: add(a='two'), lambda: read(path=3), lambda: add(a=1.5),\n"
        "             lambda: add(b=1), lambda: add(a=1, c=2)):\n"
        "    try:\n"
        "        call()\n"
        "    except ToolError as e:\n"
        "        seen.append(['ToolError', e.tool, e.kind, e.message])\n"
        "    except TypeError as e:\n"
        "        seen.append(['TypeError', str(e)])\n"
        "seen"
    )
    result = box.run(code)
    assert result.ok, result.error
    seen = result.value
    assert [s[:3] for s in seen[:3]] == [
        ["ToolError", "add", "InvalidMcpArguments"],
        ["ToolError", "read", "InvalidMcpArguments"],
        ["ToolError", "add", "InvalidMcpArguments"],
    ]
    assert "'two' is not of type 'integer'" in seen[0][3]
    assert "3 is not of type 'string'" in seen[1][3]
    assert "1.5 is not of type 'integer'" in seen[2][3]
    assert seen[3][0] == "TypeError"
    assert "missing 1 required positional argument: 'a'" in seen[3][1]
    assert seen[4][0] == "TypeError"
    assert "'c'" in seen[4][1]
    assert result.usage.tool_calls == 3  # the TypeErrors never left the sandbox


def test_the_servers_failures_are_tool_errors(box: Sandbox) -> None:
    """A tool's error result is a ToolError of kind McpToolFailed; the run goes on."""
    result = box.run(
        "try:\n"
        "    read(path='missing.txt')\n"
        "except ToolError as e:\n"
        "    failed = (e.kind, e.message)\n"
        "[failed, add(a=1)]"
    )
    assert result.ok, result.error
    (kind, message), after = result.value
    assert kind == "McpToolFailed"
    assert "files.read" in message
    assert after == 2


def test_describe_tools_shows_typed_signatures(box: Sandbox) -> None:
    """The stub for a model shows each tool's parameters with the schema's types."""
    stub = box.describe_tools()
    assert "def add(a: int, b: int = None)" in stub
    assert "def read(path: str)" in stub
    assert "def shout(text: str, times: int = None)" in stub
    assert "Add two integers." in stub
    assert "write" not in stub


def test_a_recorded_run_replays_with_the_server_stopped(
    interpreter: object, tmp_path: Path
) -> None:
    """A run recorded against the server replays (replay_trace, mty replay) with it stopped."""
    made = make_stdio_server(tmp_path, "recorded")
    trace = tmp_path / "run.bin"
    client = McpClient(made.server)
    try:
        client.wait_ready(READY)
        with Sandbox(tools=mcp_tools(client, only=["add", "write", "read"]), pool=0) as sandbox:
            result = sandbox.run(
                "n = write(path='r.txt', text='recorded')\n[n, read(path='r.txt'), add(a=n)]",
                record=trace,
            )
    finally:
        client.close()
    assert result.ok, result.error
    assert result.value == [8, "recorded", 9]
    (pid,) = made.pids()
    assert not pid_alive(pid)

    exported: list[object] = []

    def observe(event: ReplayEvent) -> None:
        if event.kind == "export":
            exported.append(event.result)

    report = replay_trace(trace, observer=observe)
    assert report.instances[0].exports == 1
    assert "recorded" in repr(exported)
    assert made.starts() == 1  # nothing started the server again
    done = subprocess.run(
        [str(Path(sys.executable).parent / "mty"), "replay", str(trace)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
