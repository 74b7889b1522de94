"""Data crossing the sandbox's boundary, bounded before it is built: JSON encoded by our own
:func:`encode_json` (size-capped, finite floats, valid Unicode, no generators, at most
``MAX_DEPTH`` deep), texts cut by :func:`cut_text`, and :func:`json_problem` saying why
decoded JSON is not JSON data.

Used by tool calls (``_tools.py``), run results (``_results.py``), the pool and the MCP server.
Rejected: ``pydantic_core.to_jsonable_python`` on a whole result (it drains an endless generator
into memory, outside any timeout; see ``_tools.py``).
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import json
import math
import re
from typing import Any

import pydantic
import pydantic_core

__all__ = ["MAX_DEPTH", "NotData", "cut_text", "encode_json", "json_problem"]
MAX_DEPTH = 100
"""Deepest nesting of lists and objects accepted in tool arguments and results."""
_SURROGATE = re.compile("[\ud800-\udfff]")


def cut_text(text: str, limit: int) -> str:
    """``text`` as valid Unicode (lone surrogates become ``?``) of at most ``limit`` UTF-8
    bytes; when cut, a short note with the full length in characters is appended.

    Never encodes more than ``limit + 1`` characters of ``text``, however long it is.
    """
    head = text[: limit + 1]
    data = head.encode("utf-8", "replace")
    if len(head) == len(text) and len(data) <= limit:
        return text if len(data) == len(text) and text.isascii() else data.decode("utf-8")
    note = f" [... cut: {len(text)} characters in all]"
    room = max(0, limit - len(note))
    return data[:room].decode("utf-8", "ignore") + note


def _safe_text(value: object, limit: int) -> str:
    """``str(value)`` cut to ``limit``; a ``__str__`` that fails is reported, not raised."""
    try:
        text = value if isinstance(value, str) else str(value)
    except BaseException as exc:  # noqa: BLE001 - a hostile __str__ must not escape
        text = f"<unprintable {type(exc).__name__}>"
    if not isinstance(text, str):  # a str subclass's __str__ may return anything
        text = "<unprintable>"
    return cut_text(text, limit)


def json_problem(value: Any, what: str = "the value") -> str | None:
    """Why decoded JSON ``value`` is not JSON data (a non-finite float, a lone surrogate in a
    string or key), or None when it is. Iterative: any depth ``json.loads`` produced is fine."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return f"{what} contains a string with a lone surrogate (not valid Unicode)"
        elif isinstance(item, float):
            if not math.isfinite(item):
                return f"{what} contains the number {item!r}, which JSON cannot represent"
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
        elif isinstance(item, dict):
            for key, v in item.items():
                stack.append((key, depth + 1))
                stack.append((v, depth + 1))
        elif item is not None and not isinstance(item, bool | int):
            return f"{what} contains a {type(item).__name__}, which is not JSON data"
    return None


class NotData(ValueError):
    """A value :func:`encode_json` refused: not JSON data, or over its size limit."""

    def __init__(self, message: str, *, too_large: bool = False) -> None:
        super().__init__(message)
        self.too_large = too_large


def encode_json(value: Any, limit: int, what: str = "the value") -> bytes:
    """Compact JSON of ``value`` (what ``to_jsonable_python`` would make of it), building at
    most ``limit`` bytes: raises :class:`NotData` as soon as the output would pass ``limit``,
    for a generator or iterator anywhere (never drained), a non-finite float, a lone
    surrogate, a non-string key that JSON cannot convert, or nesting deeper than MAX_DEPTH."""
    encoder = _Encoder(limit, what)
    encoder.add(value, what, 0)
    return "".join(encoder.parts).encode("utf-8")


_ESCAPE = json.encoder.encode_basestring_ascii


class _Encoder:
    __slots__ = ("limit", "parts", "size", "what")

    def __init__(self, limit: int, what: str) -> None:
        self.limit = limit
        self.what = what
        self.parts: list[str] = []
        self.size = 0

    def emit(self, text: str) -> None:
        self.size += len(text)
        if self.size > self.limit:
            raise NotData(f"{self.what} is more than {self.limit} bytes of JSON", too_large=True)
        self.parts.append(text)

    def string(self, text: str, path: str) -> None:
        if len(text) > self.limit - self.size:  # nothing built: the length alone is too much
            raise NotData(f"{self.what} is more than {self.limit} bytes of JSON", too_large=True)
        if _SURROGATE.search(text):
            raise NotData(f"{path} contains a lone surrogate (not valid Unicode)")
        self.emit(_ESCAPE(text))

    def add(self, value: Any, path: str, depth: int) -> None:
        if value is None:
            self.emit("null")
        elif value is True:
            self.emit("true")
        elif value is False:
            self.emit("false")
        elif isinstance(value, str):
            self.string(value, path)
        elif isinstance(value, int):
            try:
                digits = int.__repr__(value)
            except ValueError:  # more digits than int -> str allows
                raise NotData(f"{path} is an integer too large to write") from None
            self.emit(digits)
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise NotData(f"{path} is {value!r}, which JSON cannot represent")
            self.emit(float.__repr__(value))
        elif depth >= MAX_DEPTH:
            raise NotData(f"{path} is nested deeper than {MAX_DEPTH} levels")
        elif isinstance(value, list | tuple | set | frozenset | collections.deque):
            self.emit("[")
            for index, item in enumerate(value):
                if index:
                    self.emit(",")
                self.add(item, f"{path}[{index}]", depth + 1)
            self.emit("]")
        elif isinstance(value, dict):
            self.emit("{")
            for index, (key, item) in enumerate(value.items()):
                if index:
                    self.emit(",")
                self.string(self.key(key, path), path)
                self.emit(":")
                self.add(item, f"{path}[{_short(key)}]", depth + 1)
            self.emit("}")
        elif _is_lazy(value):
            raise NotData(
                f"{path} is a {type(value).__name__} (an iterator or awaitable); return a list"
            )
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
            self.add(fields, path, depth + 1)
        elif isinstance(value, pydantic.BaseModel):
            # Python mode keeps iterators lazy (SerializationIterator), for the check above.
            self.add(value.model_dump(mode="python", by_alias=True), path, depth + 1)
        else:
            try:
                plain = pydantic_core.to_jsonable_python(value)
            except (pydantic_core.PydanticSerializationError, TypeError, ValueError) as exc:
                raise NotData(
                    f"{path} is a {type(value).__name__}, which is not JSON data: "
                    f"{_safe_text(exc, 200)}"
                ) from None
            if plain is value or type(plain) is type(value):
                raise NotData(f"{path} is a {type(value).__name__}, which is not JSON data")
            self.add(plain, path, depth + 1)

    def key(self, key: Any, path: str) -> str:
        # As json.dumps converts them.
        if isinstance(key, str):
            return key
        if key is None or isinstance(key, bool):
            return {None: "null", True: "true", False: "false"}[key]
        if isinstance(key, int):
            return int.__repr__(key)
        if isinstance(key, float) and math.isfinite(key):
            return float.__repr__(key)
        raise NotData(f"{path} has a key of type {type(key).__name__}; JSON keys are strings")


def _short(key: object) -> str:
    return repr(key) if isinstance(key, str) and len(key) <= 40 else f"<{type(key).__name__}>"


def _is_lazy(value: object) -> bool:
    return hasattr(value, "__next__") or hasattr(value, "__anext__") or inspect.isawaitable(value)
