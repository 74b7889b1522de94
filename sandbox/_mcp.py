"""Code mode over MCP: one tool, ``run_python``, served on stdio or Streamable HTTP (see
``_mcp_http``) with the official ``mcp`` SDK.

Every call runs in an interpreter instance that never ran anything (``mty sandbox serve``: from
one shared sandbox's warm pool, for every call of every client), so nothing a call does
(globals, files, a poisoned interpreter) reaches the next one. A guest failure is a tool
*result* with ``isError`` set and the error's ``kind``, as the MCP spec asks for errors a model
can read and correct; a protocol error would hide it from the model, and a crash would end the
session.

No call can bring the server down: ``run_call`` answers every call, whatever happens in it, and
checks its reply serialises as the SDK will write it (strict JSON, valid Unicode) before handing
it over; a reply that does not is replaced by an ``internal`` error result for that call alone.
The SDK writes replies outside the tool handler, where an exception ends the server for every
client; a reply too large for a client's default SSE event limit is an ``output_limit`` result.

A call's output goes to its client as progress notifications while it runs (``_Forwarder``:
queued off the run's thread, bounded, never slowing the run), and streams cut from the result's
view are kept in an ``ArtifactStore`` the client reads as resources, in parts.

Rejected:
- One tool per host function (what a plain MCP bridge does): code mode exists so that a model
  writes one program that calls many tools, instead of one round trip per call.
- The SDK's low-level ``Server``: ``MCPServer`` builds the input schema from the signature and
  passes a returned ``CallToolResult`` through as is, which is all we need.
- A long-lived interpreter shared by calls (faster, but state leaks between calls and one
  runaway call poisons the rest).
- A new ``Sandbox`` per call (what stdio did first): no warm pool, so each call paid for making
  its instance; a shared sandbox's instances are just as unused.
- Artifacts as one resource each: a 2 MiB stream is one SSE event over the SDK client's 1 MiB
  default limit, so the whole could not be read by a default client.
"""

from __future__ import annotations

import asyncio
import importlib
import io
import json
import logging
import os
import secrets
import sys
import threading
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager, redirect_stdout, suppress
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated, Any, Protocol

import anyio
import anyio.to_thread
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ResourceNotFoundError
from mcp.types import CallToolResult, ResourceLink, TextContent
from pydantic import BaseModel, ConfigDict, Field

from mighty._errors import BadInput, MightyError
from mighty.sandbox import Limits, Sandbox, interpreter_component
from mighty.sandbox._data import cut_text, json_problem
from mighty.sandbox._mcp_http import check_bind, parse_bind, read_token, serve_http
from mighty.sandbox._tools import describe_tools, tools_from

__all__ = [
    "ARTIFACT_PART",
    "ARTIFACT_SCHEME",
    "MAX_PROGRESS_MESSAGE",
    "MAX_REPLY",
    "MAX_UNSENT_OUTPUT",
    "MCP_OUTPUT",
    "RUN_PYTHON",
    "ArtifactStore",
    "CallLimits",
    "Preparation",
    "RunOutput",
    "SandboxLike",
    "build_sandbox_server",
    "build_server",
    "check_bind",
    "checked_call_result",
    "describe_limits",
    "load_tools",
    "parse_bind",
    "read_token",
    "render_text",
    "run_call",
    "serve_http",
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

    async def run_async(
        self,
        code: str,
        inputs: Mapping[str, Any] | None = None,
        *,
        on_output: Callable[[str, str], None] | None = None,
        limits: Limits | None = None,
    ) -> RunResultLike:
        """Run ``code`` to completion; ``on_output(stream, text)`` hears its output (any
        thread); ``limits``, when given, are this run's (at most the sandbox's)."""
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


class ArtifactRef(BaseModel):
    """An output stream cut from the view, kept whole: read it at ``uri`` (resources/read)."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(description="stdout or stderr.")
    bytes: int
    sha256: str
    uri: str | None = Field(default=None, description="The artifact's key, as a URI.")
    parts: list[str] = Field(
        default_factory=list,
        description="resources/read each (bytes) and join them in order for the whole stream.",
    )


class CallLimits(BaseModel):
    """Lower limits for one call; each is capped at the server's (a call can ask for less,
    never more)."""

    model_config = ConfigDict(extra="forbid")

    fuel: int | None = Field(default=None, gt=0, description="Wasm fuel (10**10 ~ 1 s).")
    memory: int | None = Field(default=None, ge=32 << 20, description="Bytes of memory.")
    timeout: float | None = Field(default=None, gt=0, le=86400, description="Seconds.")
    output: int | None = Field(default=None, ge=0, description="Bytes of output shown.")
    tool_calls: int | None = Field(default=None, ge=0, description="Host function calls.")

    def within(self, ceiling: Limits) -> Limits:
        """``ceiling`` with each given field lowered to this one's (never raised)."""
        changes = {
            name: min(value, getattr(ceiling, name))
            for name, value in self.model_dump(exclude_none=True).items()
        }
        return ceiling.replace(**changes)


class RunOutput(BaseModel):
    """The structured content of a ``run_python`` result: ``RunResult.to_json()``."""

    model_config = ConfigDict(extra="allow")

    ok: bool
    value: Any = Field(default=None, description="The run's value (JSON); null on failure.")
    stdout: str = ""
    stderr: str = ""
    error: RunError | None = None
    usage: RunUsage | None = None
    artifacts: list[ArtifactRef] = Field(
        default_factory=list,
        description="Streams longer than the output limit: stdout/stderr above are cut.",
    )


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
    cut = {
        str(ref.get("name")): ref
        for ref in document.get("artifacts") or ()
        if isinstance(ref, Mapping)
    }
    for name in ("stdout", "stderr"):
        text = document.get(name)
        ref = cut.get(name)
        if ref is not None:
            where = f" at {ref['uri']}" if ref.get("uri") else ""
            parts.append(
                f"--- {name} (cut; {ref.get('bytes')} bytes in all{where}) ---\n"
                f"{str(text or '').rstrip()}"
            )
        elif text:
            parts.append(f"--- {name} ---\n{str(text).rstrip()}")
    return "\n".join(parts)


def to_call_result(document: Mapping[str, Any]) -> CallToolResult:
    """The MCP result of a run: text rendering, a link per artifact, the document as structured
    content, isError."""
    content: list[TextContent | ResourceLink] = [
        TextContent(type="text", text=render_text(document))
    ]
    for ref in document.get("artifacts") or ():
        if not isinstance(ref, Mapping):
            continue
        parts = [str(uri) for uri in ref.get("parts") or ()]
        for index, uri in enumerate(parts):
            content.append(
                ResourceLink(
                    type="resource_link",
                    uri=uri,
                    name=f"{ref.get('name')}-{index}",
                    mime_type="application/octet-stream",
                    description=(
                        f"part {index + 1} of {len(parts)} of the whole {ref.get('name')} "
                        f"({ref.get('bytes')} bytes, sha256 {ref.get('sha256')})"
                    ),
                )
            )
    return CallToolResult(
        content=list(content),
        structured_content=dict(document),
        is_error=not document.get("ok"),
    )


# -- artifacts and progress -----------------------------------------------------------------

ARTIFACT_SCHEME = "mighty-artifact"
ARTIFACT_PART = 512 << 10
"""Bytes of an artifact per resource (base64: ~683 KiB, under a client's 1 MiB SSE event)."""
MAX_REPLY = 1000 << 10
"""Most bytes of JSON in one ``run_python`` reply: the SDK client refuses an SSE event over
1 MiB by default. (The default output view, ``MCP_OUTPUT``, keeps replies far below.)"""
MCP_OUTPUT = 64 << 10
"""The server's default ``Limits.output``: what a model sees of a call's output (the rest is an
artifact). It appears twice in a reply (text and structured content)."""
MAX_UNSENT_OUTPUT = 256 << 10
"""Characters of a call's output waiting to be sent as progress; more is dropped and counted."""
MAX_PROGRESS_MESSAGE = 16 << 10
"""Characters of output in one progress notification."""


class ArtifactStore:
    """Recent calls' artifacts, read back with ``resources/read``: at most ``max_items`` and
    ``max_bytes`` together, the oldest dropped first. Thread-safe.

    Each is named by a fresh random key (144 bits) that only the call's own result carries, so
    a client cannot read another client's output without being handed its link.
    """

    def __init__(self, *, max_bytes: int = 64 << 20, max_items: int = 256) -> None:
        self.max_bytes = max_bytes
        self.max_items = max_items
        self._items: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, data: bytes) -> str | None:
        """Keep ``data``; its URI, or None when it alone is over ``max_bytes``."""
        if len(data) > self.max_bytes:
            return None
        key = secrets.token_urlsafe(18)
        with self._lock:
            self._items[key] = data
            self._bytes += len(data)
            while self._bytes > self.max_bytes or len(self._items) > self.max_items:
                _, old = self._items.popitem(last=False)
                self._bytes -= len(old)
        return f"{ARTIFACT_SCHEME}://{key}"

    def get(self, key: str) -> bytes | None:
        with self._lock:
            return self._items.get(key)

    def part(self, key: str, index: str) -> bytes:
        """Bytes ``index * ARTIFACT_PART`` on of artifact ``key`` (the SDK's
        ``ResourceNotFoundError``, answered as "not found", if there is none)."""
        data = self.get(key)
        if data is None:
            raise ResourceNotFoundError("no such artifact (unknown, or dropped to make room)")
        if not index.isdigit() or len(index) > 6 or int(index) * ARTIFACT_PART >= len(data):
            raise ResourceNotFoundError(f"no part {index[:20]!r} of this artifact")
        start = int(index) * ARTIFACT_PART
        return data[start : start + ARTIFACT_PART]

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


def _store_artifacts(store: ArtifactStore, result: object, document: dict[str, Any]) -> None:
    whole = {getattr(a, "name", None): getattr(a, "data", None) for a in _artifacts_of(result)}
    for ref in document.get("artifacts") or ():
        data = whole.get(ref.get("name"))
        if isinstance(data, bytes):
            uri = store.put(data)
            if uri is not None:
                ref["uri"] = uri
                count = max(1, -(-len(data) // ARTIFACT_PART))
                ref["parts"] = [f"{uri}/{index}" for index in range(count)]


def _artifacts_of(result: object) -> Sequence[object]:
    artifacts = getattr(result, "artifacts", ())
    return artifacts if isinstance(artifacts, tuple | list) else ()


def _progress_token(ctx: Context) -> str | int | None:
    try:
        meta = ctx.request_context.meta
    except (AttributeError, ValueError):
        return None
    if not meta:
        return None
    token = meta.get("progress_token", meta.get("progressToken"))
    return token if isinstance(token, str | int) else None


class _Forwarder:
    """A call's output as MCP progress notifications, sent from the server's loop.

    Called (``forwarder(stream, text)``) on the run's worker thread: it only queues the text
    (at most :data:`MAX_UNSENT_OUTPUT` characters waiting; what comes beyond is counted and
    reported as dropped) and wakes ``pump``, which sends one notification per stream change or
    :data:`MAX_PROGRESS_MESSAGE` characters: ``message`` is ``"stdout: <text>"`` or
    ``"stderr: <text>"``, ``progress`` the characters sent so far. A client that is gone or
    slow never slows the run: sending happens off its thread, and a send error stops the
    forwarding, not the call.
    """

    def __init__(self, send: Callable[[float, str], Awaitable[None]], start: float = 0) -> None:
        self._send = send
        self._loop = asyncio.get_running_loop()
        self._lock = threading.Lock()
        self._queue: deque[tuple[str, str]] = deque()
        self._queued = 0
        self._dropped = 0
        self._woken = False
        self._done = False
        self._wake = asyncio.Event()
        self.sent = start  # progress only grows: it goes on from what was reported before

    def __call__(self, stream: str, text: str) -> None:
        with self._lock:
            if self._queued + len(text) > MAX_UNSENT_OUTPUT:
                self._dropped += len(text)
            else:
                self._queue.append((stream, text))
                self._queued += len(text)
            if self._woken:
                return
            self._woken = True
        self._loop.call_soon_threadsafe(self._wake.set)

    def close(self) -> None:
        """No more output (called on the loop): ``pump`` sends what is left and returns."""
        self._done = True
        self._wake.set()

    def _take(self) -> tuple[list[tuple[str, str]], int]:
        with self._lock:
            self._woken = False
            items = list(self._queue)
            self._queue.clear()
            self._queued = 0
            dropped, self._dropped = self._dropped, 0
        return items, dropped

    async def pump(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            items, dropped = self._take()
            for message in _messages(items, dropped):
                self.sent += len(message)
                try:
                    await self._send(float(self.sent), message)
                except Exception:  # noqa: BLE001 - the client left; the call goes on
                    _log.debug("progress notification failed; no more for this call")
                    return
            if self._done and not self._queue:
                return


def _messages(items: list[tuple[str, str]], dropped: int) -> Iterator[str]:
    stream, size = "", 0
    parts: list[str] = []
    for name, text in items:
        if name != stream or size >= MAX_PROGRESS_MESSAGE:
            if parts:
                yield from _split(stream, "".join(parts))
            stream, parts, size = name, [], 0
        parts.append(text)
        size += len(text)
    if parts:
        yield from _split(stream, "".join(parts))
    if dropped:
        yield f"[{dropped} characters of output not forwarded: the client reads too slowly]"


def _split(stream: str, text: str) -> Iterator[str]:
    for start in range(0, len(text), MAX_PROGRESS_MESSAGE):
        yield f"{stream}: {text[start : start + MAX_PROGRESS_MESSAGE]}"


class _Admission:
    """At most ``running`` calls run at once and ``waiting`` more wait; past that, ``busy``."""

    def __init__(self, running: int, waiting: int) -> None:
        self.running = running
        self.waiting = waiting
        self._slots = asyncio.Semaphore(running)
        self._inside = 0

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[bool]:
        if self._inside >= self.running + self.waiting:
            yield False
            return
        self._inside += 1
        try:
            async with self._slots:
                yield True
        finally:
            self._inside -= 1


def _busy(admission: _Admission) -> dict[str, Any]:
    message = (
        f"the server is running {admission.running} calls and {admission.waiting} more are "
        "waiting; try again shortly"
    )
    document = _internal_failure(message)
    document["error"]["kind"] = "busy"
    return document


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
call per tool call. `limits`, if given, lowers this call's limits (fuel, memory, timeout, output,
tool_calls; capped at the server's). Output past the output limit is cut from stdout/stderr and
listed under `artifacts`. A failed run reports an error kind (exception, tool_error, out_of_fuel,
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
            size = len(result.model_dump_json(by_alias=True, exclude_none=True).encode())
            if size <= MAX_REPLY:
                return result
            return to_call_result(_too_large(size))
    except Exception as exc:  # noqa: BLE001 - any failure here is this call's, not the server's
        problem = f"the reply could not be serialised: {type(exc).__name__}: {exc}"
    message = cut_text(f"internal error: {problem}", 1024)
    _log.error("run_python: %s", message)
    return to_call_result(_internal_failure(message))


def _too_large(size: int) -> dict[str, Any]:
    document = _internal_failure(
        f"the reply would be {size} bytes of JSON, over the {MAX_REPLY} an MCP client takes in "
        "one message (the SDK's default SSE event limit is 1 MiB): print or return less"
    )
    document["error"]["kind"] = "output_limit"
    return document


async def run_call(
    sandbox: SandboxLike,
    code: str,
    inputs: Mapping[str, Any] | None,
    *,
    on_output: Callable[[str, str], None] | None = None,
    artifacts: ArtifactStore | None = None,
    limits: Limits | None = None,
) -> CallToolResult:
    """Run ``code`` in ``sandbox``, close it, and make the MCP result (``isError`` on failure).

    ``on_output`` hears the run's output as it is written; with ``artifacts``, each stream cut
    from the view is kept there and its reference gets a ``uri``.
    Never raises (but for cancellation): a failure of the host itself is an ``internal`` error
    result for this call, and the server goes on serving the others.
    """
    try:
        try:
            extra: dict[str, Any] = {}
            if on_output is not None:
                extra["on_output"] = on_output
            if limits is not None:
                extra["limits"] = limits
            result = await sandbox.run_async(code, inputs, **extra)
        finally:
            sandbox.close()
        document = result.to_json()
        if artifacts is not None:
            _store_artifacts(artifacts, result, document)
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
    concurrency: tuple[int, int] | None = None,
    artifacts: ArtifactStore | None = None,
    call_limits: Limits | None = None,
) -> MCPServer[Any]:
    """An MCP server with one tool, ``run_python``, that runs each call in ``new_sandbox()``.

    The tools' stubs in the description are ``stubs``, or else those of a ``new_sandbox()``
    made once here. With a ``preparation``, each call first waits for it.
    ``concurrency=(running, waiting)`` bounds the calls at once (past it a call is a ``busy``
    error at once). A call whose client asked for progress gets its output as progress
    notifications while it runs. With ``artifacts``, streams cut from a result's view are
    kept there and readable as resources ``mighty-artifact://<key>/<part>``. With
    ``call_limits`` (the sandbox's), a call may pass ``limits`` to lower them for itself; without,
    a call that passes ``limits`` is refused (``bad_input``).
    ``serverInfo.version`` is mighty's version.
    """
    admission = None if concurrency is None else _Admission(*concurrency)

    async def run_python(
        ctx: Context,
        code: Annotated[str, Field(description="Python source to run.")],
        inputs: Annotated[
            dict[str, Any] | None,
            Field(description="JSON object; each key becomes a global variable of the code."),
        ] = None,
        limits: Annotated[
            CallLimits | None,
            Field(description="Lower limits for this call (capped at the server's)."),
        ] = None,
    ) -> Annotated[CallToolResult, RunOutput]:
        reported = [0.0]  # the last progress value this call sent
        if preparation is not None and not preparation.ready:

            async def report(elapsed: float) -> None:
                reported[0] = elapsed
                message = f"preparing the Python interpreter (first start): {elapsed:.0f} s"
                with suppress(Exception):  # progress is a courtesy; the call goes on
                    await ctx.report_progress(elapsed, None, message)

            try:
                await preparation.wait_async(report)
            except MightyError as exc:
                return checked_call_result(_host_failure(exc))
        elif preparation is not None and preparation.error is not None:
            return checked_call_result(_host_failure(preparation.error))
        run_limits = None
        if limits is not None:
            if call_limits is None:
                refused = BadInput("this server takes no per-call limits")
                return checked_call_result(_host_failure(refused))
            run_limits = limits.within(call_limits)
        if admission is None:
            return await _forwarding_call(
                ctx, new_sandbox, code, inputs, artifacts, run_limits, reported[0]
            )
        async with admission.slot() as admitted:
            if not admitted:
                return checked_call_result(_busy(admission))
            return await _forwarding_call(
                ctx, new_sandbox, code, inputs, artifacts, run_limits, reported[0]
            )

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
    if artifacts is not None:
        store = artifacts

        def read_artifact_part(key: str, index: str) -> bytes:
            return store.part(key, index)

        server.resource(
            f"{ARTIFACT_SCHEME}://{{key}}/{{index}}",
            name="artifact",
            description=(
                "Part of the whole stdout or stderr of a run_python call whose view was cut "
                f"(bytes, {ARTIFACT_PART} per part; join the parts in order)."
            ),
            mime_type="application/octet-stream",
        )(read_artifact_part)
    return server


async def _forwarding_call(
    ctx: Context,
    new_sandbox: Callable[[], SandboxLike],
    code: str,
    inputs: Mapping[str, Any] | None,
    artifacts: ArtifactStore | None,
    limits: Limits | None,
    progressed: float,
) -> CallToolResult:
    if _progress_token(ctx) is None:
        return await run_call(new_sandbox(), code, inputs, artifacts=artifacts, limits=limits)

    async def send(progress: float, message: str) -> None:
        await ctx.report_progress(progress, None, message)

    forwarder = _Forwarder(send, progressed)
    pump = asyncio.ensure_future(forwarder.pump())
    try:
        return await run_call(
            new_sandbox(), code, inputs, on_output=forwarder, artifacts=artifacts, limits=limits
        )
    finally:
        # Every notification goes out before the result: the client has all of it when the
        # call returns.
        forwarder.close()
        try:
            await asyncio.wait([pump])
        finally:
            pump.cancel()  # a no-op once it returned; else (we were cancelled) it stops


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
    output: int | None = None,
    background: bool = True,
    pool: int = 4,
    concurrency: tuple[int, int] = (8, 64),
) -> MCPServer[Any]:
    """The server of ``mty sandbox serve``: one ``Sandbox`` with these tools and limits (the
    sandbox's defaults for those not given) and ``pool`` warm instances, serving every call
    and every client; each call runs in a never-used instance under its own budget.

    Bad limits or tools fail here. The interpreter (built and compiled on first use on this
    machine, tens of seconds) is prepared in the background when ``background``, so that the
    server answers ``initialize`` at once and the first call waits for it; else here, before
    serving. ``progress`` hears about it either way. ``concurrency`` is (calls running, calls
    waiting) at most; more is a ``busy`` result at once. ``output`` is what a call's result
    shows of its stdout and stderr (default :data:`MCP_OUTPUT`); the rest, up to the sandbox's
    ``Limits.artifact``, is an artifact the client reads as resources.
    """
    given: dict[str, Any] = {
        "fuel": fuel,
        "memory": memory,
        "timeout": timeout,
        "output": MCP_OUTPUT if output is None else output,
    }
    try:
        limits = Limits().replace(
            **{key: value for key, value in given.items() if value is not None}
        )
        checked = tools_from(tools)  # a bad tool fails here, at start, not at the first call
    except MightyError:
        raise
    except (TypeError, ValueError) as exc:
        raise BadInput(str(exc)) from exc
    shared: list[Sandbox] = []

    # One sandbox for every call: each run already takes an instance that never ran anything
    # (from the pool, made ahead of time) and closes it after; what the sandbox itself keeps
    # (the pool, the tools' loop thread) holds no run's state.
    def prepare() -> None:
        interpreter_component(progress)
        shared.append(Sandbox(tools, limits=limits, pool=pool))

    preparation: Preparation | None = None
    if background:
        preparation = Preparation(prepare)
    else:
        prepare()

    def new_sandbox() -> SandboxLike:
        return _Borrowed(shared[0])

    return build_server(
        new_sandbox,
        limits=describe_limits(limits),
        stubs=describe_tools(checked),
        preparation=preparation,
        concurrency=concurrency,
        artifacts=ArtifactStore(),
        call_limits=limits,
    )


class _Borrowed:
    """The shared sandbox for one call: ``close`` gives it back (it stays open)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox

    async def run_async(
        self,
        code: str,
        inputs: Mapping[str, Any] | None = None,
        *,
        on_output: Callable[[str, str], None] | None = None,
        limits: Limits | None = None,
    ) -> RunResultLike:
        return await self._sandbox.run_async(code, inputs, on_output=on_output, limits=limits)

    def describe_tools(self) -> str:
        return self._sandbox.describe_tools()

    def close(self) -> None:
        """Nothing: the sandbox serves the next call."""


def describe_limits(limits: Limits) -> str:
    """The limits of one run, as a phrase for the tool description."""
    return (
        f"fuel {limits.fuel}, memory {limits.memory} bytes, "
        f"timeout {limits.timeout:g} s (time inside host functions not counted), "
        f"output {limits.output} bytes shown (up to {max(limits.output, limits.artifact)} "
        f"kept as a resource), {limits.tool_calls} host function calls"
    )
