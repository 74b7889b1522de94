"""`mty sandbox serve`: rendering, the server in-process with a fake sandbox, and end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TextIO

import anyio
import pytest
from click.testing import CliRunner
from mcp import Client, ClientSession, StdioServerParameters, stdio_client
from mcp.types import CallToolResult, TextContent

from mighty._errors import BadInput
from mighty.cli import main
from mighty.sandbox._mcp import (
    RUN_PYTHON,
    build_server,
    load_tools,
    render_text,
    stdout_to_stderr,
    to_call_result,
)

ROOT = Path(__file__).resolve().parents[2]

OK_DOC: dict[str, Any] = {
    "ok": True,
    "value": 2,
    "stdout": "",
    "stderr": "",
    "error": None,
    "usage": {"fuel": 10, "memory_peak": 1, "wall_ms": 1.0, "tool_calls": 0},
}


def _failed(kind: str, message: str, **extra: Any) -> dict[str, Any]:
    return {
        "ok": False,
        "value": None,
        "stdout": "",
        "stderr": "",
        "error": {"kind": kind, "message": message, "traceback": None},
        "usage": None,
    } | extra


def _text(result: CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


# -- rendering ----------------------------------------------------------------------------------


def test_render_value_as_json() -> None:
    """A successful run renders as its value in JSON, and nothing else when there is no output."""
    assert render_text(OK_DOC) == "2"
    assert render_text(OK_DOC | {"value": {"a": [1, "é"]}}) == '{"a": [1, "é"]}'
    assert render_text(OK_DOC | {"value": None}) == "null"


def test_render_error_kind_message_and_outputs() -> None:
    """A failed run renders as `kind: message`, then its traceback, stdout and stderr."""
    doc = _failed("exception", "ZeroDivisionError: division by zero", stdout="before\n")
    doc["error"]["traceback"] = "Traceback (most recent call last):\n  ...\n"
    doc["stderr"] = "warn\n"
    assert render_text(doc) == (
        "exception: ZeroDivisionError: division by zero\n"
        "Traceback (most recent call last):\n  ...\n"
        "--- stdout ---\nbefore\n"
        "--- stderr ---\nwarn"
    )


def test_to_call_result_flags_failures() -> None:
    """The result carries the whole document as structured content; isError iff not ok."""
    good = to_call_result(OK_DOC)
    assert good.is_error is False
    assert good.structured_content == OK_DOC
    assert _text(good) == "2"
    bad = to_call_result(_failed("deadline_exceeded", "over 1 s"))
    assert bad.is_error is True
    assert bad.structured_content is not None
    assert bad.structured_content["error"]["kind"] == "deadline_exceeded"
    assert _text(bad) == "deadline_exceeded: over 1 s"


# -- loading tools and guarding stdout ----------------------------------------------------------


def test_load_tools_list_and_errors() -> None:
    """`MODULE:ATTR` imports a list of callables; a bad spec or value is a BadInput naming it."""
    from tests.sandbox_mcp import tools

    listed = load_tools("tests.sandbox_mcp.tools:TOOLS")
    assert listed == [tools.add, tools.shout, tools.note, tools.steps]
    with pytest.raises(BadInput, match="MODULE:ATTR"):
        load_tools("tests.sandbox_mcp.tools")
    with pytest.raises(BadInput, match="cannot import"):
        load_tools("tests.sandbox_mcp.no_such_module:TOOLS")
    with pytest.raises(BadInput, match="has no 'NOPE'"):
        load_tools("tests.sandbox_mcp.tools:NOPE")
    with pytest.raises(BadInput, match="expected a list or dict"):
        load_tools("tests.sandbox_mcp.tools:add")


def test_load_tools_dict(monkeypatch: pytest.MonkeyPatch) -> None:
    """A dict maps names to callables; a non-callable value is refused."""
    from tests.sandbox_mcp import tools

    monkeypatch.setattr(tools, "NAMED", {"plus": tools.add}, raising=False)
    assert load_tools("tests.sandbox_mcp.tools:NAMED") == {"plus": tools.add}
    monkeypatch.setattr(tools, "NAMED", {"plus": 1}, raising=False)
    with pytest.raises(BadInput, match="plus"):
        load_tools("tests.sandbox_mcp.tools:NAMED")


def test_stdout_to_stderr_at_the_descriptor(capfd: pytest.CaptureFixture[str]) -> None:
    """Inside the guard, writes to file descriptor 1 land on stderr; after it, stdout is back."""
    with stdout_to_stderr():
        os.write(1, b"native\n")
        print("python")
    os.write(1, b"after\n")
    out, err = capfd.readouterr()
    assert err == "native\npython\n"
    assert out == "after\n"


# -- the server in-process, with a fake sandbox ------------------------------------------------


class _FakeResult:
    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document

    def to_json(self) -> dict[str, Any]:
        return self.document


class _FakeSandbox:
    """Echoes `inputs` as the value; code "fail" fails, code "host" raises a host error."""

    made = 0

    def __init__(self) -> None:
        type(self).made += 1
        self.runs = 0

    def describe_tools(self) -> str:
        return "def lookup(key: str) -> int: ..."

    def close(self) -> None:
        self.closed = True

    async def run_async(self, code: str, inputs: Mapping[str, Any] | None = None) -> _FakeResult:
        self.runs += 1
        assert self.runs == 1, "a sandbox must not be reused"
        if code == "host":
            raise BadInput("inputs must be JSON")
        if code == "fail":
            return _FakeResult(_failed("exception", "ValueError: no", stdout="partial\n"))
        return _FakeResult(OK_DOC | {"value": dict(inputs or {})})


def test_server_in_process_with_fake_sandbox() -> None:
    """Through the SDK's client: one tool, its schema and description, results and failures."""

    async def scenario() -> None:
        server = build_server(_FakeSandbox, limits="timeout 1 s")
        async with Client(server) as client:
            tools = (await client.list_tools()).tools
            assert [tool.name for tool in tools] == [RUN_PYTHON]
            tool = tools[0]
            assert tool.description is not None
            assert "def lookup(key: str) -> int" in tool.description
            assert "timeout 1 s" in tool.description
            assert tool.input_schema["required"] == ["code"]
            assert set(tool.input_schema["properties"]) == {"code", "inputs", "limits"}
            assert tool.output_schema is not None
            assert "ok" in tool.output_schema["properties"]

            made = _FakeSandbox.made
            good = await client.call_tool(RUN_PYTHON, {"code": "x", "inputs": {"n": 1}})
            assert good.is_error is False
            assert good.structured_content is not None
            assert good.structured_content["value"] == {"n": 1}
            assert _text(good) == '{"n": 1}'

            bad = await client.call_tool(RUN_PYTHON, {"code": "fail"})
            assert bad.is_error is True
            assert bad.structured_content is not None
            assert bad.structured_content["error"]["kind"] == "exception"
            assert _text(bad) == "exception: ValueError: no\n--- stdout ---\npartial"

            host = await client.call_tool(RUN_PYTHON, {"code": "host"})
            assert host.is_error is True
            assert host.structured_content is not None
            assert host.structured_content["error"]["kind"] == "bad_input"
            assert _FakeSandbox.made == made + 3  # a fresh sandbox per call

    anyio.run(scenario)


def test_server_rejects_bad_arguments_as_tool_error() -> None:
    """Arguments that do not fit the schema come back as an isError result, not a crash."""

    async def scenario() -> None:
        async with Client(build_server(_FakeSandbox)) as client:
            result = await client.call_tool(RUN_PYTHON, {"inputs": {}})
            assert result.is_error is True
            again = await client.call_tool(RUN_PYTHON, {"code": "x"})
            assert again.is_error is False

    anyio.run(scenario)


# -- end to end: `mty sandbox serve` in a subprocess -------------------------------------------


def _server_command() -> tuple[str, list[str]]:
    # `python -m mighty.cli` does not run (no __main__), so use the `mty` script of this
    # environment, or call its entry point directly.
    script = Path(sys.executable).parent / "mty"
    if script.exists():
        return str(script), []
    return sys.executable, ["-c", "import sys; from mighty.cli import main; sys.exit(main())"]


@asynccontextmanager
async def _serve(*args: str, errlog: TextIO) -> AsyncIterator[ClientSession]:
    command, prefix = _server_command()
    params = StdioServerParameters(
        command=command,
        args=[*prefix, "sandbox", "serve", "--tools", "tests.sandbox_mcp.tools:TOOLS", *args],
        env={key: os.environ[key] for key in ("MTY_CACHE_DIR",) if key in os.environ},
        cwd=ROOT,
    )
    async with (
        stdio_client(params, errlog=errlog) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


# The first server of a fresh cache builds the interpreter before it answers `initialize`
# (tens of seconds); no client timeout is set, so the call waits for it.
_FIRST_CALL_TIMEOUT = 600.0


def _value(result: CallToolResult) -> Any:
    assert result.is_error is False, _text(result)
    assert result.structured_content is not None
    return result.structured_content["value"]


def _kind(result: CallToolResult) -> str:
    assert result.is_error is True, _text(result)
    assert result.structured_content is not None
    kind: str = result.structured_content["error"]["kind"]
    return kind


def _drive(scenario: Any, errlog_path: Path) -> None:
    try:
        anyio.run(scenario)
    finally:
        # Shown by pytest when the test fails: what the server said on stderr.
        print(errlog_path.read_text(errors="replace"))


@pytest.mark.slow
def test_serve_lists_and_runs(tmp_path: Path) -> None:
    """Over stdio: run_python is listed with the host tools' stubs, and computes, calls tools, prints."""
    errlog_path = tmp_path / "server.err"

    async def scenario() -> None:
        with errlog_path.open("w") as errlog:
            async with _serve(errlog=errlog) as session:
                tools = (await session.list_tools()).tools
                assert [tool.name for tool in tools] == [RUN_PYTHON]
                description = tools[0].description or ""
                assert "def add(a: int, b: int) -> int" in description
                assert "def shout(text: str) -> str" in description

                two = await session.call_tool(
                    RUN_PYTHON, {"code": "result = 1 + 1"}, _FIRST_CALL_TIMEOUT
                )
                assert _value(two) == 2
                assert _text(two) == "2"

                code = 'print("calling")\nresult = [add(2, n), shout("hi")]'
                heard: list[str] = []

                async def progress(done: float, total: float | None, message: str | None) -> None:
                    heard.append(message or "")

                called = await session.call_tool(
                    RUN_PYTHON, {"code": code, "inputs": {"n": 3}}, progress_callback=progress
                )
                # The output came as progress too, before the result.
                assert "".join(m.removeprefix("stdout: ") for m in heard) == "calling\n"
                assert _value(called) == [5, "HI"]
                assert called.structured_content is not None
                assert called.structured_content["stdout"] == "calling\n"
                assert called.structured_content["usage"]["tool_calls"] == 2
                assert _text(called) == '[5, "HI"]\n--- stdout ---\ncalling'

                # A tool's ctx.progress reaches the client as progress, in order.
                heard.clear()
                stepped = await session.call_tool(
                    RUN_PYTHON, {"code": "steps(2)"}, progress_callback=progress
                )
                assert _value(stepped) == 2
                # One notification or two (the forwarder sends what is queued when it wakes).
                said = "".join(m.removeprefix("progress: ") for m in heard)
                assert said == "step (1/2)\nstep (2/2)\n", heard
                assert "ctx" not in description

                await session.call_tool(RUN_PYTHON, {"code": "leftover = 1"})
                fresh = await session.call_tool(RUN_PYTHON, {"code": "'leftover' in globals()"})
                assert _value(fresh) is False

    _drive(scenario, errlog_path)


@pytest.mark.slow
def test_serve_guest_exception_is_a_tool_error(tmp_path: Path) -> None:
    """Code that raises comes back as isError with kind `exception`, and the server carries on."""
    errlog_path = tmp_path / "server.err"

    async def scenario() -> None:
        with errlog_path.open("w") as errlog:
            async with _serve(errlog=errlog) as session:
                failed = await session.call_tool(
                    RUN_PYTHON,
                    {"code": "print('before')\n1 / 0"},
                    _FIRST_CALL_TIMEOUT,
                )
                assert _kind(failed) == "exception"
                text = _text(failed)
                assert text.startswith("exception: ")
                assert "ZeroDivisionError" in text
                assert "--- stdout ---\nbefore" in text
                again = await session.call_tool(RUN_PYTHON, {"code": "result = 'still here'"})
                assert _value(again) == "still here"

    _drive(scenario, errlog_path)


@pytest.mark.slow
def test_serve_deadline_then_clean_call(tmp_path: Path) -> None:
    """Under --timeout 1 an endless loop ends as deadline_exceeded; the next call on the same server is clean."""
    errlog_path = tmp_path / "server.err"

    async def scenario() -> None:
        with errlog_path.open("w") as errlog:
            # Fuel far beyond what a second can burn: the deadline, not the fuel, must end it.
            async with _serve("--timeout", "1", "--fuel", str(10**15), errlog=errlog) as session:
                description = (await session.list_tools()).tools[0].description or ""
                assert "timeout 1 s" in description
                spun = await session.call_tool(
                    RUN_PYTHON, {"code": "while True: pass"}, _FIRST_CALL_TIMEOUT
                )
                assert _kind(spun) == "deadline_exceeded"
                clean = await session.call_tool(RUN_PYTHON, {"code": "result = 1 + 1"})
                assert _value(clean) == 2

    _drive(scenario, errlog_path)


@pytest.mark.slow
def test_serve_keeps_host_prints_off_the_wire() -> None:
    """A host tool's print() never reaches stdout, during the session nor when the server exits."""
    command, prefix = _server_command()
    env = {"PATH": os.environ.get("PATH", "")}
    env.update({key: os.environ[key] for key in ("MTY_CACHE_DIR",) if key in os.environ})
    requests: list[dict[str, Any]] = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "raw", "version": "0"},
            },
        },
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": RUN_PYTHON, "arguments": {"code": "note('host noise')\n7"}},
        },
    ]
    with subprocess.Popen(
        [command, *prefix, "sandbox", "serve", "--tools", "tests.sandbox_mcp.tools:TOOLS"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env=env,
        text=True,
    ) as server:
        assert server.stdin is not None
        assert server.stdout is not None
        replies = []
        for request in requests:
            server.stdin.write(json.dumps(request) + "\n")
            server.stdin.flush()
            if "id" in request:
                replies.append(json.loads(server.stdout.readline()))
        server.stdin.close()
        rest = server.stdout.read()
        stderr = server.stderr.read() if server.stderr is not None else ""
        assert server.wait(timeout=_FIRST_CALL_TIMEOUT) == 0, stderr
    assert replies[1]["result"]["structuredContent"]["value"] == 7
    assert rest == ""
    assert "host noise" in stderr


def test_serve_bad_tools_is_a_usage_error() -> None:
    """A bad --tools is one line on stderr and exit status 2, with nothing on stdout."""
    result = CliRunner().invoke(main, ["sandbox", "serve", "--tools", "no_such_module_x:TOOLS"])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.startswith("mty: error: --tools 'no_such_module_x:TOOLS': cannot import")
    assert result.stderr.count("\n") == 1
