"""Tools: host callables the sandboxed code calls as ordinary Python functions.

A tool crosses the boundary as data only. The guest sends JSON ``{"args": [...], "kwargs":
{...}}`` through ``mighty:sandbox/tools#call``; here the arguments are bound to the callable's
signature and validated against its type hints with pydantic (one ``TypeAdapter`` per
parameter, built once at registration), the callable runs in a worker thread (sync) or on an
event loop (async) under its own timeout, and its result goes back as JSON. Every failure of
the tool is an ``Err`` the guest raises as ``ToolError``; only what the *code* did wrong in a way
that must end the run (an unknown tool name, too many calls) stops the guest.

Rejected: ``pydantic.validate_call``. It wraps the callable, so a validation error and an error
raised inside the tool look alike, and its messages name the wrapper.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
import keyword
import threading
import time
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pydantic
import pydantic_core

from mighty.abi import Err, Ok
from mighty.gate import Binding, GuestContext, GuestViolation, ResourceKind

__all__ = [
    "MAX_DATA",
    "MAX_DEPTH",
    "Tool",
    "ToolsProvider",
    "describe_tools",
    "tools_from",
]

INTERFACE = "mighty:sandbox/tools"
MAX_DATA = 1 << 20
"""Most bytes of JSON one tool call's arguments or result may take."""
MAX_DEPTH = 100
"""Deepest nesting of lists and objects accepted in tool arguments."""
_WAIT_SLICE = 0.02


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

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(f"a tool must be callable, got {type(self.fn).__name__}")
        name = self.name or getattr(self.fn, "__name__", "")
        if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_"):
            raise ValueError(
                f"tool name {name!r} is not usable from Python code: it must be an identifier,"
                " not a keyword, and not start with '_'"
            )
        if self.timeout is not None and not self.timeout > 0:
            raise ValueError(f"tool {name}: timeout must be positive, got {self.timeout}")
        signature = inspect.signature(self.fn)
        try:
            hints = typing.get_type_hints(self.fn, include_extras=True)
        except Exception:  # noqa: BLE001 - unresolvable hints: validate nothing rather than fail
            hints = {}
        adapters: dict[str, pydantic.TypeAdapter[Any] | None] = {}
        for pname in signature.parameters:
            hint = hints.get(pname)
            adapters[pname] = None if hint is None else pydantic.TypeAdapter(hint)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "signature", signature)
        object.__setattr__(self, "adapters", adapters)
        object.__setattr__(self, "is_async", inspect.iscoroutinefunction(self.fn))

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
                raise InvalidArgument(f"argument {pname!r}: {_validation_message(exc)}") from None
        return bound

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
            raise ValueError(f"two tools are named {tool.name!r}")
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
    """Per-instance tool state: the registry, the limits, the current run's counters.

    One ``ToolHost`` is put in ``ctx.state["sandbox.tools"]`` of every sandbox instance.
    """

    def __init__(
        self,
        tools: Mapping[str, Tool],
        *,
        max_calls: int,
        timeout: float,
        background_loop: Callable[[], asyncio.AbstractEventLoop],
    ) -> None:
        self.tools = tools
        self.max_calls = max_calls
        self.timeout = timeout
        self._background_loop = background_loop
        self.spec_json = json.dumps([t.spec() for t in tools.values()])
        self.calls = 0
        self.tool_time = 0.0
        self.stopped: StopRun | None = None
        self.cancel_check: Callable[[], bool] = lambda: False
        self.loop: asyncio.AbstractEventLoop | None = None

    def begin(
        self, cancel_check: Callable[[], bool], loop: asyncio.AbstractEventLoop | None
    ) -> None:
        """Reset the counters for a new run."""
        self.calls = 0
        self.tool_time = 0.0
        self.stopped = None
        self.cancel_check = cancel_check
        self.loop = loop

    def stop(self, kind: str, message: str) -> StopRun:
        """Remember why the run must end, and return the exception that ends it."""
        stop = StopRun(kind, message)
        if self.stopped is None:
            self.stopped = stop
        return stop

    def call(self, ctx: GuestContext, name: str, payload: bytes) -> Ok | Err:
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
            bound = tool.bind(args, kwargs)
        except (TypeError, InvalidArgument) as exc:
            return _err("invalid_arguments", str(exc))
        timeout = tool.timeout if tool.timeout is not None else self.timeout
        started = time.monotonic()
        pause = ctx.state.get("budget.pause")
        interrupt = ctx.state.get("wasi.io.interrupt")
        try:
            if pause is not None:
                with pause():
                    outcome = self._invoke(tool, bound, timeout, interrupt)
            else:
                outcome = self._invoke(tool, bound, timeout, interrupt)
        finally:
            self.tool_time += time.monotonic() - started
        return outcome

    def _invoke(
        self,
        tool: Tool,
        bound: inspect.BoundArguments,
        timeout: float,
        interrupt: Callable[[], None] | None,
    ) -> Ok | Err:
        future: concurrent.futures.Future[Any]
        if tool.is_async:
            loop = self.loop if self.loop is not None else self._background_loop()
            future = asyncio.run_coroutine_threadsafe(tool.fn(*bound.args, **bound.kwargs), loop)
        else:
            future = concurrent.futures.Future()
            worker = threading.Thread(
                target=_run_into,
                args=(future, tool.fn, bound),
                name=f"mighty-tool-{tool.name}",
                daemon=True,
            )
            worker.start()
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                future.cancel()
                return _err("timeout", f"{tool.name}() did not return within {timeout:g} s")
            try:
                value = future.result(timeout=min(left, _WAIT_SLICE))
                break
            except concurrent.futures.TimeoutError:
                if self.cancel_check() and interrupt is not None:
                    future.cancel()
                    interrupt()  # raises: the run was cancelled while the tool worked
                continue
            except concurrent.futures.CancelledError:
                return _err("cancelled", f"{tool.name}() was cancelled")
            except Exception as exc:  # noqa: BLE001 - a tool's failure goes to the guest
                return _err(type(exc).__name__, str(exc))
        return _encode_result(tool.name, value)


def _run_into(
    future: concurrent.futures.Future[Any], fn: Callable[..., Any], bound: inspect.BoundArguments
) -> None:
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(fn(*bound.args, **bound.kwargs))
    except BaseException as exc:  # noqa: BLE001 - handed to the waiting guest call
        future.set_exception(exc)


def _err(kind: str, message: str) -> Err:
    return Err({"kind": kind, "message": message})


def _validation_message(exc: pydantic.ValidationError) -> str:
    parts = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(p) for p in error["loc"])
        parts.append(f"{where}: {error['msg']}" if where else error["msg"])
    return "; ".join(parts)


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON data")


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
        data = json.loads(payload, parse_constant=_no_constants)
    except (ValueError, RecursionError) as exc:
        return _err("invalid_arguments", f"{name}(): arguments are not JSON data: {exc}")
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("args"), list)
        or not isinstance(data.get("kwargs"), dict)
    ):
        return _err("invalid_arguments", f"{name}(): malformed call")
    if _too_deep(data):
        return _err(
            "invalid_arguments", f"{name}(): arguments are nested deeper than {MAX_DEPTH} levels"
        )
    return data["args"], data["kwargs"]


def _encode_result(name: str, value: Any) -> Ok | Err:
    try:
        data = json.dumps(
            pydantic_core.to_jsonable_python(value), allow_nan=False, separators=(",", ":")
        ).encode()
    except (TypeError, ValueError, RecursionError, pydantic_core.PydanticSerializationError) as exc:
        return _err("invalid_result", f"{name}() returned something that is not JSON data: {exc}")
    if len(data) > MAX_DATA:
        return _err(
            "too_large", f"{name}() returned {len(data)} bytes of JSON; the limit is {MAX_DATA}"
        )
    return Ok(data)


class ToolsProvider:
    """``mighty:sandbox/tools`` for the gate. Stateless: each instance's :class:`ToolHost` is in
    ``ctx.state["sandbox.tools"]``, so one provider (and one linker) serves every sandbox."""

    name = "sandbox.tools"

    def resources(self) -> Iterable[ResourceKind]:
        return ()

    def bindings(self) -> Iterable[Binding]:
        yield Binding(INTERFACE, "list-tools", _list_tools)
        yield Binding(INTERFACE, "call", _call)

    def setup(self, ctx: GuestContext) -> None:
        ctx.state.setdefault("sandbox.tools", None)


def _host(ctx: GuestContext) -> ToolHost:
    host = ctx.state.get("sandbox.tools")
    if not isinstance(host, ToolHost):
        raise StopRun("not_allowed", "this instance has no tools")
    return host


def _list_tools(ctx: GuestContext) -> str:
    host = ctx.state.get("sandbox.tools")
    return host.spec_json if isinstance(host, ToolHost) else "[]"


def _call(ctx: GuestContext, name: str, payload: bytes) -> Ok | Err:
    return _host(ctx).call(ctx, name, bytes(payload))
