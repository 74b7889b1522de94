"""Tools: host callables the sandboxed code calls as ordinary Python functions.

A tool crosses the boundary as data only. The guest sends JSON ``{"args": [...], "kwargs":
{...}}`` through ``mighty:sandbox/tools#call``; here the arguments are bound to the callable's
signature and validated against its type hints with pydantic (one ``TypeAdapter`` per
parameter, built once at registration), the callable runs in a worker thread (sync) or on an
event loop (async) under its own timeout, and its result goes back as JSON. Every failure of
the tool is an ``Err`` the guest raises as ``ToolError``; only what the *code* did wrong in a way
that must end the run (an unknown tool name, too many calls) stops the guest.

Everything that comes back from a tool is bounded before it is built (``_data.py``): the result
is encoded by :func:`encode_json` (size-capped, finite floats, valid Unicode, no generators)
inside the worker and under the tool's timeout; error texts are cut by :func:`cut_text`; a tool
name too long to be a tool is refused by its length alone. Any exception of a tool,
``BaseException`` included, is a ``ToolError`` for the code (see :func:`_failure` for the one
exception: Ctrl-C on the main thread).

Rejected:
- ``pydantic.validate_call``. It wraps the callable, so a validation error and an error raised
  inside the tool look alike, and its messages name the wrapper.
- a thread per sync call (hung tools pile up threads without bound) and
  ``concurrent.futures.ThreadPoolExecutor`` (its threads are joined at interpreter exit, so one
  hung tool would keep the host process from exiting): a small pool of daemon threads of our own,
  :class:`_Workers`, that counts the calls it abandoned.
- ``pydantic_core.to_jsonable_python`` on the whole result: it drains an endless generator into
  memory, outside any timeout.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import contextvars
import inspect
import json
import keyword
import logging
import math
import os
import select
import threading
import time
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pydantic

from mighty._errors import BadInput, WrongType
from mighty.abi import Err, Ok
from mighty.budget import RunContext, current_context, using_context
from mighty.gate import Binding, GuestContext, GuestViolation, ResourceKind, Scope, Slot
from mighty.sandbox._data import MAX_DEPTH, NotData, _safe_text, cut_text, encode_json

__all__ = [
    "MAX_CONCURRENT_CALLS",
    "MAX_CONCURRENT_CALLS_LIMIT",
    "MAX_DATA",
    "MAX_HELD_DATA",
    "MAX_MESSAGE",
    "MAX_NAME",
    "MAX_NESTED_RUNS",
    "MAX_RUN_THREADS",
    "MAX_TOOL_THREADS",
    "TOOL_HOST",
    "Tool",
    "ToolsProvider",
    "describe_tools",
    "nesting_depth",
    "tools_from",
]

INTERFACE = "mighty:sandbox/tools"
MAX_DATA = 1 << 20
"""Most bytes of JSON one tool call's arguments or result may take."""
MAX_NAME = 256
"""Longest tool name the host looks up; a longer one is refused by its length alone."""
MAX_MESSAGE = 16 << 10
"""Most UTF-8 bytes of a tool error's message the code receives (plus a short note when cut)."""
MAX_KIND = 128
"""Most characters of a tool error's kind (an exception type name)."""
MAX_VALIDATION_ERRORS = 5
"""Validation errors listed in an ``invalid_arguments`` message; more are only counted."""
MAX_TOOL_THREADS = 32
"""Worker threads for sync tools, for the whole process. A call that times out leaves its
thread behind until the tool returns; when every thread is such a hung call, a new call fails at
once with ``ToolError(kind="busy")``."""
MAX_RUN_THREADS = 16
"""Most worker threads one run's sync calls may hold at once (timed-out calls still running
included), so that no run can take the whole pool: further calls of that run wait for one of
its threads, or fail at once with ``busy`` when all of them are stuck."""
MAX_CONCURRENT_CALLS = 16
"""Default most calls of one run in flight at once (``Limits.tool_concurrency``)."""
MAX_CONCURRENT_CALLS_LIMIT = 1024
"""The highest ``Limits.tool_concurrency`` accepted."""
MAX_HELD_DATA = 32 << 20
"""Most bytes one run's started calls may hold on the host: arguments of calls waiting for a
slot, and results the code has not yet received. Past it, a new call fails at once (``busy``)."""
_MAX_WAIT = 3600.0
MAX_NESTED_RUNS = 1
"""How deep sandbox runs may nest through tools: a tool may start a run, whose tools may not."""
_log = logging.getLogger("mighty.sandbox")
_NESTING: contextvars.ContextVar[int] = contextvars.ContextVar("mighty_sandbox_nesting", default=0)
_Arguments = tuple[tuple[Any, ...], dict[str, Any]]
"""A call's validated ``(args, kwargs)``."""
_Site = tuple[int, RunContext]
"""Where a tool call runs: how deep in tool calls (``nesting_depth``) and its context."""


def nesting_depth() -> int:
    """How many tool calls of sandbox runs enclose the current code (0 outside any tool)."""
    return _NESTING.get()


class InvalidArgument(ValueError):
    """An argument does not fit the tool's type hints."""


@dataclass(frozen=True)
class Tool:
    """A host callable exposed to sandboxed code under ``name`` (default: its ``__name__``).

    ``timeout`` overrides the sandbox's per-call tool timeout for this tool.
    """

    fn: Callable[..., Any]
    name: str = ""
    timeout: float | None = None
    signature: inspect.Signature = field(init=False, repr=False, compare=False)
    adapters: Mapping[str, pydantic.TypeAdapter[Any] | None] = field(
        init=False, repr=False, compare=False
    )
    is_async: bool = field(init=False, repr=False, compare=False)
    context_param: str | None = field(init=False, repr=False, compare=False)
    """The parameter annotated :class:`~mighty.budget.RunContext`, filled by the host with the
    call's context (never by the code): the first parameter, or a keyword-only one."""
    context_first: bool = field(init=False, repr=False, compare=False)
    """The context goes first, by position (else by keyword)."""
    positional: tuple[str, ...] | None = field(init=False, repr=False, compare=False)
    """The parameter names when every one can be passed by position (no ``*args``,
    keyword-only or ``**kwargs``): a call passing them all by position binds without
    ``Signature.bind``."""
    _in_order: tuple[tuple[str, pydantic.TypeAdapter[Any] | None], ...] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise WrongType(f"a tool must be callable, got {type(self.fn).__name__}")
        name = self.name or getattr(self.fn, "__name__", "")
        if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_"):
            raise BadInput(
                f"tool name {name!r} is not usable from Python code: it must be an identifier,"
                " not a keyword, and not start with '_'"
            )
        if self.timeout is not None and not self.timeout > 0:
            raise BadInput(f"tool {name}: timeout must be positive, got {self.timeout}")
        signature = inspect.signature(self.fn)
        try:
            hints = typing.get_type_hints(self.fn, include_extras=True)
        except Exception:  # noqa: BLE001 - unresolvable hints: validate nothing rather than fail
            hints = {}
        context_param = _context_param(name, signature, hints)
        context_first = (
            context_param is not None
            and signature.parameters[context_param].kind is not inspect.Parameter.KEYWORD_ONLY
        )
        if context_param is not None:
            # The code sees (and may pass) only the other parameters.
            signature = signature.replace(
                parameters=[p for p in signature.parameters.values() if p.name != context_param]
            )
        adapters: dict[str, pydantic.TypeAdapter[Any] | None] = {}
        for pname in signature.parameters:
            hint = hints.get(pname)
            adapters[pname] = None if hint is None else pydantic.TypeAdapter(hint)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "signature", signature)
        object.__setattr__(self, "adapters", adapters)
        object.__setattr__(self, "is_async", inspect.iscoroutinefunction(self.fn))
        object.__setattr__(self, "context_param", context_param)
        object.__setattr__(self, "context_first", context_first)
        by_position = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        object.__setattr__(
            self,
            "positional",
            tuple(signature.parameters)
            if all(p.kind in by_position for p in signature.parameters.values())
            else None,
        )
        object.__setattr__(self, "_in_order", tuple(adapters.items()))

    def spec(self) -> dict[str, Any]:
        """What the guest needs to build a stub with the same signature."""
        params: list[dict[str, str]] = []
        for param in self.signature.parameters.values():
            item = {"name": param.name, "kind": param.kind.name}
            if param.default is not inspect.Parameter.empty:
                item["default"] = repr(param.default)
            params.append(item)
        return {"name": self.name, "params": params, "doc": inspect.getdoc(self.fn) or ""}

    def bind(self, args: list[Any], kwargs: dict[str, Any]) -> inspect.BoundArguments:
        """Bind and validate; raises TypeError or InvalidArgument."""
        names = self.positional
        if names is not None and not kwargs and len(args) == len(names):
            # What Signature.bind gives for every parameter passed by position, made directly.
            bound = inspect.BoundArguments(self.signature, dict(zip(names, args, strict=True)))
        else:
            bound = self.signature.bind(*args, **kwargs)
        for pname, value in list(bound.arguments.items()):
            adapter = self.adapters.get(pname)
            if adapter is None:
                continue
            kind = self.signature.parameters[pname].kind
            try:
                if kind is inspect.Parameter.VAR_POSITIONAL:
                    bound.arguments[pname] = tuple(adapter.validate_python(v) for v in value)
                elif kind is inspect.Parameter.VAR_KEYWORD:
                    bound.arguments[pname] = {
                        k: adapter.validate_python(v) for k, v in value.items()
                    }
                else:
                    bound.arguments[pname] = adapter.validate_python(value)
            except pydantic.ValidationError as exc:
                raise InvalidArgument(
                    f"argument {pname!r}: {_validation_message(exc, adapter)}"
                ) from None
        return bound

    def arguments(self, args: list[Any], kwargs: dict[str, Any]) -> _Arguments:
        """What :meth:`bind` gives, as the ``(args, kwargs)`` to call the tool with; raises
        TypeError or InvalidArgument. A call passing every parameter by position is validated
        in place (no ``BoundArguments``)."""
        if self.positional is not None and not kwargs and len(args) == len(self.positional):
            values: list[Any] = []
            for (pname, adapter), value in zip(self._in_order, args, strict=True):
                if adapter is None:
                    values.append(value)
                    continue
                try:
                    values.append(adapter.validate_python(value))
                except pydantic.ValidationError as exc:
                    raise InvalidArgument(
                        f"argument {pname!r}: {_validation_message(exc, adapter)}"
                    ) from None
            return tuple(values), {}
        bound = self.bind(args, kwargs)
        return bound.args, bound.kwargs

    def stub(self) -> str:
        """A typed Python stub of this tool (signature and docstring) for a model's prompt."""
        doc = inspect.getdoc(self.fn) or ""
        lines = [f"def {self.name}{_format_signature(self.signature)}:"]
        if doc:
            body = doc.replace('"""', '\\"\\"\\"').splitlines()
            lines.append(f'    """{body[0]}')
            lines.extend(f"    {line}" if line else "" for line in body[1:])
            if len(body) > 1:
                lines.append('    """')
            else:
                lines[-1] += '"""'
        lines.append("    ...")
        return "\n".join(lines)


def _context_param(name: str, signature: inspect.Signature, hints: Mapping[str, Any]) -> str | None:
    """The parameter a tool takes its :class:`RunContext` by, if any (checked: at most one,
    the first parameter or keyword-only)."""
    found = [p for p in signature.parameters.values() if hints.get(p.name) is RunContext]
    if not found:
        return None
    if len(found) > 1:
        raise BadInput(f"tool {name}: only one parameter may take the RunContext")
    param = found[0]
    first = next(iter(signature.parameters.values()))
    if param.kind is inspect.Parameter.KEYWORD_ONLY or (
        param is first and param.kind is not inspect.Parameter.VAR_POSITIONAL
    ):
        return param.name
    raise BadInput(
        f"tool {name}: the RunContext parameter {param.name!r} must be the first parameter "
        "or keyword-only"
    )


def _with_context(tool: Tool, bound: _Arguments, ctx: RunContext) -> _Arguments:
    """The call's ``(args, kwargs)`` with the context put where the tool takes it."""
    name = tool.context_param
    if name is None:
        return bound
    args, kwargs = bound
    if tool.context_first:
        return (ctx, *args), kwargs
    return args, {**kwargs, name: ctx}


def _format_signature(signature: inspect.Signature) -> str:
    text = str(signature)
    # Annotations from `from __future__ import annotations` are strings: show them bare.
    for param in signature.parameters.values():
        if isinstance(param.annotation, str):
            text = text.replace(
                f"{param.name}: {param.annotation!r}", f"{param.name}: {param.annotation}"
            )
    if isinstance(signature.return_annotation, str):
        text = text.replace(
            f"-> {signature.return_annotation!r}", f"-> {signature.return_annotation}"
        )
    return text


def tools_from(
    tools: Sequence[Callable[..., Any] | Tool] | Mapping[str, Callable[..., Any] | Tool] | None,
) -> dict[str, Tool]:
    """Normalise the ``tools=`` argument of a Sandbox: a list of callables/Tools or a dict."""
    found: dict[str, Tool] = {}
    if tools is None:
        return found
    items: Iterable[tuple[str, Callable[..., Any] | Tool]]
    items = tools.items() if isinstance(tools, Mapping) else (("", t) for t in tools)
    for name, item in items:
        if isinstance(item, Tool):
            tool = Tool(item.fn, name or item.name, item.timeout)
        else:
            tool = Tool(item, name)
        if tool.name in found:
            raise BadInput(f"two tools are named {tool.name!r}")
        found[tool.name] = tool
    return found


def describe_tools(tools: Mapping[str, Tool]) -> str:
    """A Python stub of every tool, to put in a model's prompt."""
    head = (
        "# Functions available to your code. Call them directly; arguments and results are\n"
        "# JSON-compatible data. A failing tool raises ToolError (attributes: tool, kind,\n"
        "# message), which your code may catch.\n"
    )
    if not tools:
        return head + "# (no tools are registered)\n"
    return head + "\n\n".join(tool.stub() for tool in tools.values()) + "\n"


# -- the provider ---------------------------------------------------------------------------


class StopRun(GuestViolation):
    """Raised from a host function to end the run with ``kind`` (the guest cannot catch it)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class ToolHost:
    """Per-instance tool state: the registry, the limits, the current run's counters and calls.

    One ``ToolHost`` is put in the :data:`TOOL_HOST` slot of every sandbox instance. Sync
    calls (``call``) run one at a time; started calls (``start``/``wait``/``cancel``, the guest's
    async tools) run concurrently, at most ``concurrency`` at once (the rest queue here, in the
    order started), each under its own timeout. :meth:`end` cancels what a run left in flight.
    """

    def __init__(
        self,
        tools: Mapping[str, Tool],
        *,
        max_calls: int,
        timeout: float,
        background_loop: Callable[[], asyncio.AbstractEventLoop],
        concurrency: int = MAX_CONCURRENT_CALLS,
    ) -> None:
        self.tools = tools
        self.max_calls = max_calls
        self.timeout = timeout
        self.concurrency = max(1, concurrency)
        self._background_loop = background_loop
        self.spec_json = json.dumps([t.spec() for t in tools.values()])
        self.calls = 0
        self.tool_time = 0.0
        self.timeouts = 0
        self.stopped: StopRun | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.context: RunContext | None = None
        self._cond = threading.Condition(threading.Lock())
        self._handles = 0  # unique for the life of the instance (a session's runs too)
        self._flights: dict[int, _Flight] = {}
        self._queued: collections.deque[_Flight] = collections.deque()
        self._finished: collections.deque[tuple[_Flight, Ok | Err]] = collections.deque()
        self._ready: collections.deque[tuple[int, Ok | Err]] = collections.deque()
        self._running = 0
        self._held = 0  # bytes of queued calls' arguments and undelivered results
        self._threads = 0  # this run's sync calls holding a worker thread (stuck ones too)
        self._bell: _BellLike | None = None  # what sync calls wait on, made at the first

    def close(self) -> None:
        """The instance is gone: cancel what is in flight and free the sync calls' pipe."""
        self.end()
        bell, self._bell = self._bell, None
        if bell is not None:
            _WORKERS.close_bell(bell)

    def begin(
        self, loop: asyncio.AbstractEventLoop | None, context: RunContext | None = None
    ) -> None:
        """Reset the counters for a new run (its cancel scope is the call's: ``ctx.scope``).

        ``context`` is the run's (default: the current one): each call gets a child of it."""
        self.end()
        self.calls = 0
        self.tool_time = 0.0
        self.timeouts = 0
        self.stopped = None
        self.loop = loop
        self.context = context if context is not None else current_context()

    def end(self) -> None:
        """The run is over: cancel its calls still queued or in flight, drop undelivered ones."""
        with self._cond:
            flights = list(self._flights.values())
            self._flights.clear()
            self._queued.clear()
            self._finished.clear()
            self._ready.clear()
            self._running = 0
            self._held = 0
        for flight in flights:
            flight.abandon("was cancelled (its run ended)")

    def rewound(self) -> bool:
        """Ready this host for its instance's next life (the pool rewinds an instance to its
        warmed state instead of making a new one): False when a call of an earlier run still
        runs on a thread (a stuck sync call would hold one of the next run's threads); else the
        call handles count from the start again, as in a fresh instance (a guest could
        otherwise tell how many calls earlier runs made)."""
        with self._cond:
            if self._threads or self._flights or self._queued:
                return False
            self._handles = 0
        return True

    def stop(self, kind: str, message: str) -> StopRun:
        """Remember why the run must end, and return the exception that ends it."""
        stop = StopRun(kind, message)
        if self.stopped is None:
            self.stopped = stop
        return stop

    def _prepare(self, name: str, payload: bytes) -> tuple[Tool, _Arguments] | Err:
        """Look the tool up, count the call, bind its arguments (raises StopRun to end the run)."""
        if len(name) > MAX_NAME:
            # Refused by length: repr() of a 50-million-character name would be 200 MB.
            raise self.stop(
                "not_allowed",
                f"the code called a tool named by {len(name)} characters, which is not a tool "
                f"(names are at most {MAX_NAME})",
            )
        tool = self.tools.get(name)
        if tool is None:
            raise self.stop("not_allowed", f"the code called {name!r}, which is not a tool")
        self.calls += 1
        if self.calls > self.max_calls:
            raise self.stop("tool_limit", f"the code made more than {self.max_calls} tool calls")
        decoded = _decode_args(name, payload)
        if isinstance(decoded, Err):
            return decoded
        args, kwargs = decoded
        try:
            return tool, tool.arguments(args, kwargs)
        except (TypeError, InvalidArgument) as exc:
            return _err("invalid_arguments", _safe_text(exc, MAX_MESSAGE))

    def _timeout(self, tool: Tool) -> float:
        return tool.timeout if tool.timeout is not None else self.timeout

    # -- sync calls -------------------------------------------------------------------------

    def call(self, ctx: GuestContext, name: str, payload: bytes) -> Ok | Err:
        prepared = self._prepare(name, payload)
        if isinstance(prepared, Err):
            return prepared
        tool, bound = prepared
        timeout = self._timeout(tool)
        started = time.monotonic()
        scope = ctx.scope
        try:
            # The tool's time is the host's, not the guest's: not charged to its deadline.
            with scope.paused():
                outcome = self._invoke(tool, bound, timeout, scope)
        finally:
            self.tool_time += time.monotonic() - started
        return outcome

    def _invoke(
        self,
        tool: Tool,
        bound: _Arguments,
        timeout: float,
        scope: Scope,
    ) -> Ok | Err:
        site = (_NESTING.get() + 1, self._context(tool, timeout))
        if tool.is_async:
            loop = self.loop if self.loop is not None else self._background_loop()
            future = asyncio.run_coroutine_threadsafe(_run_async(tool, bound, site), loop)
            return self._wait_future(tool, future, timeout, scope, site[1])
        with self._cond:
            if self._threads >= MAX_RUN_THREADS:
                return self._busy(tool)
            self._threads += 1
        bell = self._bell
        if bell is None:
            bell = self._bell = _Bell()
        job = _WORKERS.submit(tool, bound, site, self._thread_done, bell=bell)
        if job is None:
            self._thread_done()
            return self._busy(tool)
        # A cancel or a Ctrl-C while the tool works is noticed now, not when it returns: the
        # scope raises the run's stop, the tool's context is cancelled (a tool that checks
        # ``ctx.cancelled`` stops; a run it started is cancelled), and the tool is left to
        # finish on its thread.
        try:
            done = scope.wait(job.wait, timeout)
        except BaseException as exc:
            self._abandoned(job, _why(exc))  # wakes the job's thread too if no wait did
            raise
        if done:
            return job.outcome
        self._abandoned(job, "timed out")
        return _err("timeout", f"{tool.name}() did not return within {timeout:g} s")

    def _busy(self, tool: Tool) -> Err:
        return _err(
            "busy",
            f"{tool.name}() was not started: this run's {MAX_RUN_THREADS} tool threads (or "
            f"all {MAX_TOOL_THREADS} of the process) are stuck in calls that timed out",
        )

    def _thread_done(self) -> None:
        with self._cond:
            self._threads -= 1
            self._cond.notify_all()

    def _context(self, tool: Tool, timeout: float) -> RunContext:
        """A new call's context: inside the run's, ending by the tool's timeout."""
        run = self.context
        if run is None:
            return RunContext.top("tool", timeout=timeout)
        return run.child("tool", id=f"{run.id}/{tool.name}#{self.calls}", timeout=timeout)

    def _abandoned(self, job: _Job, why: str) -> None:
        """The caller gave up on a sync call (``why``: "timed out", "cancelled", ...): its
        context is cancelled, and a call still running is counted and logged as stuck."""
        job.site[1].stop(f"{job.tool.name}() {why}")
        if _WORKERS.abandon(job):
            if why == "timed out":
                self.timeouts += 1
            _log.warning(
                "sandbox tool %s() %s and is still running on its thread "
                "(%d of %d tool threads are stuck)",
                job.tool.name,
                why,
                _WORKERS.stuck(),
                MAX_TOOL_THREADS,
            )

    def _wait_future(
        self,
        tool: Tool,
        future: concurrent.futures.Future[Ok | Err],
        timeout: float,
        scope: Scope,
        ctx: RunContext,
    ) -> Ok | Err:
        try:
            done = scope.wait(future, timeout)
        except BaseException as exc:
            ctx.stop(f"{tool.name}() {_why(exc)}")
            future.cancel()  # the run was stopped while the tool worked
            raise
        if not done:
            ctx.stop(f"{tool.name}() timed out")
            future.cancel()
            return _err("timeout", f"{tool.name}() did not return within {timeout:g} s")
        try:
            return future.result(0)
        except concurrent.futures.CancelledError:
            return _err("cancelled", f"{tool.name}() was cancelled")
        except BaseException as exc:  # noqa: BLE001 - Ctrl-C/exit let through on a main loop
            return _err("interrupted", f"{tool.name}() was interrupted: {type(exc).__name__}")

    # -- started calls (the guest's async tools) ---------------------------------------------

    def start(self, name: str, payload: bytes) -> int:
        """Start a call; its outcome waits in :meth:`wait`. Returns the call's handle."""
        prepared = self._prepare(name, payload)
        self._handles += 1
        handle = self._handles
        with self._cond:
            if isinstance(prepared, Err):
                self._put_ready(handle, prepared)
                return handle
            tool, bound = prepared
            if self._held + len(payload) > MAX_HELD_DATA:
                self._put_ready(
                    handle,
                    _err(
                        "busy",
                        f"{name}() was not started: the run's calls waiting to start and results "
                        f"waiting to be awaited hold more than {MAX_HELD_DATA} bytes",
                    ),
                )
                return handle
            flight = _Flight(
                self,
                handle,
                tool,
                bound,
                (_NESTING.get() + 1, self._context(tool, self._timeout(tool))),
            )
            flight.size = len(payload)
            self._held += flight.size
            self._flights[handle] = flight
            self._queued.append(flight)
            launch = self._pump()
        self._launch(launch)
        return handle

    def cancel(self, handle: int) -> None:
        """The guest gave up on ``handle``: stop its tool if it runs, forget it otherwise."""
        with self._cond:
            flight = self._flights.pop(handle, None)
            if flight is None:
                return
            if flight in self._queued:
                self._queued.remove(flight)
                self._held -= flight.size
            elif flight.started is not None:
                self._running -= 1
            launch = self._pump()
        flight.abandon("was cancelled by the code")
        self._launch(launch)

    def wait(self, ctx: GuestContext, timeout_ns: int | None) -> list[dict[str, Any]]:
        """Finished calls in delivery order; waits (up to ``timeout_ns``) until there is one."""
        scope = ctx.scope
        now = time.monotonic()
        until = None if timeout_ns is None else now + min(timeout_ns / 1e9, _MAX_WAIT)
        with self._cond:
            launch = self._pump()
        self._launch(launch)
        if self._ready or not self._flights:
            return self._deliver(until, scope)
        started = time.monotonic()
        try:
            # Waiting for tools is the host's time, not the guest's.
            with scope.paused():
                self._await_any(until, scope)
        finally:
            self.tool_time += time.monotonic() - started
        return self._deliver(None, scope)

    def _await_any(self, until: float | None, scope: Scope) -> None:
        """Sleep until a call finishes, one times out, ``until`` passes or the run is stopped."""

        def block(most: float) -> bool:
            now = time.monotonic()
            with self._cond:
                launch = self._pump()
                if not launch:
                    if self._ready or not self._flights:
                        return True
                    wake = min(
                        (f.deadline for f in self._flights.values() if f.started is not None),
                        default=now + most,
                    )
                    self._cond.wait(max(0.0, min(wake - now, most)))
            self._launch(launch)
            self._expire()
            with self._cond:
                return bool(self._ready) or not self._flights

        try:
            scope.wait(block, None if until is None else until - time.monotonic())
        except BaseException:
            self.end()  # the run was stopped while its tools worked
            raise

    def _deliver(self, until: float | None, scope: Scope) -> list[dict[str, Any]]:
        if until is not None and not self._ready and not self._flights:
            # Nothing in flight: a plain sleep of the guest's loop, under the run's deadline.
            scope.wait(_sleep, until - time.monotonic())
        out: list[dict[str, Any]] = []
        size = 0
        with self._cond:
            while self._ready:
                handle, outcome = self._ready[0]
                weight = _weight(outcome)
                if out and size + weight > MAX_DATA:
                    break  # the rest on the next wait: one answer stays within MAX_DATA
                self._ready.popleft()
                self._held -= weight
                size += weight
                out.append({"handle": handle, "outcome": outcome})
        return out

    def _expire(self) -> None:
        now = time.monotonic()
        with self._cond:
            late = [
                f for f in self._flights.values() if f.started is not None and f.deadline <= now
            ]
        for flight in late:
            message = f"{flight.tool.name}() did not return within {flight.timeout:g} s"
            self._finish(flight, _err("timeout", message))  # first: abandoning may finish it
            flight.abandon("timed out")

    def _finish(self, flight: _Flight, outcome: Ok | Err) -> None:
        """A call ended (from any thread): hand its outcome to the guest's next wait."""
        with self._cond:
            if self._flights.get(flight.handle) is not flight:
                return  # cancelled, timed out or from an earlier run: nobody waits for it
            del self._flights[flight.handle]
            self._running -= 1
            self._put_ready(flight.handle, outcome)
            self._cond.notify_all()

    def _put_ready(self, handle: int, outcome: Ok | Err) -> None:
        """Under the lock: ``outcome`` waits for the guest's next wait (and counts as held)."""
        self._ready.append((handle, outcome))
        self._held += _weight(outcome)

    def _pump(self) -> list[_Flight]:
        """Queued calls that may start now (under the lock); the caller launches them."""
        launch: list[_Flight] = []
        while self._queued and self._running < self.concurrency:
            flight = self._queued[0]
            if not flight.tool.is_async and self._threads >= MAX_RUN_THREADS:
                flights = self._flights.values()
                if any(f.started is not None and not f.tool.is_async for f in flights):
                    break  # waits for one of this run's threads to come back
                # Every thread of this run is stuck in a call that timed out.
                self._queued.popleft()
                self._held -= flight.size
                del self._flights[flight.handle]
                self._put_ready(flight.handle, self._busy(flight.tool))
                continue
            self._queued.popleft()
            self._held -= flight.size
            self._running += 1
            if not flight.tool.is_async:
                self._threads += 1
            flight.started = time.monotonic()
            flight.deadline = flight.started + self._timeout(flight.tool)
            launch.append(flight)
        return launch

    def _launch(self, flights: list[_Flight]) -> None:
        for flight in flights:
            if flight.tool.is_async:
                loop = self.loop if self.loop is not None else self._background_loop()
                coro = _run_async(flight.tool, flight.bound, flight.site)
                future = asyncio.run_coroutine_threadsafe(coro, loop)
                flight.future = future
                future.add_done_callback(flight.async_done)
            else:
                # `then` is set before the job is handed over: it may finish at once.
                job = _WORKERS.submit(
                    flight.tool, flight.bound, flight.site, self._thread_done, flight.sync_done
                )
                if job is None:
                    self._thread_done()
                    self._finish(flight, self._busy(flight.tool))
                    continue
                flight.job = job


class _Flight:
    """One started call of a run: queued, then running (on the tools' loop or a worker)."""

    __slots__ = (
        "bound",
        "deadline",
        "future",
        "handle",
        "host",
        "job",
        "site",
        "size",
        "started",
        "tool",
    )

    def __init__(
        self, host: ToolHost, handle: int, tool: Tool, bound: _Arguments, site: _Site
    ) -> None:
        self.host = host
        self.handle = handle
        self.tool = tool
        self.bound = bound
        self.site = site
        self.started: float | None = None
        self.deadline = math.inf
        self.future: concurrent.futures.Future[Ok | Err] | None = None
        self.job: _Job | None = None
        self.size = 0

    @property
    def timeout(self) -> float:
        return self.host._timeout(self.tool)

    def abandon(self, why: str) -> None:
        if self.job is not None:
            self.host._abandoned(self.job, why)
        else:
            self.site[1].stop(f"{self.tool.name}() {why}")
        if self.future is not None:
            self.future.cancel()  # cancels the tool's task on its loop

    def async_done(self, future: concurrent.futures.Future[Ok | Err]) -> None:
        if future.cancelled():
            outcome: Ok | Err = _err("cancelled", f"{self.tool.name}() was cancelled")
        else:
            try:
                outcome = future.result()
            except BaseException as exc:  # noqa: BLE001 - Ctrl-C/exit let through on a main loop
                outcome = _err(
                    "interrupted", f"{self.tool.name}() was interrupted: {type(exc).__name__}"
                )
        self.host._finish(self, outcome)

    def sync_done(self, outcome: Ok | Err) -> None:
        self.host._finish(self, outcome)


def _weight(outcome: Ok | Err) -> int:
    if isinstance(outcome, Ok):
        return len(outcome.value) + 16
    return len(outcome.value["message"]) * 4 + 64


async def _run_async(tool: Tool, bound: _Arguments, site: _Site) -> Ok | Err:
    depth, ctx = site
    _NESTING.set(depth)  # the task runs in its own copy of the context
    args, kwargs = _with_context(tool, bound, ctx)
    try:
        with using_context(ctx):
            value = await tool.fn(*args, **kwargs)
    except BaseException as exc:  # every failure of the tool goes to the code (see below)
        if isinstance(exc, asyncio.CancelledError) or _is_process_exit(exc):
            raise
        return _failure(exc)
    try:
        return _encode_result(tool.name, value)
    except BaseException as exc:  # noqa: BLE001 - a hostile __eq__/__hash__ while encoding
        return _failure(exc)


def _is_process_exit(exc: BaseException) -> bool:
    """Ctrl-C or exit raised on the main thread: maybe a signal's handler, so the host's.

    Sync tools run on worker threads and the sandbox's own loop on a thread of its own, where
    no signal handler runs: there a KeyboardInterrupt or SystemExit can only be the tool's own
    and is a ToolError. On the main thread (an async tool on the loop of a ``run_async``
    caller) it is let through to the loop, as asyncio itself does.
    """
    return isinstance(exc, KeyboardInterrupt | SystemExit) and (
        threading.current_thread() is threading.main_thread()
    )


def _call_sync(tool: Tool, bound: _Arguments, site: _Site) -> Ok | Err:
    """The tool's call and its result's encoding, on a worker thread; never raises."""
    depth, ctx = site
    token = _NESTING.set(depth)
    args, kwargs = _with_context(tool, bound, ctx)
    try:
        try:
            with using_context(ctx):
                value = tool.fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - SystemExit too: a ToolError for the code
            return _failure(exc)
        return _encode_result(tool.name, value)
    except BaseException as exc:  # noqa: BLE001 - a hostile __eq__/__hash__ while encoding
        return _failure(exc)
    finally:
        _NESTING.reset(token)


class _PipeBell:
    """A wake-up pipe: :meth:`ring` writes a byte, :meth:`wait` takes the bytes that came.

    The pure-Python form of ``mighty.sandbox._wake.Bell`` (sandbox/_wake.c), used when that
    module cannot be imported or ``MIGHTY_PURE_PYTHON=1`` is set, and the oracle the tests hold
    it to. It cannot spin with the GIL released, so it ignores ``spin_ns``: each wait parks.

    A pipe rather than a lock because of how the two wake a sleeping thread on Linux: a pipe
    write is a "sync" wake-up (the writer is about to sleep, so the reader may run on its CPU),
    a lock's futex wakes the thread wherever the scheduler puts it, and a wake-up on another
    core costs tens of microseconds on a loaded VM. Measured on this project's 2-core machine: a
    ping-pong between two Python threads through two locks 4-150 us per round trip (bimodal),
    through two pipes 2.1 us. A byte is only a wake-up, never the answer: the waiter looks at its
    job's state, so a late byte of an abandoned call is a spurious wake-up and nothing else.

    A bell has one waiter at a time (an instance makes one sync call at a time; a pool thread
    waits on its own bell). The bell's own lock guards ``closed``: a ring writes under it (never
    to a closed, perhaps reused, descriptor), and a close while a wait reads the pipe only marks
    it closed; the last waiter closes the descriptors when it leaves.
    """

    __slots__ = ("__weakref__", "_lock", "_poll", "_users", "closed", "read_fd", "write_fd")

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        os.set_blocking(self.write_fd, False)
        self._poll = select.poll()
        self._poll.register(self.read_fd, select.POLLIN)
        self._lock = threading.Lock()
        self._users = 0
        self.closed = False

    def ring(self) -> None:
        """Wake the waiter: one byte, unless closed."""
        with self._lock:
            if not self.closed:
                try:  # noqa: SIM105 - on the hot path: a try is cheaper than a context manager
                    os.write(self.write_fd, b"\0")
                except OSError:  # full of late bytes nobody read: the waiter is awake anyway
                    pass

    def wait(self, spin_ns: int, timeout_ns: int, ring: _PipeBell | None = None) -> bool:
        """Ring ``ring`` if given, then sleep until a byte comes or ``timeout_ns`` pass (-1:
        forever) and take the bytes that came. True when one came; a closed bell: False at
        once."""
        if not 0 <= spin_ns <= _MAX_SPIN_NS:
            raise ValueError(f"spin_ns must be in 0..{_MAX_SPIN_NS}, got {spin_ns}")
        if not -1 <= timeout_ns <= _MAX_TIMEOUT_NS:
            raise ValueError(f"timeout_ns must be -1 (forever) or in 0..{_MAX_TIMEOUT_NS}")
        if ring is not None:
            if not isinstance(ring, _PipeBell):
                raise TypeError(f"ring must be a Bell or None, got {type(ring).__name__}")
            ring.ring()
        with self._lock:
            if self.closed:
                return False
            self._users += 1
        try:
            got = self._take()
            if not got and timeout_ns != 0:
                ms = -1 if timeout_ns < 0 else -(-timeout_ns // 1_000_000)
                got = bool(self._poll.poll(ms)) and self._take()
            return got
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0 and self.closed:
                    self._close_fds()

    def _take(self) -> bool:
        """Empty the pipe: True when it held a byte (every ring so far is one wake-up)."""
        got = False
        try:
            while len(os.read(self.read_fd, 64)) == 64:
                got = True
        except BlockingIOError:
            return got
        return True

    def close(self) -> None:
        """Close the pipe (at once, or when the last wait leaves). Idempotent."""
        self.ring()  # a waiter parked in poll wakes (and leaves: the bell is closed)
        with self._lock:
            if not self.closed:
                self.closed = True
                if self._users == 0:
                    self._close_fds()

    def _close_fds(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.read_fd)
        with contextlib.suppress(OSError):
            os.close(self.write_fd)

    def __del__(self) -> None:
        # A host never closed (made directly, or dropped without Sandbox.close): no fd leak.
        # Nothing can ring or wait on it now: both hold a reference to it.
        if not self.closed:
            self.closed = True
            self._close_fds()


_NOT_RUN = Err({"kind": "cancelled", "message": "the call was cancelled before it ran"})
_MAX_SPIN_NS = 10_000_000
_MAX_TIMEOUT_NS = 3600 * 1_000_000_000


class _BellLike(typing.Protocol):
    """What :class:`_PipeBell` and the compiled ``_wake.Bell`` both are."""

    @property
    def closed(self) -> bool: ...

    def ring(self) -> None: ...

    def wait(self, spin_ns: int, timeout_ns: int, ring: Any = None) -> bool: ...

    def close(self) -> None: ...


def _bell_type() -> Callable[[], _BellLike]:
    """The compiled bell unless it is missing or ``MIGHTY_PURE_PYTHON`` is set."""
    if os.environ.get("MIGHTY_PURE_PYTHON", "") not in ("", "0"):
        return _PipeBell
    try:
        from mighty.sandbox import _wake
    except ImportError:
        return _PipeBell
    return _wake.Bell


_Bell = _bell_type()
"""The bells of this process: sync calls' callers and the pool's idle threads wait on them."""


_SPIN_US = 100
"""The default spin: longer than the code's time between two calls of a loop on this project's
VM under load (45-65 us; a spin shorter than that parks the pool thread before each call)."""


def _spin_default() -> int:
    """How long (ns) a hand-off's waiter spins before it parks: ``MIGHTY_TOOL_SPIN_US``
    (0-1000 microseconds), by default 100 us with at least two CPUs to run on and 0 with one
    (spinning there only delays the thread it waits for)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    text = os.environ.get("MIGHTY_TOOL_SPIN_US", "")
    try:
        micros = int(text) if text else (_SPIN_US if cpus >= 2 else 0)
    except ValueError:
        micros = _SPIN_US if cpus >= 2 else 0
    if _Bell is _PipeBell:
        return 0
    return max(0, min(micros, 1000)) * 1000


HANDOFF_SPIN_NS = _spin_default()
"""How long a sync call's caller spins for its result, and an idle pool thread for its next
job, before each parks in ``poll`` (nanoseconds; the CPU that costs: see docs/sandbox.md)."""


class _Job:
    """One sync call on a worker. ``outcome`` is set when ``state`` becomes ``"over"``; then
    ``bell`` (if set) is rung, ``then`` (if set) receives the outcome on the worker, and
    ``release`` frees the caller's thread share. ``wake`` is the bell of the idle thread the
    job was handed to, rung by the caller's first :meth:`wait` (so that the caller gives up the
    GIL before the thread wakes) or by :meth:`kick`."""

    __slots__ = ("bell", "bound", "outcome", "release", "site", "state", "then", "tool", "wake")

    def __init__(
        self,
        tool: Tool,
        bound: _Arguments,
        site: _Site,
        release: Callable[[], None],
        then: Callable[[Ok | Err], None] | None,
        bell: _BellLike | None,
    ) -> None:
        self.tool = tool
        self.bound = bound
        self.site = site
        self.release = release
        self.outcome: Ok | Err = _NOT_RUN  # read only once "over": the worker's, or this
        self.then = then
        self.bell = bell
        self.wake: _BellLike | None = None
        self.state = "queued"  # then "running", "stuck" (abandoned while running), "over"

    def wait(self, most: float) -> bool:
        """``Scope.wait``'s block: True once the call is over (its ``bell`` is rung then).

        The first wait wakes the job's thread and spins for the outcome before it parks."""
        if self.state != "over":
            bell = self.bell
            assert bell is not None
            wake, self.wake = self.wake, None
            spin = HANDOFF_SPIN_NS if wake is not None else 0
            timeout = min(int(most * 1e9), _MAX_TIMEOUT_NS) if most > 0 else 0
            bell.wait(spin, timeout, wake)
        return self.state == "over"

    def kick(self) -> None:
        """Wake the job's thread if no wait has yet (the caller gave up before waiting)."""
        wake, self.wake = self.wake, None
        if wake is not None:
            wake.ring()


class _Workers:
    """Daemon threads for sync tools, at most ``size``, started on demand and kept.

    A job whose caller gave up (timeout, cancel) while it ran is *stuck*: its thread is busy
    until the tool returns. When all ``size`` threads are stuck, ``submit`` says no at once;
    otherwise a job waits its turn (under its caller's timeout). Each idle thread waits on a
    bell of its own, and a job is handed to one directly: a call costs two rings, one to wake
    the thread and one to wake its caller. Each ring is made with the GIL released by the one
    who then waits (:meth:`_Job.wait`, the thread going idle), and each waiter spins
    :data:`HANDOFF_SPIN_NS` before it parks: a waiter still spinning is woken by the byte alone
    and finds the GIL free, so a call in a loop of calls costs no scheduler wake-up at all.
    """

    def __init__(
        self,
        size: int,
        *,
        bell: Callable[[], _BellLike] | None = None,
        spin_ns: int | None = None,
    ) -> None:
        self.size = size
        self._bell = bell  # the idle threads' bells (default: this process's _Bell)
        self._spin = spin_ns  # default: HANDOFF_SPIN_NS, read at each wait
        self._lock = threading.Lock()
        self._queue: collections.deque[_Job] = collections.deque()
        self._idle: list[list[Any]] = []  # [wake bell, job] of each idle thread
        self._threads = 0
        self._stuck = 0

    def submit(
        self,
        tool: Tool,
        bound: _Arguments,
        site: _Site,
        release: Callable[[], None],
        then: Callable[[Ok | Err], None] | None = None,
        *,
        bell: _BellLike | None = None,
    ) -> _Job | None:
        """Hand a job to an idle thread, else queue it (starting a thread if the pool may grow).

        With a ``bell`` the caller must :meth:`_Job.wait` (or :meth:`_Job.kick`): the first
        wait wakes the thread. Without one the thread is woken here."""
        job = _Job(tool, bound, site, release, then, bell)
        with self._lock:
            if self._stuck >= self.size:
                return None
            slot = self._idle.pop() if self._idle else None
            if slot is not None:
                # Handed over: the thread is the job's from now on (abandoning it marks it stuck).
                job.state = "running"
                slot[1] = job
            else:
                self._queue.append(job)
                if self._threads < self.size:  # else it waits for a thread to come free
                    self._threads += 1
                    threading.Thread(target=self._work, name="mighty-tool", daemon=True).start()
        if slot is not None:
            if bell is not None:
                job.wake = slot[0]  # the thread's bell lives as long as the thread: forever
            else:
                slot[0].ring()
        return job

    def abandon(self, job: _Job) -> bool:
        """The caller gave up on ``job``. Returns True when it is left running (stuck)."""
        job.kick()  # handed over but its thread not yet woken: it runs (and may finish) anyway
        with self._lock:
            if job.state == "running":
                job.state = "stuck"
                self._stuck += 1
                return True
            if job.state != "queued":
                return False
            if job in self._queue:  # else it was handed to a thread, which will skip it
                self._queue.remove(job)
            job.state = "over"
        job.release()
        return False

    def close_bell(self, bell: _BellLike) -> None:
        """Close ``bell``: a worker's late ring of it is then a no-op (the bell's own lock)."""
        bell.close()

    def stuck(self) -> int:
        """How many threads are in calls their callers gave up on."""
        with self._lock:
            return self._stuck

    def threads(self) -> int:
        """How many worker threads exist."""
        with self._lock:
            return self._threads

    def _work(self) -> None:
        bell = (self._bell or _Bell)()
        slot: list[Any] = [bell, None]
        ring: _BellLike | None = None  # the caller to wake on the way to sleep
        with self._lock:
            job = self._next(slot)
        while True:
            if job is None:
                # Idle: wake the last caller (the GIL released first), then spin and park
                # until a job is handed over (one byte per hand-over).
                spin = HANDOFF_SPIN_NS if self._spin is None else self._spin
                while not bell.wait(spin, -1, ring):
                    ring = None  # interrupted by a signal: rung already, wait again
                ring = None
                job, slot[1] = slot[1], None
                assert job is not None
            outcome = _call_sync(job.tool, job.bound, job.site)
            job.release()  # first: the caller may start its next call as soon as it wakes
            done = job
            with self._lock:
                if done.state == "stuck":
                    self._stuck -= 1
                done.outcome = outcome
                done.state = "over"
                # The next job, or this thread idle, before the caller is woken: once the
                # bell rings this thread only goes to sleep, and the caller gets the GIL.
                job = self._next(slot)
            if done.then is not None:
                done.then(outcome)
            if done.bell is not None:
                if job is None:
                    ring = done.bell  # rung by the wait above, with the GIL released
                else:
                    done.bell.ring()

    def _next(self, slot: list[Any]) -> _Job | None:
        """Under the lock: the next queued job for this thread, else the thread is idle."""
        while self._queue:
            job = self._queue.popleft()
            if job.state == "queued":  # else abandoned while it waited
                job.state = "running"
                return job
        self._idle.append(slot)
        return None


_WORKERS = _Workers(MAX_TOOL_THREADS)


def _failure(exc: BaseException) -> Err:
    """The ToolError of a tool's exception: type name and message, both bounded."""
    kind = cut_text(type(exc).__name__, MAX_KIND)
    return _err(kind, _safe_text(exc, MAX_MESSAGE))


def _err(kind: str, message: str) -> Err:
    return Err({"kind": kind, "message": message})


def _validation_message(exc: pydantic.ValidationError, adapter: pydantic.TypeAdapter[Any]) -> str:
    count = exc.error_count()
    if count > _MAX_LISTED_ERRORS:
        # errors() would build every one of them (a 1 MiB list can make a million).
        return f"{count} values do not fit {_hint_name(adapter)} (too many errors to list)"
    parts = []
    details = exc.errors(include_url=False, include_context=False, include_input=False)
    for error in details[:MAX_VALIDATION_ERRORS]:
        where = ".".join(_safe_text(p, 40) for p in error["loc"])
        msg = _safe_text(error["msg"], 200)
        parts.append(f"{where}: {msg}" if where else msg)
    if count > MAX_VALIDATION_ERRORS:
        parts.append(f"and {count - MAX_VALIDATION_ERRORS} more errors")
    return "; ".join(parts)


_MAX_LISTED_ERRORS = 100
"""Beyond this many validation errors, none is listed (building them costs memory)."""


def _hint_name(adapter: pydantic.TypeAdapter[Any]) -> str:
    return _safe_text(getattr(adapter, "_type", "its type hint"), 200)


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON data")


_ARGS_DECODER = json.JSONDecoder(parse_constant=_no_constants)


def _too_deep(value: Any) -> bool:
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            return True
        if isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
        elif isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
    return False


def _decode_args(name: str, payload: bytes) -> tuple[list[Any], dict[str, Any]] | Err:
    if len(payload) > MAX_DATA:
        return _err(
            "too_large",
            f"the arguments of {name}() are {len(payload)} bytes; the limit is {MAX_DATA}",
        )
    try:
        # One decoder for every call (``json.loads`` with an option builds one per call), on
        # strict UTF-8: the guest sends UTF-8 JSON (encoded surrogates are no text).
        data = _ARGS_DECODER.decode(payload.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        return _err("invalid_arguments", f"{name}(): arguments are not JSON data: {exc}")
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("args"), list)
        or not isinstance(data.get("kwargs"), dict)
    ):
        return _err("invalid_arguments", f"{name}(): malformed call")
    # Each level of nesting takes a byte at least: a short payload cannot be too deep.
    if len(payload) > MAX_DEPTH and _too_deep(data):
        return _err(
            "invalid_arguments", f"{name}(): arguments are nested deeper than {MAX_DEPTH} levels"
        )
    return data["args"], data["kwargs"]


def _encode_result(name: str, value: Any) -> Ok | Err:
    try:
        data = encode_json(value, MAX_DATA, "the result")
    except NotData as exc:
        if exc.too_large:
            return _err("too_large", f"{name}() returned more than {MAX_DATA} bytes of JSON")
        return _err("invalid_result", f"{name}() returned something that is not JSON data: {exc}")
    return Ok(data)


TOOL_HOST: Slot[ToolHost] = Slot("sandbox.tools")
"""The slot of a sandbox instance's :class:`ToolHost` (filled by the sandbox once it exists)."""


def _why(exc: BaseException) -> str:
    """How a run stopped while a tool worked, for the tool's context and the log."""
    kind = getattr(exc, "kind", "")
    if kind == "deadline_exceeded":
        return "was stopped (the run's deadline passed)"
    if isinstance(exc, KeyboardInterrupt | SystemExit) or kind == "cancelled":
        return "was cancelled"
    return f"was stopped ({type(exc).__name__})"


def _sleep(most: float) -> bool:
    """``Scope.wait``'s block for a plain sleep: nothing becomes ready, only time passes."""
    time.sleep(most)
    return False


class ToolsProvider:
    """``mighty:sandbox/tools`` for the gate. Stateless: each instance's :class:`ToolHost` is in
    :data:`TOOL_HOST` slot, so one provider (and one linker) serves every sandbox."""

    name = "sandbox.tools"

    def resources(self) -> Iterable[ResourceKind]:
        return ()

    def bindings(self) -> Iterable[Binding]:
        yield Binding(INTERFACE, "list-tools", _list_tools)
        yield Binding(INTERFACE, "call", _call)
        yield Binding(INTERFACE, "start", _start)
        yield Binding(INTERFACE, "wait", _wait)
        yield Binding(INTERFACE, "cancel", _cancel)

    def setup(self, ctx: GuestContext) -> None:
        return None  # the sandbox puts its ToolHost in the slot once the instance exists


def _host(ctx: GuestContext) -> ToolHost:
    host = ctx.find(TOOL_HOST)
    if host is None:
        raise StopRun("not_allowed", "this instance has no tools")
    return host


def _list_tools(ctx: GuestContext) -> str:
    host = ctx.find(TOOL_HOST)
    return host.spec_json if host is not None else "[]"


def _call(ctx: GuestContext, name: str, payload: bytes) -> Ok | Err:
    return _host(ctx).call(ctx, name, bytes(payload))


def _start(ctx: GuestContext, name: str, payload: bytes) -> int:
    return _host(ctx).start(name, bytes(payload))


def _wait(ctx: GuestContext, timeout_ns: int | None) -> list[dict[str, Any]]:
    return _host(ctx).wait(ctx, timeout_ns)


def _cancel(ctx: GuestContext, handle: int) -> None:
    _host(ctx).cancel(handle)
