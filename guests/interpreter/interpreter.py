"""The code-mode interpreter guest: runs untrusted Python code strings for `mighty.sandbox`.

Built with componentize-py against `wit/sandbox/sandbox.wit` (world `interpreter`). The host
creates a fresh instance per run, so isolation between runs comes from the host, not from
anything here: this module only has to report faithfully, and the host re-checks everything it
reports (kinds, value size, JSON) because user code runs in this very interpreter and can patch
it.

Data crosses as UTF-8 JSON in `list<u8>` (not CBOR): `json` is in the guest's standard library,
it is the data model the sandbox promises (JSON-compatible values), and a strict check of that
model is needed here anyway.

componentize-py bundles only the modules imported while the component is built, so every
standard-library module user code may reasonably import is imported below.
"""

# ruff: noqa: F401 - the imports below exist so componentize-py bundles them for user code
import ast
import base64
import binascii
import bisect
import builtins
import calendar
import collections
import collections.abc
import contextlib
import copy
import csv
import dataclasses
import datetime
import decimal
import difflib
import enum
import errno
import fnmatch
import fractions
import functools
import hashlib
import heapq
import hmac
import html
import io
import itertools
import json
import keyword
import linecache
import math
import numbers
import opcode
import operator
import os
import pathlib
import pprint
import random
import re
import secrets
import shlex
import statistics
import string
import struct
import sys
import textwrap
import time
import traceback
import types
import typing
import unicodedata
import uuid
import zlib

import wit_world
from componentize_py_types import Err
from wit_world.imports import tools


def _socket_constant(name: str) -> int:
    if name.isupper():
        return 0
    raise AttributeError(name)


def _import_asyncio() -> types.ModuleType:
    """asyncio, without bundling ``socket`` or ``subprocess`` into the interpreter.

    asyncio imports both at its top for its network and process APIs, which cannot work here
    (no sockets are granted, WASI cannot fork). Stand-ins with the few constants asyncio reads
    while importing take their place for that import and are removed after it, so user code's
    ``import socket`` is still a ``ModuleNotFoundError`` and no ``socket`` or ``Popen`` class
    exists in the interpreter.
    """
    socket_stub = types.ModuleType("socket")
    socket_stub.socket = None  # type: ignore[attr-defined]
    # Constants (AF_*, SOCK_*...) appear in asyncio's default arguments; none is ever used.
    socket_stub.__getattr__ = _socket_constant  # type: ignore[attr-defined]
    subprocess_stub = types.ModuleType("subprocess")
    subprocess_stub.PIPE, subprocess_stub.STDOUT, subprocess_stub.DEVNULL = -1, -2, -3  # type: ignore[attr-defined]
    stubs = {"socket": socket_stub, "subprocess": subprocess_stub}
    saved = {name: sys.modules.get(name) for name in stubs}
    sys.modules.update(stubs)
    try:
        import asyncio  # imported here, under the stand-ins

        return asyncio
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


asyncio = _import_asyncio()

# stdout is line-buffered, as CPython's own is on a terminal: componentize-py starts CPython
# unbuffered, and each write crosses into the host as three imports (check-write, write,
# blocking-flush), so `print('x', i, 'y')` was six writes, eighteen imports, ~0.1 ms. Now a line
# is one write, passed on when it ends, when over 8 KiB wait, or when the run ends (`_flush`).
# stderr stays unbuffered (errors go out at once, and in order with the lines of stdout).
sys.stdout.reconfigure(line_buffering=True, write_through=False)  # type: ignore[union-attr]

_FILENAME = "<sandbox>"
_MAX_DEPTH = 200
_MAX_TOOL_DATA = 1 << 20  # the host's limit too; far more would trap in wasmtime's copy
_MISSING = type("_Missing", (), {"__repr__": lambda self: "<default>"})()


class ToolError(Exception):
    """A host tool failed. ``tool`` names it; ``kind`` is the tool's exception type name (or
    ``invalid_arguments``, ``invalid_result``, ``timeout``, ``too_large``)."""

    def __init__(self, tool: str, kind: str, message: str) -> None:
        super().__init__(f"{tool}: {kind}: {message}")
        self.tool = tool
        self.kind = kind
        self.message = message


ToolError.__module__ = "builtins"  # tracebacks say `ToolError`, as for a built-in exception
_SIZE_OVERFLOW = (
    "index-sized integer",
    "ssize_t",
    "too many digits",
    "repeated string is too long",
)


class _NotJson(TypeError):
    pass


def _check_json(value: object, path: str, depth: int, active: set[int]) -> None:
    """Raise TypeError unless ``value`` is JSON-compatible data (no cycles, finite floats)."""
    if value is None or isinstance(value, bool | int | str):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _NotJson(f"{path} is {value!r}, which JSON cannot represent")
        return
    if depth > _MAX_DEPTH:
        raise _NotJson(f"{path} is nested deeper than {_MAX_DEPTH} levels")
    if isinstance(value, list | tuple | dict):
        if id(value) in active:
            raise _NotJson(f"{path} contains itself (a circular reference)")
        active.add(id(value))
        try:
            if isinstance(value, dict):
                for key, item in value.items():
                    if not isinstance(key, str):
                        raise _NotJson(
                            f"{path} has a key of type {type(key).__name__} ({key!r});"
                            " JSON object keys must be strings"
                        )
                    _check_json(item, f"{path}[{key!r}]", depth + 1, active)
            else:
                for index, item in enumerate(value):
                    _check_json(item, f"{path}[{index}]", depth + 1, active)
        finally:
            active.discard(id(value))
        return
    raise _NotJson(
        f"{path} is a {type(value).__name__}, which is not JSON-compatible"
        " (use None, bool, int, float, str, list, dict)"
    )


_MAX_PLAIN_ITEMS = 1 << 17


def _plain(value: object) -> bool:
    """A quick check that ``value`` is plain JSON data (exact builtin types, str keys, finite
    floats, not too deep, not too many items). False means: ask ``_check_json``, which explains
    what is wrong (or accepts the value after all: subclasses, large values)."""
    stack: list[tuple[object, int]] = [(value, 0)]
    seen = 0
    while stack:
        item, depth = stack.pop()
        kind = type(item)
        if kind is str or kind is int or kind is bool or item is None:
            continue
        if kind is float:
            if not math.isfinite(item):  # type: ignore[arg-type]
                return False
            continue
        seen += 1
        if depth >= _MAX_DEPTH or seen > _MAX_PLAIN_ITEMS:
            return False  # a cycle ends here too
        if kind is list or kind is tuple:
            stack.extend((x, depth + 1) for x in item)  # type: ignore[attr-defined]
        elif kind is dict:
            for key, x in item.items():  # type: ignore[attr-defined]
                if type(key) is not str:
                    return False
                stack.append((x, depth + 1))
        else:
            return False
    return True


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _dumps(value: object, what: str) -> bytes:
    if not _plain(value):
        _check_json(value, what, 0, set())
    return _ENCODER.encode(value).encode()


# -- tools ----------------------------------------------------------------------------------

_tool_specs: list[tuple[dict[str, object], types.CodeType]] | None = None


def _encode_call(name: str, args: list[object], kwargs: dict[str, object]) -> bytes:
    try:
        payload = _dumps({"args": args, "kwargs": kwargs}, f"the arguments of {name}()")
    except _NotJson as exc:
        raise TypeError(str(exc)) from None
    if len(payload) > _MAX_TOOL_DATA:
        raise ToolError(
            name,
            "too_large",
            f"the arguments are {len(payload)} bytes; the limit is {_MAX_TOOL_DATA}",
        )
    return payload


def _call_tool(name: str, args: list[object], kwargs: dict[str, object]) -> object:
    payload = _encode_call(name, args, kwargs)
    try:
        answer = tools.call(name, payload)
    except Err as failure:
        error = failure.value
        raise ToolError(name, error.kind, error.message) from None
    return _loads(answer)


# The fast path of a sync call whose arguments are all scalars (the stub checks their exact
# types: a subclass goes the long way): the arguments need no check of their shape, so they are
# written by the C encoder alone, and the result is read by the C scanner alone. In this
# interpreter every Python-level call costs microseconds; this path makes the fewest. It writes
# the very bytes `_encode_call` would.
_SCALARS = frozenset({int, str, float, bool, type(None)})
_running_loop = asyncio._get_running_loop


def _not_scalar(value: object) -> object:
    raise TypeError(f"{type(value).__name__} is not a scalar")


_encode_scalars = json.encoder.c_make_encoder(  # type: ignore[attr-defined]
    None, _not_scalar, json.encoder.encode_basestring, None, ":", ",", False, False, False
)
_scan_result = json.decoder.JSONDecoder().scan_once


def _call_scalars(name: str, args: tuple[object, ...], kwargs: dict[str, object] | None) -> object:
    try:
        text = "".join(_encode_scalars(args, 0))
        if kwargs is None:
            text = '{"args":' + text + ',"kwargs":{}}'
        else:
            text = '{"args":' + text + ',"kwargs":' + "".join(_encode_scalars(kwargs, 0)) + "}"
        payload = text.encode()
    except (TypeError, ValueError):  # NaN, a lone surrogate: the long way says it right
        return _call_tool(name, list(args), kwargs or {})
    if len(payload) > _MAX_TOOL_DATA:
        return _call_tool(name, list(args), kwargs or {})
    try:
        answer = tools.call(name, payload)
    except Err as failure:
        error = failure.value
        raise ToolError(name, error.kind, error.message) from None
    return _loads(answer)


def _loads(data: bytes) -> object:
    """``json.loads`` of a tool's result: the C scanner alone when the bytes are compact UTF-8
    JSON (the host writes them so), else ``json.loads`` itself (its errors, its leniency)."""
    try:
        text = data.decode()
        value, end = _scan_result(text, 0)
        if end == len(text):
            return value
    except (ValueError, StopIteration):
        pass
    return json.loads(data)


# -- async tools ----------------------------------------------------------------------------
# The guest has no threads, so concurrency lives in the host: `tools.start` begins a call and
# returns its handle at once; `tools.wait` blocks until at least one started call has finished
# (or a timeout passes) and returns the finished ones in the order the guest receives them. A
# small asyncio event loop drives this: its selector's `select(timeout)` is `tools.wait`, and
# each completion resolves the future of its handle. Replay is exact because every `wait`
# answer (which calls, in which order) is an import result the trace records.


class _Waiter:
    """The loop's selector: waiting for I/O is waiting for tool calls to finish."""

    def __init__(self, loop: "_ToolLoop") -> None:
        self.loop = loop

    def select(self, timeout: float | None) -> list[object]:
        if not self.loop.calls:
            if timeout is None:
                raise RuntimeError(
                    "the event loop would wait forever: no tool call is in flight and "
                    "nothing is scheduled"
                )
            if timeout > 0:
                time.sleep(timeout)
            return []
        nanos = None if timeout is None else max(0, int(timeout * 1e9))
        return list(tools.wait(nanos))

    def close(self) -> None:
        pass


class _ToolLoop(asyncio.BaseEventLoop):
    """The event loop of sandboxed code: timers and callbacks as usual, I/O is tool calls."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[int, tuple[str, asyncio.Future[object]]] = {}
        self._selector = _Waiter(self)

    def start_call(self, name: str, args: list[object], kwargs: dict[str, object]) -> object:
        """Start tool ``name`` now; return a coroutine that waits for its result.

        ``await tool(...)`` when nothing else could run while it waits (no other call in
        flight, no callback ready, no timer, the loop not stopping) makes the call at once
        instead, as a sync call: the loop would only have slept until this one call finished.
        That saves the `start` and `wait` imports and two turns of this loop per call (~0.2 ms
        of a 0.45 ms awaited call). Whether the caller awaits the stub's result at once is read
        from its bytecode (`_awaited_at_once`): `a = tool(); ...; await a` and
        `gather(tool(), ...)` start the call and go on, as before.
        """
        if (
            not self.calls
            and not self._ready
            and not self._scheduled
            and not self._stopping
            and _awaited_at_once()
        ):
            try:
                value = _call_tool(name, args, kwargs)
            except ToolError as failure:
                return _raise(failure)
            return _value(value)
        payload = _encode_call(name, args, kwargs)
        future: asyncio.Future[object] = self.create_future()
        handle = tools.start(name, payload)
        self.calls[handle] = (name, future)
        future.add_done_callback(functools.partial(self._forget, handle))
        waiter = _result_of(future)
        # Python's "coroutine ... was never awaited" warning then names the tool.
        waiter.__name__ = waiter.__qualname__ = name
        return waiter

    def _forget(self, handle: int, future: asyncio.Future[object]) -> None:
        if self.calls.pop(handle, None) is not None and future.cancelled():
            tools.cancel(handle)

    def _process_events(self, event_list: list[object]) -> None:
        for done in event_list:
            entry = self.calls.get(done.handle)  # type: ignore[attr-defined]
            if entry is None or entry[1].done():
                continue
            name, future = entry
            outcome = done.outcome  # type: ignore[attr-defined]
            if isinstance(outcome, Err):
                future.set_exception(ToolError(name, outcome.value.kind, outcome.value.message))
            else:
                future.set_result(_loads(outcome.value))

    def _write_to_self(self) -> None:
        pass  # no other thread can wake this loop

    def close(self) -> None:
        for handle in list(self.calls):
            tools.cancel(handle)
        self.calls.clear()
        super().close()


async def _result_of(future: asyncio.Future[object]) -> object:
    return await future


async def _value(value: object) -> object:
    return value


async def _raise(failure: ToolError) -> object:
    raise failure


def _call_caches() -> dict[int, int]:
    """Opcode of each call instruction -> the cache units that follow it (this Python's)."""
    try:
        entries = opcode._inline_cache_entries  # type: ignore[attr-defined]
        return {
            opcode.opmap[name]: int(entries.get(name, 0))
            for name in ("CALL", "CALL_KW", "CALL_FUNCTION_EX")
        }
    except (AttributeError, KeyError, TypeError, ValueError):
        return {}  # another bytecode layout: never take the shortcut


_CALL_CACHES = _call_caches()
_GET_AWAITABLE = opcode.opmap.get("GET_AWAITABLE", -1)
_AWAITED: dict[tuple[types.CodeType, int], bool] = {}


def _awaited_at_once() -> bool:
    """True when the tool stub now running was called as ``await stub(...)``: the call
    instruction of the stub's caller is followed by ``GET_AWAITABLE``. False when unsure."""
    frame = sys._getframe(3)  # 0 this, 1 start_call, 2 _dispatch, 3 the stub or _invoke
    for _ in range(2):
        if frame is None:
            return False
        if frame.f_code.co_filename.startswith("<tool "):
            break
        frame = frame.f_back
    else:
        return False
    caller = frame.f_back
    if caller is None:
        return False
    key = (caller.f_code, caller.f_lasti)
    known = _AWAITED.get(key)
    if known is None:
        raw = caller.f_code.co_code
        at = key[1]
        caches = _CALL_CACHES.get(raw[at]) if 0 <= at < len(raw) else None
        following = -1 if caches is None else at + 2 + 2 * caches
        known = 0 <= following < len(raw) and raw[following] == _GET_AWAITABLE
        if len(_AWAITED) >= 512:
            _AWAITED.clear()  # bounded: a session's code objects come and go
        _AWAITED[key] = known
    return known


def _run_main(main: typing.Coroutine[object, object, object]) -> object:
    """``asyncio.run`` on a fresh tool loop, for code with top-level ``await``: what
    ``asyncio.Runner`` does (the loop current while it runs, the tasks left cancelled and
    their failures reported, async generators finalized, the loop closed), without what this
    interpreter has no use for: a SIGINT handler, the default executor's shutdown (no threads
    here), a copied context of its own (the task copies one). Each of those was a run of the
    loop or a call into `signal`: the Runner cost 0.26-0.43 ms a run, this ~0.06."""
    loop = _ToolLoop()
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(main)
    finally:
        try:
            asyncio.runners._cancel_all_tasks(loop)  # type: ignore[attr-defined]
            if loop._asyncgens:  # type: ignore[attr-defined]
                loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


# `asyncio.run()`, `asyncio.new_event_loop()` and `asyncio.Runner()` in user code make tool loops:
# the default loop needs a socket pair, which this interpreter does not have.
asyncio.events.new_event_loop = _ToolLoop  # type: ignore[assignment]
asyncio.new_event_loop = _ToolLoop  # type: ignore[assignment]


def _stub(spec: dict[str, object], code: types.CodeType) -> object:
    """A new Python function with the tool's real signature that calls the host, from its
    compiled ``def`` (:func:`_stub_code`): each run's globals get their own function objects
    and stub globals, so what a run does to them reaches no other run (a session's reset
    included)."""
    name = str(spec["name"])
    scope: dict[str, object] = {
        "_MISSING": _MISSING,
        "_invoke": _invoke,
        "_dispatch": _dispatch,
        "_mighty_fast": _call_scalars,
        "_mighty_loop": _running_loop,
        "_mighty_scalars": _SCALARS,
        "_mighty_type": type,
    }
    exec(code, scope)  # noqa: S102 - names were checked by _stub_code
    func = scope[name]
    func.__doc__ = str(spec.get("doc") or "")  # type: ignore[attr-defined]
    func.__module__ = "tools"  # type: ignore[attr-defined]
    return func


def _stub_code(spec: dict[str, object]) -> types.CodeType:
    """The compiled ``def`` of a tool's stub: made once per tool for the life of the instance
    (the warm-up run makes them, so they are in the pool's warmed state); compiling it was
    most of a run's own time (~0.24 ms per tool here), making a function from it is not."""
    name = str(spec["name"])
    params: list[dict[str, str]] = spec["params"]  # type: ignore[assignment]
    pieces: list[str] = []
    collect: list[str] = []
    seen_kwonly = False
    for param in params:
        pname, kind = param["name"], param["kind"]
        if not pname.isidentifier() or keyword.iskeyword(pname):
            raise ValueError(f"tool {name}: bad parameter name {pname!r}")
        if (
            kind != "POSITIONAL_ONLY"
            and pieces
            and "/" not in pieces
            and any(p["kind"] == "POSITIONAL_ONLY" for p in params)
        ):
            pieces.append("/")
        if kind == "VAR_POSITIONAL":
            pieces.append(f"*{pname}")
            seen_kwonly = True
        elif kind == "VAR_KEYWORD":
            pieces.append(f"**{pname}")
        else:
            if kind == "KEYWORD_ONLY" and not seen_kwonly:
                pieces.append("*")
                seen_kwonly = True
            pieces.append(f"{pname}=_MISSING" if "default" in param else pname)
        collect.append(f"({pname!r}, {kind!r}, {pname})")
    if params and all(p["kind"] == "POSITIONAL_ONLY" for p in params):
        pieces.append("/")
    source = _direct_source(name, params, pieces) or (
        f"def {name}({', '.join(pieces)}):\n    return _invoke({name!r}, [{', '.join(collect)}])\n"
    )
    return compile(source, f"<tool {name}>", "exec")


def _direct_source(name: str, params: list[dict[str, str]], pieces: list[str]) -> str | None:
    """The stub's source when its call needs no sorting out at run time: positional parameters
    without defaults and keyword-only ones (the common case, and pydantic-ai's). Else None."""
    positional: list[str] = []
    keywords: list[str] = []
    kwonly: list[str] = []
    optional: list[str] = []
    for param in params:
        pname, kind = param["name"], param["kind"]
        if kind in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD") and "default" not in param:
            positional.append(pname)
        elif kind == "KEYWORD_ONLY":
            kwonly.append(pname)
            keywords.append(f"{pname!r}: {pname}")
            if "default" in param:
                optional.append(pname)
        else:
            return None
    lines = [f"def {name}({', '.join(pieces)}):"]
    # Outside async code, with scalar arguments (an omitted optional one is _MISSING, not a
    # scalar): the fast path, no list or dict built for `_dispatch`.
    if not any(p["name"].startswith("_mighty_") for p in params):  # else they hide the helpers
        checks = "".join(f" and _mighty_type({p}) in _mighty_scalars" for p in positional + kwonly)
        packed = f"({', '.join(positional)}{',' if len(positional) == 1 else ''})"
        named = f"{{{', '.join(keywords)}}}" if keywords else "None"
        lines.append(f"    if _mighty_loop() is None{checks}:")
        lines.append(f"        return _mighty_fast({name!r}, {packed}, {named})")
    lines.append(f"    _mighty_kw = {{{', '.join(keywords)}}}")
    lines.extend(f"    if {o} is _MISSING:\n        del _mighty_kw[{o!r}]" for o in optional)
    lines.append(f"    return _dispatch({name!r}, [{', '.join(positional)}], _mighty_kw)")
    return "\n".join(lines) + "\n"


def _dispatch(name: str, args: list[object], kwargs: dict[str, object]) -> object:
    loop = asyncio._get_running_loop()
    if isinstance(loop, _ToolLoop):
        # Inside async code: start the call now, let the caller await it.
        return loop.start_call(name, args, kwargs)
    return _call_tool(name, args, kwargs)


def _invoke(name: str, bound: list[tuple[str, str, object]]) -> object:
    args: list[object] = []
    kwargs: dict[str, object] = {}
    positional = True
    for pname, kind, value in bound:
        if kind == "VAR_POSITIONAL":
            args.extend(value)  # type: ignore[call-overload]
        elif kind == "VAR_KEYWORD":
            kwargs.update(value)  # type: ignore[call-overload]
        elif value is _MISSING:
            positional = positional and kind == "POSITIONAL_ONLY"
        elif kind == "POSITIONAL_ONLY" or (kind == "POSITIONAL_OR_KEYWORD" and positional):
            args.append(value)
        else:
            kwargs[pname] = value
    return _dispatch(name, args, kwargs)


def _tools() -> dict[str, object]:
    global _tool_specs  # noqa: PLW0603 - the tool list is fixed for the life of the instance
    if _tool_specs is None:
        specs = json.loads(tools.list_tools())
        _tool_specs = [(spec, _stub_code(spec)) for spec in specs]
    return {str(spec["name"]): _stub(spec, code) for spec, code in _tool_specs}


# -- running code ---------------------------------------------------------------------------

_session: dict[str, object] | None = None


def _fresh_globals() -> dict[str, object]:
    scope: dict[str, object] = {"__name__": "__main__", "__builtins__": builtins}
    scope.update(_tools())
    scope["ToolError"] = ToolError
    return scope


def _user_traceback(exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == _FILENAME]
    lines = ["Traceback (most recent call last):\n"] if frames else []
    lines.extend(traceback.format_list(frames))
    lines.extend(traceback.format_exception_only(type(exc), exc))
    return "".join(lines)


def _failure(kind: str, message: str, trace: str = "") -> wit_world.Outcome:
    return wit_world.Outcome(ok=False, value=b"", error_kind=kind, message=message, traceback=trace)


def _execute(code: str, scope: dict[str, object]) -> object:
    """Run ``code`` in ``scope``; return ``result`` if it set one, else its last expression.

    Code with a top-level ``await`` (or ``async for``/``async with``) runs as a coroutine on a
    tool loop, where tool calls are awaitable.
    """
    tree = ast.parse(code, _FILENAME, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    body = compile(tree, _FILENAME, "exec", flags=_TOP_LEVEL_AWAIT)
    tail = compile(last, _FILENAME, "eval", flags=_TOP_LEVEL_AWAIT) if last is not None else None
    if (body.co_flags | (tail.co_flags if tail is not None else 0)) & _CO_COROUTINE:
        value = _run_main(_main(body, tail, scope))
    else:
        exec(body, scope)  # noqa: S102 - running code is the job
        value = eval(tail, scope) if tail is not None else None  # noqa: S307
    if "result" in scope:
        return scope["result"]
    return value


_TOP_LEVEL_AWAIT = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
_CO_COROUTINE = 0x80  # inspect.CO_COROUTINE: the code object awaits


async def _main(
    body: types.CodeType, tail: types.CodeType | None, scope: dict[str, object]
) -> object:
    started = eval(body, scope)  # noqa: S307 - a coroutine when the body awaits
    if body.co_flags & _CO_COROUTINE:
        await started
    if tail is None:
        return None
    value = eval(tail, scope)  # noqa: S307
    if tail.co_flags & _CO_COROUTINE:
        value = await value
    return value


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # user code may have replaced the stream
            stream.flush()


class WitWorld(wit_world.WitWorld):
    def run(self, code: str, inputs: bytes) -> wit_world.Outcome:
        global _session  # noqa: PLW0603 - the session's globals live as long as the instance
        options = json.loads(inputs)
        max_value = int(options.get("max-value", 1 << 20))
        if options.get("keep"):
            if _session is None:
                _session = _fresh_globals()
            scope = _session
        else:
            scope = _fresh_globals()
        seed = options.get("seed")
        generator = sys.modules.get("random")
        if isinstance(seed, str) and generator is not None and not options.get("keep"):
            # The host's entropy for this run (an instance the pool rewound holds the same
            # `random` state every time); not imported yet, it seeds itself when imported.
            generator.seed(int(seed, 16))
        scope.update(options.get("globals") or {})
        # The host has the source: tracebacks show the user's lines.
        linecache.cache[_FILENAME] = (len(code), None, code.splitlines(True), _FILENAME)
        try:
            value = _execute(code, scope)
        except SystemExit as exc:
            _flush()
            return _failure("exception", f"SystemExit: the code called exit({exc.code!r})")
        except ToolError as exc:
            _flush()
            return _failure("tool_error", str(exc), _user_traceback(exc))
        except MemoryError as exc:
            _flush()
            return _failure("out_of_memory", f"MemoryError: {exc}", _user_traceback(exc))
        except OverflowError as exc:
            _flush()
            text = str(exc)
            # On wasm32 a request for more than 2 GiB fails before allocating: still a memory
            # bomb, reported as one.
            kind = "out_of_memory" if any(s in text for s in _SIZE_OVERFLOW) else "exception"
            return _failure(kind, f"OverflowError: {text}", _user_traceback(exc))
        except BaseException as exc:  # noqa: BLE001 - every failure of user code is reported
            _flush()
            message = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            return _failure("exception", message, _user_traceback(exc))
        _flush()
        try:
            data = _dumps(value, "result")
        except (TypeError, ValueError, RecursionError) as exc:
            return _failure("exception", f"TypeError: {exc}")
        if len(data) > max_value:
            return _failure(
                "output_limit",
                f"the result is {len(data)} bytes of JSON, over the {max_value}-byte limit",
            )
        return wit_world.Outcome(ok=True, value=data, error_kind="", message="", traceback="")

    def reset(self) -> None:
        global _session  # noqa: PLW0603
        _session = None
