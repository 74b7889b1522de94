"""The MCP client broker: one connection per declared MCP server, shared by every agent and
sandbox granted its tools.

An :class:`McpClient` starts its server (stdio: a child process; Streamable HTTP: a URL) on a
background event loop of its own, runs the ``initialize`` handshake and ``tools/list`` with the
official ``mcp`` SDK's ``ClientSession``, checks every listed tool (its name, its JSON schema) and
keeps the session open. Calls come from any thread (``call``) or event loop (``acall``); each
runs on the client's loop under its own timeout. When the connection ends (the process died, the
pipe closed, a message over the size bound) every call in flight fails at once with
:class:`McpUnavailable`, new calls fail the same way while the server is down, and a supervisor
task restarts it with exponential backoff. ``close`` ends it and its process.

Everything the server sends is bounded before it is decoded: the stdio transport here reads the
server's stdout in chunks and refuses a line (one JSON-RPC message) longer than
``max_message`` by dropping the connection (the SDK's own stdio client buffers a line of any
length); the HTTP transport has the SDK's SSE event bound and a byte cap on each response body
(:class:`_CappedTransport`). A tool's result is then cut to what a tool may return by the tool
layer (``mighty.sandbox`` ``MAX_DATA``).

Rejected:
- The SDK's ``stdio_client``: an endless line from a hostile server grows one Python string
  without bound. Ours reads bytes and counts them.
- A connection per call (what a naive bridge does): an MCP server's start costs ~0.2-2 s and
  many servers keep state per session.
- Restarting inside the failed call: the caller would wait for a start it did not ask for, and
  a server that dies at start would be restarted at the pace of calls. The supervisor restarts
  with backoff; calls meanwhile fail typed, at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mighty._errors import BadInput, HostError

if TYPE_CHECKING:
    from mcp.client.session import ClientSession

__all__ = [
    "LineSplitter",
    "McpClient",
    "McpServer",
    "McpToolFailed",
    "McpToolInfo",
    "McpUnavailable",
]

_log = logging.getLogger("mighty.capabilities")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")
_TOOL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
MAX_TOOLS = 1024
"""Most tools one server may list (more: the listing is refused)."""
MAX_SCHEMA = 64 << 10
"""Most bytes of one tool's input schema, as JSON."""
_BACKOFF_FIRST = 0.2
_BACKOFF_MOST = 10.0
_STOP_GRACE = 2.0


class McpUnavailable(HostError):
    """The MCP server is not connected (starting, restarting after a failure, or closed)."""

    kind = "unavailable"


class McpToolFailed(HostError):
    """The server answered the call with an error result (``isError``); the text is its."""

    kind = "tool_failed"


@dataclass(frozen=True)
class McpServer:
    """An external MCP server, as data: how to reach it and which of its tools to offer.

    Exactly one of ``command`` (stdio: the program and its arguments) and ``url`` (Streamable
    HTTP) is given. ``token`` names where a bearer token for ``url`` is, never the token:
    ``"${ENV_VAR}"`` or ``"@/path/to/file"``, read when the client connects. ``env`` is added to
    the child's environment (which otherwise holds only PATH, HOME, LANG and the like, never
    the host's secrets); a value ``"${VAR}"`` is read from the host's environment.
    ``tools``: the only tools offered (None: all it lists).
    """

    name: str
    command: tuple[str, ...] = ()
    url: str | None = None
    token: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    tools: frozenset[str] | None = None
    timeout: float = 60.0
    """Seconds one call may take (a tool's own ``timeout`` may be shorter)."""
    connect_timeout: float = 30.0
    """Seconds the start, the handshake and the tool listing may take together."""
    max_message: int = 4 << 20
    """Most bytes of one message from the server; a longer one drops the connection."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise BadInput(
                f"MCP server name {self.name!r}: letters, digits, '_' and '-', at most 64,"
                " not starting with a digit or '-'"
            )
        object.__setattr__(self, "command", tuple(self.command))
        if (not self.command) == (self.url is None):
            raise BadInput(f"MCP server {self.name}: give exactly one of command= or url=")
        if self.url is not None and not re.match(r"https?://", self.url):
            raise BadInput(f"MCP server {self.name}: url must be http:// or https://")
        if self.token is not None:
            if self.url is None:
                raise BadInput(f"MCP server {self.name}: token= goes with url=")
            _secret_source(self.token, f"MCP server {self.name}: token")
        if self.tools is not None:
            object.__setattr__(self, "tools", frozenset(self.tools))
        if not self.timeout > 0 or not self.connect_timeout > 0:
            raise BadInput(f"MCP server {self.name}: timeouts must be positive")
        if not 1024 <= self.max_message <= 1 << 30:
            raise BadInput(f"MCP server {self.name}: max_message must be 1 KiB to 1 GiB")


def _secret_source(spec: str, what: str) -> tuple[str | None, str | None]:
    env = re.fullmatch(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", spec)
    if env is not None:
        return env.group(1), None
    if spec.startswith("@") and len(spec) > 1:
        return None, spec[1:]
    raise BadInput(f"{what} must name its source, ${{ENV_VAR}} or @FILE, not hold the value")


def _read_secret(spec: str, what: str) -> str:
    env, path = _secret_source(spec, what)
    if env is not None:
        value = os.environ.get(env)
        if value is None:
            raise McpUnavailable(f"{what}: the environment variable {env} is not set")
        return value
    assert path is not None
    try:
        data = Path(path).read_bytes()[: 64 << 10]
    except OSError as exc:
        raise McpUnavailable(f"{what}: cannot read {path}: {exc.strerror}") from None
    return data.decode("utf-8", "replace").strip()


_CHILD_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER", "LOGNAME", "SYSTEMROOT")


def _child_env(server: McpServer) -> dict[str, str]:
    env = {k: os.environ[k] for k in _CHILD_ENV if k in os.environ}
    for key, value in server.env.items():
        source = re.fullmatch(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", value)
        if source is None:
            env[key] = value
        elif source.group(1) in os.environ:
            env[key] = os.environ[source.group(1)]
    return env


@dataclass(frozen=True)
class McpToolInfo:
    """One tool a server listed and the client offers: its name, description and schema."""

    name: str
    description: str
    input_schema: Mapping[str, Any]
    wrapped: bool = False
    """The output schema is ``{"result": ...}`` alone: how SDK servers wrap a value that is not
    an object. The client unwraps it, so a tool returning 3 returns 3."""


class _Loop:
    """The event loop all MCP clients of the process run on, in one daemon thread."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def get(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._loop is None or cls._loop.is_closed():
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="mighty-mcp-client", daemon=True
                )
                thread.start()
                cls._loop = loop
            return cls._loop


class _Connection:
    """One live session: the SDK session, the listed tools, and why it ended (once it has)."""

    def __init__(self, session: ClientSession, tools: dict[str, McpToolInfo]) -> None:
        self.session = session
        self.tools = tools
        self.ended = asyncio.Event()
        self.reason = ""


class McpClient:
    """A connection to one :class:`McpServer`, kept up by a supervisor task (see the module).

    Thread-safe. ``start()`` returns at once; ``wait_ready(timeout)`` waits for the first
    connection; ``tools()`` the offered tools (waiting for the connection); ``call`` blocks,
    ``acall`` awaits (from any event loop).
    """

    def __init__(self, server: McpServer) -> None:
        self.server = server
        self._loop = _Loop.get()
        self._connection: _Connection | None = None
        self._ready = threading.Event()
        self._changed = threading.Condition()
        self._stop: asyncio.Event | None = None
        self._task: concurrent.futures.Future[None] | None = None
        self._down = "not started"
        self._closed = False
        self._failures = 0
        self.starts = 0
        """Connections made so far (1 + restarts)."""

    # -- life -------------------------------------------------------------------------------

    def start(self) -> McpClient:
        """Start the server and keep it up (idempotent)."""
        with self._changed:
            if self._task is None and not self._closed:
                self._down = "starting"
                self._task = asyncio.run_coroutine_threadsafe(self._supervise(), self._loop)
        return self

    def wait_ready(
        self, timeout: float | None = None, *, fail_fast: bool = False
    ) -> dict[str, McpToolInfo]:
        """The offered tools once connected; McpUnavailable if not connected in ``timeout``
        (default: the server's ``connect_timeout``). ``fail_fast``: wait only for the first
        start; after a failure, raise at once while the server is down."""
        self.start()
        most = self.server.connect_timeout if timeout is None else timeout
        deadline = time.monotonic() + most
        with self._changed:
            while self._connection is None:
                left = deadline - time.monotonic()
                # Only the first start is waited for: after a failure the server is down
                # until the supervisor's restart succeeds, and calls fail at once meanwhile.
                if left <= 0 or self._closed or (fail_fast and self._failures):
                    raise McpUnavailable(
                        f"MCP server {self.server.name} is not connected: {self._down}"
                    )
                self._changed.wait(left)
            return dict(self._connection.tools)

    def tools(self) -> dict[str, McpToolInfo]:
        """The tools this client offers (connecting first if needed)."""
        return self.wait_ready()

    def close(self) -> None:
        """Stop the server (stdin closed, then SIGTERM, then SIGKILL) and fail calls in flight."""
        with self._changed:
            if self._closed:
                return
            self._closed = True
            task = self._task
            self._changed.notify_all()
        if task is None:
            return
        stop = self._stop
        if stop is not None:
            self._loop.call_soon_threadsafe(stop.set)
        with contextlib.suppress(
            concurrent.futures.TimeoutError, concurrent.futures.CancelledError
        ):
            task.result(timeout=3 * _STOP_GRACE + 1)

    def __enter__(self) -> McpClient:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def connected(self) -> bool:
        return self._connection is not None

    # -- calls ------------------------------------------------------------------------------

    def call(self, tool: str, arguments: Mapping[str, Any], timeout: float | None = None) -> Any:
        """Call ``tool``; its result as data (see :func:`result_value`). Blocks."""
        future = asyncio.run_coroutine_threadsafe(
            self._call(tool, dict(arguments), timeout), self._loop
        )
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    async def acall(
        self, tool: str, arguments: Mapping[str, Any], timeout: float | None = None
    ) -> Any:
        """:meth:`call` from an event loop (any loop: the call runs on the client's)."""
        if asyncio.get_running_loop() is self._loop:
            # Already on the client's loop (an agent's MCP tool runs there): no hop through
            # its self-pipe and back (~60 us of CPU a call).
            return await self._call(tool, dict(arguments), timeout)
        future = asyncio.run_coroutine_threadsafe(
            self._call(tool, dict(arguments), timeout), self._loop
        )
        return await asyncio.wrap_future(future)

    async def _call(self, tool: str, arguments: dict[str, Any], timeout: float | None) -> Any:
        connection = self._connection
        if connection is None:
            raise McpUnavailable(f"MCP server {self.server.name} is not connected: {self._down}")
        if tool not in connection.tools:
            raise McpUnavailable(f"MCP server {self.server.name} offers no tool {tool!r}")
        most = self.server.timeout if timeout is None else min(timeout, self.server.timeout)
        request = asyncio.ensure_future(connection.session.call_tool(tool, arguments))
        ended = asyncio.ensure_future(connection.ended.wait())
        try:
            done, _ = await asyncio.wait(
                {request, ended}, timeout=most, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            ended.cancel()
            if not request.done():
                request.cancel()
        if request in done:
            try:
                result = request.result()
            except (asyncio.CancelledError, McpUnavailable, McpToolFailed):
                raise
            except Exception as exc:  # noqa: BLE001 - the SDK's MCPError and transport errors
                # A connection that closed under the call fails it as unavailable, with the
                # transport's reason (the session's own text is only "Connection closed").
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(connection.ended.wait(), 1.0)
                if connection.ended.is_set() or connection.reason:
                    raise McpUnavailable(
                        f"MCP server {self.server.name} went away during {tool}(): "
                        f"{connection.reason or exc}"
                    ) from None
                raise McpToolFailed(f"{self.server.name}.{tool}: {exc}"[:4096]) from None
            info = connection.tools[tool]
            value = result_value(self.server.name, tool, result)
            if info.wrapped and isinstance(value, dict) and set(value) == {"result"}:
                return value["result"]
            return value
        if ended in done:
            raise McpUnavailable(
                f"MCP server {self.server.name} went away during {tool}(): {connection.reason}"
            )
        raise McpUnavailable(f"MCP server {self.server.name}: {tool}() took more than {most:g} s")

    # -- the supervisor -----------------------------------------------------------------------

    async def _supervise(self) -> None:
        self._stop = asyncio.Event()
        backoff = _BACKOFF_FIRST
        while not self._stop.is_set():
            began = time.monotonic()
            reason = await self._serve_once()
            with self._changed:
                self._connection = None
                self._down = reason
                self._failures += 1
                self._changed.notify_all()
            if self._stop.is_set():
                break
            _log.warning(
                "MCP server %s: %s; restarting in %.1f s", self.server.name, reason, backoff
            )
            if time.monotonic() - began > 30.0:
                backoff = _BACKOFF_FIRST  # it ran a good while: a new failure, not a loop
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), backoff)
            backoff = min(backoff * 2, _BACKOFF_MOST)
        with self._changed:
            self._down = "closed"
            self._changed.notify_all()

    async def _serve_once(self) -> str:
        """Connect, serve until the connection ends or the client stops; why it ended."""
        from mcp.client.session import ClientSession

        assert self._stop is not None
        ended = asyncio.Event()
        why: list[str] = []
        try:
            async with contextlib.AsyncExitStack() as stack:
                # asyncio.timeout, not wait_for: wait_for enters the transport in a task of its
                # own, and the SDK's HTTP client's task group must be left by the task that
                # entered it ("Attempted to exit cancel scope in a different task").
                async with asyncio.timeout(self.server.connect_timeout):
                    streams = await stack.enter_async_context(self._transport(ended, why))
                session = await stack.enter_async_context(ClientSession(*streams))
                tools = await asyncio.wait_for(
                    self._handshake(session), self.server.connect_timeout
                )
                connection = _Connection(session, tools)
                self.starts += 1
                with self._changed:
                    self._connection = connection
                    self._changed.notify_all()
                stop = asyncio.ensure_future(self._stop.wait())
                gone = asyncio.ensure_future(ended.wait())
                try:
                    await asyncio.wait({stop, gone}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    stop.cancel()
                    gone.cancel()
                connection.reason = why[0] if why else "the connection ended"
                with self._changed:
                    self._connection = None
                    self._down = connection.reason
                connection.ended.set()
                return "closed" if self._stop.is_set() else connection.reason
        except TimeoutError:
            return why[0] if why else f"no answer within {self.server.connect_timeout:g} s"
        except McpUnavailable as exc:
            return str(exc)
        except Exception as exc:  # noqa: BLE001 - any failure to connect is a reason to retry
            # The SDK's task groups wrap the cause (a 401, a refused connection): name it.
            cause: BaseException = exc
            while isinstance(cause, BaseExceptionGroup) and cause.exceptions:
                cause = cause.exceptions[0]
            return why[0] if why else f"{type(cause).__name__}: {cause}"[:500]

    async def _handshake(self, session: ClientSession) -> dict[str, McpToolInfo]:
        await session.initialize()
        offered: dict[str, McpToolInfo] = {}
        cursor: str | None = None
        for _page in range(64):
            import mcp_types

            params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
            listed = await session.list_tools(params=params)
            for tool in listed.tools:
                info = _check_tool(self.server.name, tool)
                if self.server.tools is None or info.name in self.server.tools:
                    offered[info.name] = info
                if len(offered) > MAX_TOOLS:
                    raise McpUnavailable(
                        f"MCP server {self.server.name} lists over {MAX_TOOLS} tools"
                    )
            cursor = listed.next_cursor
            if not cursor:
                break
        missing = sorted((self.server.tools or frozenset()) - set(offered))
        if missing:
            raise McpUnavailable(
                f"MCP server {self.server.name} does not list {', '.join(missing)}"
            )
        return offered

    def _transport(
        self, ended: asyncio.Event, why: list[str]
    ) -> contextlib.AbstractAsyncContextManager[Any]:
        if self.server.url is not None:
            return _http_transport(self.server, ended, why)
        return _stdio_transport(self.server, ended, why)


def _check_tool(server: str, tool: Any) -> McpToolInfo:
    import json

    name = tool.name
    if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
        raise McpUnavailable(f"MCP server {server} lists a tool named {str(name)[:80]!r}")
    schema = tool.input_schema if isinstance(tool.input_schema, dict) else {}
    if len(json.dumps(schema)) > MAX_SCHEMA:
        raise McpUnavailable(
            f"MCP server {server}: tool {name}'s schema is over {MAX_SCHEMA} bytes"
        )
    if schema.get("type", "object") != "object":
        raise McpUnavailable(f"MCP server {server}: tool {name}'s input schema is not an object")
    try:
        from jsonschema.validators import validator_for  # type: ignore[import-untyped]

        validator_for(schema).check_schema(schema)
    except Exception as exc:  # noqa: BLE001 - jsonschema's SchemaError and friends
        raise McpUnavailable(
            f"MCP server {server}: tool {name}'s input schema is invalid: {exc}"
        ) from None
    output = tool.output_schema if isinstance(tool.output_schema, dict) else {}
    props = output.get("properties")
    wrapped = (
        output.get("required") == ["result"]
        and isinstance(props, dict)
        and set(props) == {"result"}
    )
    return McpToolInfo(name, (tool.description or "")[:4096], schema, wrapped)


def result_value(server: str, tool: str, result: Any) -> Any:
    """A ``CallToolResult`` as plain data: its structured content when there is some; else the
    text when every block is text (one string, blocks joined by newlines); else the blocks as
    JSON objects. An error result raises :class:`McpToolFailed` with its text."""
    blocks = list(result.content or ())
    texts = [b.text for b in blocks if getattr(b, "type", None) == "text"]
    if result.is_error:
        message = "\n".join(texts) or "the tool failed"
        raise McpToolFailed(f"{server}.{tool}: {message}")
    if result.structured_content is not None:
        return result.structured_content
    if len(texts) == len(blocks):
        return "\n".join(texts)
    return [b.model_dump(mode="json", by_alias=True, exclude_none=True) for b in blocks]


# -- transports -------------------------------------------------------------------------------


class LineSplitter:
    """Newline-delimited messages out of chunks, none longer than ``limit`` bytes: once a line
    passes it (ended or not), ``over`` is set and nothing more is returned. Holds at most
    ``limit + 1`` bytes of an unfinished line."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.over = False
        self._held = bytearray()

    def feed(self, chunk: bytes) -> list[bytes]:
        if self.over:
            return []
        lines: list[bytes] = []
        start = 0
        while True:
            newline = chunk.find(b"\n", start)
            end = len(chunk) if newline < 0 else newline
            if len(self._held) + end - start > self.limit:
                self.over = True
                self._held = bytearray()
                return lines
            self._held += chunk[start:end]
            if newline < 0:
                return lines
            lines.append(bytes(self._held))
            self._held = bytearray()
            start = newline + 1


@contextlib.asynccontextmanager
async def _stdio_transport(
    server: McpServer, ended: asyncio.Event, why: list[str]
) -> AsyncIterator[Any]:
    import anyio
    import mcp_types
    from mcp.shared.message import SessionMessage

    try:
        process = await asyncio.create_subprocess_exec(
            *server.command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,  # the host's own stderr: a server's complaints are for its operator
            env=_child_env(server),
            cwd=server.cwd,
            start_new_session=True,
            limit=64 << 10,
        )
    except OSError as exc:
        raise McpUnavailable(
            f"MCP server {server.name}: cannot start {server.command[0]!r}: {exc.strerror}"
        ) from None
    assert process.stdin is not None
    assert process.stdout is not None
    stdout, stdin = process.stdout, process.stdin
    to_session, read_stream = anyio.create_memory_object_stream[Any](16)
    write_stream, from_session = anyio.create_memory_object_stream[Any](16)
    limit = server.max_message

    def end(reason: str) -> None:
        if not why:
            why.append(reason)
        ended.set()

    async def read() -> None:
        lines = LineSplitter(limit)
        try:
            async with to_session:
                while True:
                    chunk = await stdout.read(64 << 10)
                    if not chunk:
                        end(f"the server's process ended (status {await _status(process)})")
                        return
                    for line in lines.feed(chunk):
                        if not line.strip():
                            continue
                        try:
                            message = mcp_types.jsonrpc_message_adapter.validate_json(
                                line, by_name=False
                            )
                        except ValueError:
                            end(f"the server sent a line that is not JSON-RPC: {line[:80]!r}")
                            return
                        await to_session.send(SessionMessage(message))
                    if lines.over:
                        end(f"the server sent a message over {limit} bytes")
                        return
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError) as exc:
            end(f"reading from the server failed: {type(exc).__name__}")

    tasks = [
        asyncio.ensure_future(read()),
        asyncio.ensure_future(_write_lines(stdin, from_session, end)),
    ]
    try:
        yield read_stream, write_stream
    finally:
        for task in tasks:
            task.cancel()
        await _stop_process(process)
        ended.set()
        for stream in (read_stream, write_stream, to_session, from_session):
            await stream.aclose()


async def _write_lines(
    stdin: asyncio.StreamWriter, from_session: Any, end: Callable[[str], None]
) -> None:
    import anyio

    try:
        async with from_session:
            async for item in from_session:
                text = item.message.model_dump_json(by_alias=True, exclude_unset=True)
                stdin.write(text.encode("utf-8") + b"\n")
                await stdin.drain()
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError) as exc:
        end(f"writing to the server failed: {type(exc).__name__}")


async def _status(process: asyncio.subprocess.Process) -> str:
    try:
        code = await asyncio.wait_for(process.wait(), 1.0)
    except TimeoutError:
        return "unknown"
    return str(code)


async def _stop_process(process: asyncio.subprocess.Process) -> None:
    """Close stdin, give it a grace period, then SIGTERM and SIGKILL its process group."""
    if process.stdin is not None:
        with contextlib.suppress(OSError):
            process.stdin.close()
    try:
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            if sig is not None and process.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, sig)
            try:
                await asyncio.wait_for(process.wait(), _STOP_GRACE)
                return
            except TimeoutError:
                continue
    finally:
        # The pipes' transport closes itself only once stdout reached EOF; a reader that
        # stopped early (a message over the bound) leaves it open (a ResourceWarning).
        transport = getattr(process, "_transport", None)
        if transport is not None:
            transport.close()


@contextlib.asynccontextmanager
async def _http_transport(
    server: McpServer, ended: asyncio.Event, why: list[str]
) -> AsyncIterator[Any]:
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    headers = {}
    if server.token is not None:
        token = _read_secret(server.token, f"MCP server {server.name}: token")
        headers["Authorization"] = f"Bearer {token}"
    transport = _capped_transport(httpx2, server.max_message)

    def over() -> None:
        # The SDK turns a broken response into an error result and keeps the session: a
        # response over the bound drops the connection instead, as on stdio.
        if not why:
            why.append(f"the server sent a response over {server.max_message} bytes")
        ended.set()

    transport.on_over = over
    client = httpx2.AsyncClient(
        headers=headers,
        transport=transport,
        timeout=httpx2.Timeout(server.connect_timeout, read=server.timeout + 5.0),
    )
    try:
        async with (
            client,
            streamable_http_client(
                server.url or "", http_client=client, max_sse_event_size=server.max_message
            ) as streams,
        ):
            yield streams
    finally:
        if transport.over and not why:
            why.append(f"the server sent a response over {server.max_message} bytes")
        ended.set()


def _capped_transport(httpx2: Any, limit: int) -> Any:
    """An httpx transport whose response bodies stop (with an error) past ``limit`` bytes."""

    class Stream(_CappedStream, httpx2.AsyncByteStream):  # type: ignore[misc]
        """httpx asserts a response's stream is one of its byte streams."""

    class Capped(httpx2.AsyncHTTPTransport):  # type: ignore[misc]
        over = False

        def on_over(self) -> None:
            """Called once a body passes the bound (the owner sets its own)."""

        async def handle_async_request(self, request: Any) -> Any:
            response = await super().handle_async_request(request)
            response.stream = Stream(response.stream, self, limit)
            return response

    return Capped()


class _CappedStream:
    def __init__(self, inner: Any, owner: Any, limit: int) -> None:
        self.inner = inner
        self.owner = owner
        self.limit = limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self.inner:
            seen += len(chunk)
            if seen > self.limit:
                self.owner.over = True
                self.owner.on_over()
                raise McpUnavailable(f"a response body is over {self.limit} bytes")
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()
