"""`mty sandbox serve` starts at once: serverInfo, background preparation, progress, prepare."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, ClientSession, StdioServerParameters, stdio_client

from mighty._errors import BadInput
from mighty.sandbox._mcp import RUN_PYTHON, Preparation, build_server

ROOT = Path(__file__).resolve().parents[2]
MTY = str(Path(sys.executable).parent / "mty")


class _Result:
    def to_json(self) -> dict[str, Any]:
        return {"ok": True, "value": 1, "stdout": "", "stderr": "", "error": None, "usage": None}


class _Sandbox:
    """A stand-in sandbox: the interpreter is what these tests hold back."""

    def describe_tools(self) -> str:
        return ""

    def close(self) -> None:
        pass

    async def run_async(self, code: str, inputs: Any = None) -> _Result:
        return _Result()


def test_server_info_version_is_mighty_version() -> None:
    """serverInfo.version is mighty's version, not empty."""

    async def scenario() -> None:
        async with Client(build_server(_Sandbox)) as client:
            info = client.server_info
            assert info is not None
            assert info.version == version("mighty-host")

    anyio.run(scenario)


def test_calls_wait_for_preparation_with_progress() -> None:
    """Listing tools does not wait for the interpreter; a call waits, with progress updates."""
    release = threading.Event()
    preparation = Preparation(lambda: release.wait(30))
    server = build_server(_Sandbox, stubs="", preparation=preparation)
    notes: list[tuple[float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        notes.append((progress, message))

    async def scenario() -> None:
        async with Client(server) as client:
            tools = (await client.list_tools()).tools
            assert [t.name for t in tools] == [RUN_PYTHON]
            assert not preparation.ready
            threading.Timer(2.5, release.set).start()
            started = time.monotonic()
            result = await client.call_tool(
                RUN_PYTHON, {"code": "1"}, progress_callback=on_progress
            )
            assert time.monotonic() - started >= 2.0
            assert result.is_error is False

    anyio.run(scenario)
    assert notes, "no progress notification while the interpreter was prepared"
    assert all("preparing the Python interpreter" in (m or "") for _, m in notes)


def test_failed_preparation_is_every_calls_error() -> None:
    """When preparing the interpreter fails, each call is an error result naming why."""

    def broken() -> None:
        raise BadInput("no interpreter here")

    preparation = Preparation(broken)
    preparation.wait(5)

    async def scenario() -> None:
        async with Client(build_server(_Sandbox, stubs="", preparation=preparation)) as client:
            for _ in range(2):
                result = await client.call_tool(RUN_PYTHON, {"code": "1"})
                assert result.is_error is True
                assert result.structured_content is not None
                assert "no interpreter here" in result.structured_content["error"]["message"]

    anyio.run(scenario)


def test_serve_answers_initialize_at_once_on_a_cold_cache(tmp_path: Path) -> None:
    """With nothing built, `mty sandbox serve` initializes and lists tools before the
    interpreter's build (tens of seconds, in the background) is over."""
    params = StdioServerParameters(
        command=MTY,
        args=["sandbox", "serve"],
        env={"MTY_CACHE_DIR": str(tmp_path / "cache"), "PATH": os.environ.get("PATH", "")},
        cwd=ROOT,
    )

    async def scenario() -> str:
        with open(tmp_path / "stderr.txt", "w") as errlog:
            async with (
                stdio_client(params, errlog=errlog) as (read, write),
                ClientSession(read, write) as session,
            ):
                init = await session.initialize()
                tools = (await session.list_tools()).tools
                # What the server had said by the time both were answered (its stderr goes
                # straight to the file): the build's end, had it waited for it, would be there.
                said = (tmp_path / "stderr.txt").read_text()
                assert init.server_info.version == version("mighty-host")
                assert [t.name for t in tools] == [RUN_PYTHON]
                return said

    said = anyio.run(scenario)
    assert "the interpreter is ready" not in said, said
    assert "failed" not in said, said


def test_sandbox_prepare_then_ready() -> None:
    """`mty sandbox prepare` readies the interpreter and says where it is."""
    done = subprocess.run([MTY, "sandbox", "prepare"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("interpreter ready: ")
