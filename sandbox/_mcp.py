"""Code mode over MCP: one tool, ``run_python``, served on stdio with the official ``mcp`` SDK.

Every call runs in a fresh sandbox, so nothing a call does (globals, files, a poisoned
interpreter) reaches the next one. A guest failure is a tool *result* with ``isError`` set and the
error's ``kind``, as the MCP spec asks for errors a model can read and correct; a protocol error
would hide it from the model, and a crash would end the session.

No call can bring the server down: ``run_call`` answers every call, whatever happens in it, and
checks its reply serialises as the SDK will write it (strict JSON, valid Unicode) before handing
it over; a reply that does not is replaced by an ``internal`` error result for that call alone.
The SDK writes replies outside the tool handler, where an exception ends the server for every
client.

Rejected:
- One tool per host function (what a plain MCP bridge does): code mode exists so that a model
  writes one program that calls many tools, instead of one round trip per call.
- The SDK's low-level ``Server``: ``MCPServer`` builds the input schema from the signature and
  passes a returned ``CallToolResult`` through as is, which is all we need.
- A long-lived interpreter shared by calls (faster, but state leaks between calls and one
  runaway call poisons the rest).
"""

from __future__ import annotations

import importlib
import io
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, redirect_stdout, suppress
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated, Any, Protocol

import anyio
import anyio.to_thread
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.types import CallToolResult, TextContent
from pydantic import BaseModel, ConfigDict, Field

from mighty._errors import BadInput, MightyError
from mighty.sandbox import Limits, Sandbox, interpreter_component
from mighty.sandbox._tools import cut_text, describe_tools, json_problem, tools_from

__all__ = [
    "RUN_PYTHON",
    "Preparation",
    "RunOutput",
    "SandboxLike",
    "build_sandbox_server",
    "build_server",
    "checked_call_result",
    "describe_limits",
    "load_tools",
    "render_text",
    "run_call",
    "serve_stdio",
    "stdout_to_stderr",
    "to_call_result",
    "tool_description",
]

RUN_PYTHON = "run_python"
_log = logging.getLogger(__name__)


class RunResultLike(Protocol):
    """What the server needs of a ``RunResult``."""

    def to_json(self) -> dict[str, Any]:
        """The result as a JSON object."""
        ...


class SandboxLike(Protocol):
    """What the server needs of a ``Sandbox``: ``mighty.sandbox.Sandbox`` fits, and so do fakes."""

    async def run_async(self, code: str, inputs: Mapping[str, Any] | None = None) -> RunResultLike:
        """Run ``code`` to completion."""
        ...

    def describe_tools(self) -> str:
        """A typed Python stub of the registered tools."""
        ...

    def close(self) -> None:
        """Free what the sandbox holds."""
        ...


# The output schema a client sees. Lenient on purpose (extra keys allowed, usage numbers may be
# absent): it documents RunResult.to_json() without pinning every field of it.
class RunError(BaseModel):
    """Why a run failed."""

    model_config = ConfigDict(extra="allow")

    kind: str = Field(description="Stable error kind, e.g. exception, deadline_exceeded.")
    message: str
    traceback: str | None = None


class RunUsage(BaseModel):
    """What a run used."""

    model_config = ConfigDict(extra="allow")

    fuel: int | None = None
    memory_peak: int | None = None
    wall_ms: float | None = None
    tool_calls: int | None = None
    tool_ms: float | None = None


class RunOutput(BaseModel):
    """The structured content of a ``run_python`` result: ``RunResult.to_json()``."""

    model_config = ConfigDict(extra="allow")

    ok: bool
    value: Any = Field(default=None, description="The run's value (JSON); null on failure.")
    stdout: str = ""
    stderr: str = ""
    error: RunError | None = None
    usage: RunUsage | None = None


# -- rendering ----------------------------------------------------------------------------------


def render_text(document: Mapping[str, Any]) -> str:
    """A short text rendering of a run: the value, or the error kind and message, then outputs.

    The text block is what many clients show a model; the full result is the structured content.
    """
    if document.get("ok"):
        head = json.dumps(document.get("value"), ensure_ascii=False, default=repr)
    else:
        error = document.get("error") or {}
        head = f"{error.get('kind', 'error')}: {error.get('message', '')}".rstrip()
        if error.get("traceback"):
            head += "\n" + str(error["traceback"]).rstrip()
    parts = [head]
    for name in ("stdout", "stderr"):
        text = document.get(name)
        if text:
            parts.append(f"--- {name} ---\n{str(text).rstrip()}")
    return "\n".join(parts)


def to_call_result(document: Mapping[str, Any]) -> CallToolResult:
    """The MCP result of a run: text rendering, the document as structured content, isError."""
    return CallToolResult(
        content=[TextContent(type="text", text=render_text(document))],
        structured_content=dict(document),
        is_error=not document.get("ok"),
    )


def _host_failure(exc: MightyError) -> dict[str, Any]:
    # The host refused the run (bad inputs, no interpreter): same shape as a failed run, so a
    # client reads every failure one way.
    return {
        "ok": False,
        "value": None,
        "stdout": "",
        "stderr": "",
        "error": {"kind": exc.kind, "message": cut_text(exc.message, 4096), "traceback": ""},
        "usage": None,
    }


# -- the server ---------------------------------------------------------------------------------

_SUMMARY = """\
Run Python code in a fresh WebAssembly sandbox and return its value.

The value is the global `result` if the code sets one, else the value of its last expression; it
must be JSON-compatible (None, bool, int, float, str, list, dict). Each call starts a new
interpreter: nothing persists between calls. `inputs`, if given, is a JSON object whose keys
become global variables. print() output comes back as stdout. There is no network and no host
filesystem: the code reaches the host only through the functions below, which are already in
scope. Do many tool calls and the work between them in one program rather than one run_python
call per tool call. A failed run reports an error kind (exception, tool_error, out_of_fuel,
out_of_memory, deadline_exceeded, output_limit, tool_limit, ...) and a message."""


def tool_description(sandbox: SandboxLike, *, limits: str | None = None) -> str:
    """The ``run_python`` description: how to use it, the limits, and the host tools' stubs."""
    return _description(sandbox.describe_tools(), limits)


def _description(stubs: str, limits: str | None) -> str:
    parts = [_SUMMARY]
    if limits:
        parts.append(f"Limits per call: {limits}. Exceeding one ends the call with an error.")
    parts.append(f"Host functions available to the code:\n```python\n{stubs.strip()}\n```")
    return "\n\n".join(parts)


def _internal_failure(message: str) -> dict[str, Any]:
    return {
        "ok": False,
        "value": None,
        "stdout": "",
        "stderr": "",
        "error": {"kind": "internal", "message": message, "traceback": ""},
        "usage": None,
    }


def checked_call_result(document: Mapping[str, Any]) -> CallToolResult:
    """``to_call_result(document)``, or an ``internal`` error result if the reply would not
    serialise as strict JSON with valid Unicode (what would kill the SDK's writer)."""
    try:
        problem = json_problem(json.loads(json.dumps(document, allow_nan=False)), "the reply")
        if problem is None:
            result = to_call_result(document)
            result.model_dump_json(by_alias=True, exclude_none=True)
            return result
    except Exception as exc:  # noqa: BLE001 - any failure here is this call's, not the server's
        problem = f"the reply could not be serialised: {type(exc).__name__}: {exc}"
    message = cut_text(f"internal error: {problem}", 1024)
    _log.error("run_python: %s", message)
    return to_call_result(_internal_failure(message))


async def run_call(
    sandbox: SandboxLike, code: str, inputs: Mapping[str, Any] | None
) -> CallToolResult:
    """Run ``code`` in ``sandbox``, close it, and make the MCP result (``isError`` on failure).

    Never raises (but for cancellation): a failure of the host itself is an ``internal`` error
    result for this call, and the server goes on serving the others.
    """
    try:
        try:
            result = await sandbox.run_async(code, inputs)
        finally:
            sandbox.close()
        document = result.to_json()
    except MightyError as exc:
        document = _host_failure(exc)
    except Exception as exc:  # noqa: BLE001 - one call's failure must not end the server
        message = cut_text(f"internal error: {type(exc).__name__}: {exc}", 1024)
        _log.exception("run_python failed")
        document = _internal_failure(message)
    return checked_call_result(document)


class Preparation:
    """The interpreter built and compiled in a background thread, from the server's start.

    The server answers ``initialize`` and ``tools/list`` at once; a call waits for this first
    (reporting MCP progress when the client asked for it). A failure is every call's error.
    """

    def __init__(self, prepare: Callable[[], object]) -> None:
        self.started = time.monotonic()
        self.error: MightyError | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(prepare,), name="mighty-mcp-prepare", daemon=True
        )
        self._thread.start()

    def _run(self, prepare: Callable[[], object]) -> None:
        try:
            prepare()
        except MightyError as exc:
            self.error = exc
            _log.error("preparing the interpreter failed: %s", exc.message)
        except Exception as exc:  # noqa: BLE001 - reported to every call instead of lost
            self.error = MightyError(f"preparing the interpreter failed: {exc}")
            _log.exception("preparing the interpreter failed")
        finally:
            self._done.set()

    @property
    def ready(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    async def wait_async(self, report: Callable[[float], Awaitable[None]] | None = None) -> None:
        """Wait without blocking the event loop; ``report(elapsed)`` about every second."""
        while not self._done.is_set():
            await anyio.to_thread.run_sync(self._done.wait, 1.0)
            if report is not None and not self._done.is_set():
                await report(time.monotonic() - self.started)
        if self.error is not None:
            raise self.error


def build_server(
    new_sandbox: Callable[[], SandboxLike],
    *,
    limits: str | None = None,
    name: str = "mighty-sandbox",
    stubs: str | None = None,
    preparation: Preparation | None = None,
) -> MCPServer[Any]:
    """An MCP server with one tool, ``run_python``, that runs each call in ``new_sandbox()``.

    The tools' stubs in the description are ``stubs``, or else those of a ``new_sandbox()``
    made once here. With a ``preparation``, each call first waits for it.
    ``serverInfo.version`` is mighty's version.
    """

    async def run_python(
        ctx: Context,
        code: Annotated[str, Field(description="Python source to run.")],
        inputs: Annotated[
            dict[str, Any] | None,
            Field(description="JSON object; each key becomes a global variable of the code."),
        ] = None,
    ) -> Annotated[CallToolResult, RunOutput]:
        if preparation is not None and not preparation.ready:

            async def report(elapsed: float) -> None:
                message = f"preparing the Python interpreter (first start): {elapsed:.0f} s"
                with suppress(Exception):  # progress is a courtesy; the call goes on
                    await ctx.report_progress(elapsed, None, message)

            try:
                await preparation.wait_async(report)
            except MightyError as exc:
                return checked_call_result(_host_failure(exc))
        elif preparation is not None and preparation.error is not None:
            return checked_call_result(_host_failure(preparation.error))
        return await run_call(new_sandbox(), code, inputs)

    server: MCPServer[Any] = MCPServer(
        name,
        instructions="Code mode: call run_python with a Python program; it can call host tools.",
        version=_version(),
        log_level="WARNING",
    )
    # Given stubs spare a sandbox made here (which would wait for the interpreter).
    description = _describe(new_sandbox(), limits) if stubs is None else _description(stubs, limits)
    server.add_tool(
        run_python,
        name=RUN_PYTHON,
        title="Run Python in a sandbox",
        description=description,
    )
    return server


def _version() -> str:
    try:
        return version("mighty-host")
    except PackageNotFoundError:
        return "0+unknown"


def _describe(sandbox: SandboxLike, limits: str | None) -> str:
    try:
        return tool_description(sandbox, limits=limits)
    finally:
        sandbox.close()


# -- process plumbing ---------------------------------------------------------------------------


@contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send file descriptor 1 to stderr for the duration: stdout is the MCP channel.

    At the descriptor level, so output of native code and subprocesses is caught too, and at
    ``sys.stdout`` in case that is not descriptor 1. While it serves, the SDK's stdio transport
    guards the descriptor on its own.
    """
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        with redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def serve_stdio(server: MCPServer[Any]) -> None:
    """Serve on stdin and stdout until stdin closes; then descriptor 1 stays on stderr.

    While serving, the SDK points descriptor 1 at stderr and writes the protocol through a
    private copy, so a host tool's print() misses the wire. But what it leaves in the
    ``sys.stdout`` buffer would be flushed at exit, after descriptor 1 is the wire again: line
    buffering flushes most of it while it is harmless, and the rest goes to stderr at the end.
    """
    sys.stdout.flush()
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)
    try:
        server.run("stdio")
    finally:
        os.dup2(2, 1)
        sys.stdout.flush()


def load_tools(spec: str) -> list[Callable[..., Any]] | dict[str, Callable[..., Any]]:
    """Import ``MODULE:ATTR``, a list or dict of callables (trusted host configuration).

    The working directory is importable, as under ``python -m``.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise BadInput(f"--tools {spec!r}: expected MODULE:ATTR, e.g. mytools:TOOLS")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BadInput(f"--tools {spec!r}: cannot import {module_name!r}: {exc}") from exc
    try:
        value = getattr(module, attr)
    except AttributeError:
        raise BadInput(f"--tools {spec!r}: module {module_name!r} has no {attr!r}") from None
    if isinstance(value, dict):
        bad = [str(k) for k, item in value.items() if not isinstance(k, str) or not callable(item)]
        if bad:
            raise BadInput(f"--tools {spec!r}: not a name -> callable entry: {', '.join(bad)}")
        return dict(value)
    if isinstance(value, list | tuple):
        bad = [repr(item) for item in value if not callable(item)]
        if bad:
            raise BadInput(f"--tools {spec!r}: not callable: {', '.join(bad)}")
        return list(value)
    raise BadInput(
        f"--tools {spec!r}: expected a list or dict of callables, got {type(value).__name__}"
    )


def build_sandbox_server(
    *,
    tools: Sequence[Callable[..., Any]] | Mapping[str, Callable[..., Any]] | None = None,
    fuel: int | None = None,
    memory: int | None = None,
    timeout: float | None = None,
    progress: Callable[[str], None] | None = None,
    background: bool = True,
) -> MCPServer[Any]:
    """The server of ``mty sandbox serve``: a new ``Sandbox`` per call, with these tools and
    limits (the sandbox's defaults for those not given).

    Bad limits or tools fail here. The interpreter (built and compiled on first use on this
    machine, tens of seconds) is prepared in the background when ``background``, so that the
    server answers ``initialize`` at once and the first call waits for it; else here, before
    serving. ``progress`` hears about it either way.
    """
    given: dict[str, Any] = {"fuel": fuel, "memory": memory, "timeout": timeout}
    try:
        limits = Limits().replace(
            **{key: value for key, value in given.items() if value is not None}
        )
        checked = tools_from(tools)  # a bad tool fails here, at start, not at the first call
    except MightyError:
        raise
    except (TypeError, ValueError) as exc:
        raise BadInput(str(exc)) from exc
    preparation: Preparation | None = None
    if background:
        preparation = Preparation(lambda: interpreter_component(progress))
    else:
        interpreter_component(progress)

    # Every run of a Sandbox is already a never-used interpreter instance; a Sandbox per call
    # (with no spares) adds that nothing made for one call, no spare instance nor tool-loop
    # thread, outlives it.
    def new_sandbox() -> Sandbox:
        return Sandbox(tools, limits=limits, pool=0)

    return build_server(
        new_sandbox,
        limits=describe_limits(limits),
        stubs=describe_tools(checked),
        preparation=preparation,
    )


def describe_limits(limits: Limits) -> str:
    """The limits of one run, as a phrase for the tool description."""
    return (
        f"fuel {limits.fuel}, memory {limits.memory} bytes, "
        f"timeout {limits.timeout:g} s (time inside host functions not counted), "
        f"output {limits.output} bytes, {limits.tool_calls} host function calls"
    )
