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


def _dumps(value: object, what: str) -> bytes:
    _check_json(value, what, 0, set())
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


# -- tools ----------------------------------------------------------------------------------

_tool_specs: list[dict[str, object]] | None = None


def _call_tool(name: str, args: list[object], kwargs: dict[str, object]) -> object:
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
    try:
        answer = tools.call(name, payload)
    except Err as failure:
        error = failure.value
        raise ToolError(name, error.kind, error.message) from None
    return json.loads(answer)


def _stub(spec: dict[str, object]) -> object:
    """A Python function with the tool's real signature that calls the host."""
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
    source = (
        f"def {name}({', '.join(pieces)}):\n    return _invoke({name!r}, [{', '.join(collect)}])\n"
    )
    scope: dict[str, object] = {"_MISSING": _MISSING, "_invoke": _invoke}
    exec(compile(source, f"<tool {name}>", "exec"), scope)  # noqa: S102 - names were checked
    func = scope[name]
    func.__doc__ = str(spec.get("doc") or "")  # type: ignore[attr-defined]
    func.__module__ = "tools"  # type: ignore[attr-defined]
    return func


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
    return _call_tool(name, args, kwargs)


def _tools() -> dict[str, object]:
    global _tool_specs  # noqa: PLW0603 - the tool list is fixed for the life of the instance
    if _tool_specs is None:
        _tool_specs = json.loads(tools.list_tools())
    return {str(spec["name"]): _stub(spec) for spec in _tool_specs}


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
    """Run ``code`` in ``scope``; return ``result`` if it set one, else its last expression."""
    tree = ast.parse(code, _FILENAME, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, _FILENAME, "exec"), scope)  # noqa: S102 - running code is the job
    value = eval(compile(last, _FILENAME, "eval"), scope) if last is not None else None  # noqa: S307
    if "result" in scope:
        return scope["result"]
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
