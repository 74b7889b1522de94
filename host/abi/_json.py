"""The typed JSON form of WIT values, for ``mty call ... ARG_JSON`` and its output.

record -> object; tuple and list -> array (``list<u8>`` also accepts ``{"base64": "..."}``);
variant -> ``{"case": payload}`` (``null`` payload for an empty case, and the bare string ``"case"``
is accepted); enum -> string; flags -> sorted array of strings; option -> ``null`` or the payload,
``{"some": inner}`` when the payload is itself an option; result -> ``{"ok": v}``/``{"err": e}``;
map -> array of ``[key, value]`` pairs (an object is accepted when the key type is ``string``);
char -> string; non-finite floats -> ``"NaN"``, ``"Infinity"``, ``"-Infinity"``. Resources have no
JSON form.
"""

from __future__ import annotations

import base64
import binascii
import math
import reprlib
from typing import Any, Final

from mighty._errors import ArgumentError, WrongType

from ._types import (
    INT_RANGES,
    BorrowType,
    EnumType,
    FlagsType,
    ListType,
    MapType,
    OptionType,
    OwnType,
    PrimitiveType,
    RecordType,
    ResultType,
    TupleType,
    VariantType,
    WitType,
)
from ._values import Err, Ok, Some, Variant

__all__ = ["from_json", "to_json"]

_NONFINITE: Final = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_repr = reprlib.Repr()
_repr.maxstring = 40
_repr.maxother = 40


def _fail(wt: WitType | str, obj: object, path: str, why: str = "") -> ArgumentError:
    where = f" at {path}" if path else ""
    got = "null" if obj is None else f"{type(obj).__name__} {_repr.repr(obj)}"
    why = f" ({why})" if why else ""
    return ArgumentError(f"expected {wt}{where}, got {got}{why}", path=path)


def from_json(wt: WitType, obj: Any, path: str = "") -> Any:  # noqa: PLR0915  # one dispatch per kind
    """The value of type ``wt`` for decoded JSON ``obj``; ``ArgumentError`` if it does not fit."""
    if isinstance(wt, PrimitiveType):
        return _prim_from_json(wt, obj, path)
    if isinstance(wt, ListType):
        if isinstance(wt.element, PrimitiveType) and wt.element.name == "u8":
            if isinstance(obj, dict) and set(obj) == {"base64"} and isinstance(obj["base64"], str):
                try:
                    return base64.b64decode(obj["base64"], validate=True)
                except binascii.Error as e:
                    raise _fail(wt, obj, path, f"bad base64: {e}") from None
            if not isinstance(obj, list):
                raise _fail(wt, obj, path)
            return bytes(from_json(wt.element, e, f"{path}[{i}]") for i, e in enumerate(obj))
        if not isinstance(obj, list):
            raise _fail(wt, obj, path)
        return [from_json(wt.element, e, f"{path}[{i}]") for i, e in enumerate(obj)]
    if isinstance(wt, RecordType):
        if not isinstance(obj, dict):
            raise _fail(wt, obj, path)
        names = [n for n, _ in wt.fields]
        for n in names:
            if n not in obj:
                raise ArgumentError(f"missing field {n!r} of {wt} at {path or '<root>'}", path=path)
        for k in obj:
            if k not in names:
                raise ArgumentError(
                    f"unknown field {k!r} for {wt} at {path or '<root>'}", path=path
                )
        return {n: from_json(t, obj[n], f"{path}.{n}") for n, t in wt.fields}
    if isinstance(wt, TupleType):
        if not isinstance(obj, list) or len(obj) != len(wt.elements):
            raise _fail(wt, obj, path)
        return tuple(
            from_json(t, e, f"{path}[{i}]")
            for i, (t, e) in enumerate(zip(wt.elements, obj, strict=True))
        )
    if isinstance(wt, VariantType):
        cases = dict(wt.cases)
        if isinstance(obj, str) and obj in cases and cases[obj] is None:
            return Variant(obj)
        if not isinstance(obj, dict) or len(obj) != 1:
            raise _fail(wt, obj, path, 'write {"case": payload}')
        ((case, payload),) = obj.items()
        if case not in cases:
            raise _fail(wt, obj, path, f"unknown case {case!r}")
        ty = cases[case]
        if ty is None:
            if payload is not None:
                raise _fail(wt, obj, path, f"case {case!r} has no payload")
            return Variant(case)
        return Variant(case, from_json(ty, payload, f"{path}.<{case}>"))
    if isinstance(wt, EnumType):
        if not isinstance(obj, str) or obj not in wt.names:
            raise _fail(wt, obj, path)
        return obj
    if isinstance(wt, FlagsType):
        if not isinstance(obj, list) or not all(isinstance(f, str) and f in wt.names for f in obj):
            raise _fail(wt, obj, path)
        return frozenset(obj)
    if isinstance(wt, OptionType):
        if obj is None:
            return None
        if isinstance(wt.payload, OptionType):
            if not isinstance(obj, dict) or set(obj) != {"some"}:
                raise _fail(wt, obj, path, 'a nested option\'s some case is {"some": inner}')
            return Some(from_json(wt.payload, obj["some"], f"{path}.<some>"))
        return from_json(wt.payload, obj, f"{path}.<some>")
    if isinstance(wt, ResultType):
        if not isinstance(obj, dict) or len(obj) != 1 or next(iter(obj)) not in ("ok", "err"):
            raise _fail(wt, obj, path, 'write {"ok": value} or {"err": value}')
        ((side, payload),) = obj.items()
        ty = wt.ok if side == "ok" else wt.err
        if ty is None:
            if payload is not None:
                raise _fail(wt, obj, path, f"the {side} case has no payload")
            inner = None
        else:
            inner = from_json(ty, payload, f"{path}.<{side}>")
        return Ok(inner) if side == "ok" else Err(inner)
    if isinstance(wt, MapType):
        if isinstance(obj, dict) and wt.key == PrimitiveType("string"):
            pairs: list[Any] = [[k, v] for k, v in obj.items()]
        elif isinstance(obj, list):
            pairs = obj
        else:
            raise _fail(wt, obj, path, "write [[key, value], ...]")
        out = {}
        for i, pair in enumerate(pairs):
            if not isinstance(pair, list) or len(pair) != 2:
                raise _fail("a [key, value] pair", pair, f"{path}[{i}]")
            out[from_json(wt.key, pair[0], f"{path}[{i}][0]")] = from_json(
                wt.value, pair[1], f"{path}[{i}][1]"
            )
        return out
    if isinstance(wt, (OwnType, BorrowType)):
        raise ArgumentError(
            f"a resource handle ({wt}) cannot be given as JSON at {path or '<root>'}", path=path
        )
    raise WrongType(f"unknown WIT type {wt!r}")


def _prim_from_json(wt: PrimitiveType, obj: Any, path: str) -> Any:
    name = wt.name
    if name == "bool":
        if not isinstance(obj, bool):
            raise _fail(wt, obj, path)
        return obj
    if name in INT_RANGES:
        lo, hi = INT_RANGES[name]
        if not isinstance(obj, int) or isinstance(obj, bool):
            raise _fail(wt, obj, path)
        if not lo <= obj <= hi:
            raise _fail(f"{name} ({lo}..={hi})", obj, path)
        return obj
    if name in ("f32", "f64"):
        if isinstance(obj, str) and obj in _NONFINITE:
            return _NONFINITE[obj]
        if isinstance(obj, bool) or not isinstance(obj, (int, float)):
            raise _fail(wt, obj, path, 'non-finite values are "NaN", "Infinity", "-Infinity"')
        return float(obj)
    if name == "char":
        if not isinstance(obj, str) or len(obj) != 1 or 0xD800 <= ord(obj) <= 0xDFFF:
            raise _fail(wt, obj, path, "a single Unicode scalar value")
        return obj
    if not isinstance(obj, str):
        raise _fail(wt, obj, path)
    try:
        obj.encode("utf-8")
    except UnicodeEncodeError:
        raise _fail(wt, obj, path, "contains a lone surrogate") from None
    return obj


def to_json(wt: WitType, value: Any) -> Any:
    """The JSON-encodable form of ``value`` (a lifted value of type ``wt``)."""
    if isinstance(wt, PrimitiveType):
        if wt.name in ("f32", "f64"):
            x = float(value)
            if math.isnan(x):
                return "NaN"
            if math.isinf(x):
                return "Infinity" if x > 0 else "-Infinity"
            return x
        return value
    if isinstance(wt, ListType):
        if isinstance(value, (bytes, bytearray, memoryview)):
            return list(bytes(value))
        return [to_json(wt.element, e) for e in value]
    if isinstance(wt, RecordType):
        return {n: to_json(t, value[n]) for n, t in wt.fields}
    if isinstance(wt, TupleType):
        return [to_json(t, e) for t, e in zip(wt.elements, value, strict=True)]
    if isinstance(wt, VariantType):
        ty = dict(wt.cases)[value.case]
        return {value.case: None if ty is None else to_json(ty, value.value)}
    if isinstance(wt, EnumType):
        return value
    if isinstance(wt, FlagsType):
        return sorted(value)
    if isinstance(wt, OptionType):
        if value is None:
            return None
        if isinstance(wt.payload, OptionType):
            return {"some": to_json(wt.payload, value.value)}
        return to_json(wt.payload, value.value if isinstance(value, Some) else value)
    if isinstance(wt, ResultType):
        side, ty = ("ok", wt.ok) if isinstance(value, Ok) else ("err", wt.err)
        return {side: None if ty is None else to_json(ty, value.value)}
    if isinstance(wt, MapType):
        return [[to_json(wt.key, k), to_json(wt.value, v)] for k, v in value.items()]
    if isinstance(wt, (OwnType, BorrowType)):
        raise ArgumentError(f"a resource handle ({wt}) has no JSON form")
    raise WrongType(f"unknown WIT type {wt!r}")
