"""Capability test fixtures: the test MCP server (tests/capabilities/mcp_server.py) as a real
process, over stdio (a fresh :class:`McpServer` per test, with files that count its starts and
name its pids) and over Streamable HTTP (one process per module, behind a bearer token)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mighty.capabilities import McpServer

ROOT = Path(__file__).resolve().parents[2]
SERVER_COMMAND = (sys.executable, "-m", "tests.capabilities.mcp_server")
HTTP_TOKEN = "mcp-test-token-" + "k" * 24
TOKEN_ENV = "MTY_TEST_MCP_TOKEN"


@dataclass(frozen=True)
class StdioServer:
    """A declared stdio server and the files its processes report to."""

    server: McpServer
    starts_file: Path
    pids_file: Path

    def starts(self) -> int:
        """How many processes of the server have started so far."""
        if not self.starts_file.exists():
            return 0
        return len(self.starts_file.read_text().splitlines())

    def pids(self) -> list[int]:
        """The pids of its processes, in the order they started."""
        if not self.pids_file.exists():
            return []
        return [int(line) for line in self.pids_file.read_text().split()]


def make_stdio_server(tmp: Path, name: str = "files", **options: Any) -> StdioServer:
    """An :class:`McpServer` running the test server over stdio, reporting into ``tmp``."""
    starts, pids = tmp / f"{name}.starts", tmp / f"{name}.pids"
    server = McpServer(
        name,
        command=SERVER_COMMAND,
        env={"MTY_TEST_STARTS": str(starts), "MTY_TEST_PIDS": str(pids)},
        cwd=str(ROOT),
        **options,
    )
    return StdioServer(server, starts, pids)


@pytest.fixture
def stdio_server(tmp_path: Path) -> Callable[..., StdioServer]:
    """A factory of stdio test servers reporting into this test's directory."""
    return lambda name="files", **options: make_stdio_server(tmp_path, name, **options)


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (a zombie still counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@dataclass(frozen=True)
class HttpServer:
    """The test server over Streamable HTTP: its URL and its process."""

    url: str
    process: subprocess.Popen[str]


@pytest.fixture(scope="module")
def http_server() -> Iterator[HttpServer]:
    """One HTTP test server process on a free loopback port, requiring ``HTTP_TOKEN``."""
    env = {key: os.environ[key] for key in ("PATH", "HOME", "LANG") if key in os.environ}
    env["MTY_TEST_TOKEN"] = HTTP_TOKEN
    process = subprocess.Popen(
        [*SERVER_COMMAND, "http", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
        env=env,
        text=True,
    )
    assert process.stdout is not None
    stdout = process.stdout
    try:
        # The server prints its URL once its socket listens: no port to poll. A server that
        # fails to start closes stdout, so readline returns "" rather than blocking.
        line = stdout.readline()
        assert line.startswith("listening on http://127.0.0.1:"), line
        yield HttpServer(line.split()[-1], process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:  # a `hang` call's thread can hold up its exit
            process.kill()
            process.wait(timeout=30)
        stdout.close()


@pytest.fixture
def http_token(monkeypatch: pytest.MonkeyPatch) -> str:
    """The server's token in ``$MTY_TEST_MCP_TOKEN`` (where ``token="${...}"`` reads it)."""
    monkeypatch.setenv(TOKEN_ENV, HTTP_TOKEN)
    return HTTP_TOKEN
