"""The trace writer's fast encoder: a value straight to CBOR bytes, in one pass.

``emit(value)`` gives exactly the bytes ``cbor2.dumps(encode_with(value, hook))`` gives (the
reference path in ``_values.py``), for every value that path accepts, so files written either
way are the same format and read by the same closed decoder; the hypothesis tests in
``tests/trace/test_emit.py`` hold the two to that, byte for byte. For a value the reference
refuses, ``emit`` raises :class:`Refused` and the writer runs the reference path, which raises
the ``TraceError`` naming the culprit: errors are described in one place.

Why not cbor2's encoder on the values themselves (with ``encoders=`` for mighty's types):
measured on the print path's import record, ``encode_with`` + ``cbor2.dumps`` took 6.6 us and a
persistent ``CBOREncoder`` with hooks for ``HandleRef`` and ``Ok`` 4.4 us (each container costs
it ~0.25 us, each tag ~0.45 us), and it cannot be made safe on its own: it encodes subclasses
of ``int``, ``str``, ``dict`` and ``list`` natively, bypassing any hook (so it cannot refuse
them or count depth), encodes ``datetime``/``Decimal``/``set`` with tags our reader refuses,
and crashes the interpreter (segfault) on a list nested 100,000 deep. A checking walk has to
come first anyway; emitting the bytes during that walk costs less than building the tagged
data for cbor2 to walk again.

Speed: the byte strings for small headers, for short text (keys, interface and function
names, case names) and for resource handles are computed once and looked up after.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from typing import Any

from mighty.abi import Err, Ok, Some, Variant
from mighty.gate import Handle
from mighty.trace._values import (
    MAX_BIGINT_BYTES,
    MAX_DEPTH,
    TAG_BIGINT,
    TAG_BLOB,
    TAG_ERR,
    TAG_FLOAT,
    TAG_FROZENSET,
    TAG_HANDLE,
    TAG_MAP,
    TAG_OK,
    TAG_SOME,
    TAG_TUPLE,
    TAG_VARIANT,
    HandleRef,
    _check_hashed,
)

__all__ = [
    "ARRAY_HEADS",
    "BYTES_HEADS",
    "UINTS",
    "BlobSink",
    "Refused",
    "canonical_record",
    "emit",
    "emit_args",
    "emit_into",
    "emit_item",
    "emit_result",
    "emit_simple",
    "head",
    "text",
    "uint",
]

_CBOR_INT_MAX = 2**64 - 1
_DOUBLE = struct.Struct(">d")


class Refused(Exception):
    """The value is not one the reference encoder accepts (it will say why)."""


_B1, _B2, _B4, _B8 = (struct.Struct(f">B{c}").pack for c in "BHIQ")


def head(major: int, n: int) -> bytes:
    """The CBOR item head of major type ``major`` with argument ``n`` (minimal length)."""
    m = major << 5
    if n < 24:
        return bytes((m | n,))
    if n < 0x100:
        return _B1(m | 24, n)
    if n < 0x10000:
        return _B2(m | 25, n)
    if n < 0x100000000:
        return _B4(m | 26, n)
    return _B8(m | 27, n)


_UINT = [head(0, n) for n in range(256)]
_NINT = [head(1, n) for n in range(256)]
_ARRAY = [head(4, n) for n in range(32)]
_BYTES = [head(2, n) for n in range(256)]
_MAP = [head(5, n) for n in range(32)]
_T_TUPLE = head(6, TAG_TUPLE)
_T_SET = head(6, TAG_FROZENSET)
_T_OK = head(6, TAG_OK)
_T_ERR = head(6, TAG_ERR)
_T_VARIANT = head(6, TAG_VARIANT) + _ARRAY[2]
_T_SOME = head(6, TAG_SOME)
_T_HANDLE = head(6, TAG_HANDLE) + _ARRAY[3]
_T_FLOAT = head(6, TAG_FLOAT) + head(2, 8)
_T_MAP = head(6, TAG_MAP)
_T_BIGINT = head(6, TAG_BIGINT)
_T_BLOB = head(6, TAG_BLOB) + head(2, 32)
_NONE, _FALSE, _TRUE = b"\xf6", b"\xf4", b"\xf5"


def uint(n: int) -> bytes:
    """An int in the CBOR range as CBOR (what ``cbor2.dumps(n)`` gives)."""
    if n >= 0:
        if n < 256:
            return _UINT[n]
        if n < 0x10000:
            return _B2(25, n)
        if n < 0x100000000:
            return _B4(26, n)
        return _B8(27, n)
    if n >= -256:
        return _NINT[-1 - n]
    return head(1, -1 - n)


_TEXT: dict[str, bytes] = {}
_TEXT_CACHE_MAX = 8192
_TEXT_CACHED_LEN = 64


def text(s: str) -> bytes:
    """A str as CBOR text (``UnicodeEncodeError`` for a lone surrogate, as cbor2 raises)."""
    data = _TEXT.get(s)
    if data is not None:
        return data
    raw = s.encode("utf-8")
    data = head(3, len(raw)) + raw
    if len(s) <= _TEXT_CACHED_LEN:
        if len(_TEXT) >= _TEXT_CACHE_MAX:
            _TEXT.clear()
        _TEXT[s] = data
    return data


def _array_head(n: int) -> bytes:
    return _ARRAY[n] if n < 32 else head(4, n)


_HANDLES: dict[tuple[str, str, int], bytes] = {}


def _handle(interface: str, name: str, rep: int) -> bytes:
    key = (interface, name, rep)
    data = _HANDLES.get(key)
    if data is None:
        data = _T_HANDLE + text(interface) + text(name) + uint(rep)
        if len(_HANDLES) >= _TEXT_CACHE_MAX:
            _HANDLES.clear()
        _HANDLES[key] = data
    return data


class BlobSink:
    """Where byte strings of ``blob_min`` bytes or more go: ``pending`` (new ones, by sha256),
    replaced in the record by a reference; ``known`` holds the digests already written."""

    __slots__ = ("blob_min", "known", "pending")

    def __init__(self, blob_min: int, known: set[bytes]) -> None:
        self.blob_min = blob_min
        self.known = known
        self.pending: dict[bytes, bytes] = {}

    def ref(self, data: bytes) -> bytes:
        digest = hashlib.sha256(data).digest()
        if digest not in self.known:
            self.pending[digest] = data
        return _T_BLOB + digest


_HANDLES_ON = 1
_CANONICAL = 2
_T_OK_NONE = _T_OK + _NONE
ARRAY_HEADS, BYTES_HEADS, UINTS = _ARRAY, _BYTES, _UINT
"""The CBOR heads of arrays of up to 31 items and byte strings of up to 255 bytes, and the
CBOR of the ints 0-255."""


def _simple_list(value: list[Any], blob_min: int) -> bytes | None:
    """A flat list of simple items (``_simple_item``), or None when one is not."""
    parts = [_array_head(len(value))]
    for item in value:
        part = _simple_item(item, blob_min)
        if part is None:
            return None
        parts.append(part)
    return b"".join(parts)


def emit_simple(value: Any, blob_min: int) -> bytes | None:
    """``emit(value, blobs, handles=True)`` for a value one level deep in a record (an import
    record's args or result) when it has one of the shapes such values mostly have: a flat list
    of, or an ``Ok`` of, or just one of: a gate Handle, a ``bytes`` shorter than ``blob_min``,
    an int in the CBOR range, a str, None, a bool. Anything else is None, and the caller takes
    the general path: this one only skips the walk's dispatch, never decides anything."""
    t = type(value)
    if t is list:
        return _simple_list(value, blob_min)
    if t is Ok:
        inner = value.value
        if inner is None:
            return _T_OK_NONE
        part = _simple_item(inner, blob_min)
        return None if part is None else _T_OK + part
    if t is dict:
        return _simple_map(value, blob_min)
    return _simple_item(value, blob_min)


_T_OK_UINT = [_T_OK + h for h in _UINT]


def emit_result(value: Any, blob_min: int) -> bytes | None:
    """``emit_simple(value, blob_min)`` with the commonest results first: ``Ok`` of nothing or
    of an int, an int (a clock's instant), ``bytes`` (random bytes, a read)."""
    t = type(value)
    if t is Ok:
        inner = value.value
        if inner is None:
            return _T_OK_NONE
        if type(inner) is int and 0 <= inner <= _CBOR_INT_MAX:
            return _T_OK_UINT[inner] if inner < 256 else _T_OK + uint(inner)
    elif t is int:
        if 0 <= value <= _CBOR_INT_MAX:
            return _UINT[value] if value < 256 else uint(value)
    elif t is bytes:
        n = len(value)
        if n < blob_min:
            data: bytes = value
            return (_BYTES[n] if n < 256 else head(2, n)) + data
        return None
    return emit_simple(value, blob_min)


def _simple_map(value: dict[Any, Any], blob_min: int) -> bytes | None:
    """A map of text keys to simple items (a WIT record: a clock's datetime), in its order."""
    n = len(value)
    parts = [_MAP[n] if n < 32 else head(5, n)]
    for key, item in value.items():
        if type(key) is not str:
            return None
        name = _TEXT.get(key)
        if name is None:
            try:
                name = text(key)
            except UnicodeEncodeError:
                return None
        part = _simple_item(item, blob_min)
        if part is None:
            return None
        parts.append(name)
        parts.append(part)
    return b"".join(parts)


# Each resource kind's handles as CBOR, by rep: the kind by its id, with the kind kept to
# check that the id is still that kind's (a dict keyed by the kind itself would hash the
# dataclass's fields every time).
_KIND_HANDLES: dict[int, tuple[Any, dict[int, bytes]]] = {}


def emit_args(args: Sequence[Any], blob_min: int) -> bytes | None:
    """``emit_simple(args, blob_min)`` for an import's argument list, one call for the one or
    two arguments most imports take (a stream and its bytes; a descriptor; a length)."""
    if type(args) is not list:
        return None  # a tuple is tagged: the general path
    n = len(args)
    if n == 0:
        return _ARRAY[0]
    if n > 2:
        return emit_simple(args, blob_min)
    out = _ARRAY[n]
    for v in args:
        t = type(v)
        part: bytes | None
        if t is Handle:
            kind = v.kind
            known = _KIND_HANDLES.get(id(kind))
            if known is None or known[0] is not kind:
                if len(_KIND_HANDLES) >= 256:
                    _KIND_HANDLES.clear()
                known = _KIND_HANDLES[id(kind)] = (kind, {})
            reps = known[1]
            part = reps.get(v.rep)
            if part is None:
                part = _simple_item(v, blob_min)
                if part is not None and len(reps) < _TEXT_CACHE_MAX:
                    reps[v.rep] = part
        elif t is bytes:
            size = len(v)
            if size >= blob_min:
                return None
            part = (_BYTES[size] if size < 256 else head(2, size)) + v
        elif t is int and 0 <= v < 256:
            part = _UINT[v]
        else:
            part = _simple_item(v, blob_min)
        if part is None:
            return None
        out += part
    return out


def _simple_item(v: Any, blob_min: int) -> bytes | None:
    """``emit(v, blobs, handles=True)`` one level deep in a record for a gate Handle, a
    HandleRef, a ``bytes`` shorter than ``blob_min``, an int in the CBOR range, a str, None or
    a bool; None for anything else."""
    t = type(v)
    if t is Handle:
        rep = v.rep
        if type(rep) is int and 0 <= rep <= _CBOR_INT_MAX:
            return _handle(v.kind.interface, v.kind.name, rep)
        return None
    if t is HandleRef:
        rep, interface, name = v.rep, v.interface, v.name
        if (
            type(rep) is int
            and 0 <= rep <= _CBOR_INT_MAX
            and type(interface) is str
            and type(name) is str
        ):
            return _handle(interface, name, rep)
        return None
    if t is bytes:
        n = len(v)
        if n >= blob_min:
            return None
        data: bytes = v
        return (_BYTES[n] if n < 256 else head(2, n)) + data
    if t is int:
        number: int = v
        if 0 <= number < 256:
            return _UINT[number]
        if -(2**64) <= number <= _CBOR_INT_MAX:
            return uint(number)
        return None
    if t is str:
        try:
            return text(v)
        except UnicodeEncodeError:
            return None
    if v is None:
        return _NONE
    if t is bool:
        return _TRUE if v else _FALSE
    return None


emit_item = _simple_item


def emit(
    value: Any, blobs: BlobSink | None = None, *, handles: bool = False, canonical: bool = False
) -> bytes:
    """``value`` as CBOR; ``handles`` also takes gate :class:`Handle` objects where
    ``to_refs`` would turn them into :class:`HandleRef` (not in set items or map keys);
    ``canonical`` gives what ``cbor2.dumps(encode_value(value), canonical=True)`` gives (maps
    with their keys in canonical order), which replay digests."""
    out: list[bytes] = []
    try:
        _emit(
            value, 0, blobs, (_HANDLES_ON if handles else 0) | (_CANONICAL if canonical else 0), out
        )
    except (RecursionError, UnicodeEncodeError, TypeError, ValueError, OverflowError) as exc:
        raise Refused(str(exc)) from None
    return b"".join(out)


def emit_into(
    value: Any, depth: int, blobs: BlobSink | None, handles: bool, out: list[bytes]
) -> None:
    """``emit`` appending to ``out``, for a value sitting ``depth`` levels deep in a record."""
    try:
        _emit(value, depth, blobs, handles, out)
    except (RecursionError, UnicodeEncodeError, TypeError, ValueError, OverflowError) as exc:
        raise Refused(str(exc)) from None


def _emit(v: Any, depth: int, blobs: BlobSink | None, handles: int, out: list[bytes]) -> None:  # noqa: PLR0915 - one dispatch on type, as _values._encode
    # Mirrors _values._encode case for case: the same depth counted at the same places.
    t = type(v)
    if t is str:
        out.append(text(v))
        return
    if t is int:
        if 0 <= v < 256:
            out.append(_UINT[v])
            return
        if -(2**64) <= v <= _CBOR_INT_MAX:
            out.append(uint(v))
            return
        if depth >= MAX_DEPTH:
            raise Refused("too deep")
        size = (v.bit_length() + 8) // 8
        if size > MAX_BIGINT_BYTES:
            raise Refused("int too big")
        out.append(_T_BIGINT + head(2, size) + v.to_bytes(size, "big", signed=True))
        return
    if v is None:
        out.append(_NONE)
        return
    if t is bool:
        out.append(_TRUE if v else _FALSE)
        return
    if t is bytes or t is bytearray or t is memoryview:
        data = v if t is bytes else bytes(v)
        if blobs is not None and len(data) >= blobs.blob_min and depth < MAX_DEPTH:
            out.append(blobs.ref(data))
        else:
            n = len(data)
            out.append(_BYTES[n] if n < 256 else head(2, n))
            out.append(data)
        return
    if depth >= MAX_DEPTH:
        raise Refused("too deep")
    if t is float:
        out.append(_T_FLOAT + _DOUBLE.pack(v))
        return
    if t is list:
        out.append(_array_head(len(v)))
        for item in v:
            _emit(item, depth + 1, blobs, handles, out)
        return
    if t is dict:
        _emit_dict(v, depth, blobs, handles, out)
        return
    if t is Handle and handles & _HANDLES_ON:
        _emit_handle(v.kind.interface, v.kind.name, v.rep, depth, blobs, out)
        return
    if t is tuple:
        out.append(_T_TUPLE)
        out.append(_array_head(len(v)))
        for item in v:
            _emit(item, depth + 2, blobs, handles, out)
        return
    if t is Ok or t is Err or t is Some:
        out.append(_T_OK if t is Ok else _T_ERR if t is Err else _T_SOME)
        _emit(v.value, depth + 1, blobs, handles, out)
        return
    if t is Variant:
        if type(v.case) is not str:
            raise Refused("variant case")
        out.append(_T_VARIANT)
        out.append(text(v.case))
        _emit(v.value, depth + 2, blobs, handles, out)
        return
    if t is HandleRef:
        _emit_handle(v.interface, v.name, v.rep, depth, blobs, out)
        return
    if t is frozenset or t is set:
        items = list(v)
        _check_hashed(items, "a set")
        parts = []
        for item in items:
            part: list[bytes] = []
            _emit(item, depth + 2, blobs, handles & _CANONICAL, part)
            parts.append(b"".join(part))
        parts.sort()
        out.append(_T_SET)
        out.append(_array_head(len(parts)))
        out.extend(parts)
        return
    raise Refused(f"a {t.__qualname__}")


def _emit_handle(
    interface: str, name: str, rep: Any, depth: int, blobs: BlobSink | None, out: list[bytes]
) -> None:
    if type(rep) is int and 0 <= rep <= _CBOR_INT_MAX:
        out.append(_handle(interface, name, rep))
        return
    if type(interface) is not str or type(name) is not str or type(rep) is not int:
        raise Refused("a handle must be (str, str, int)")
    out.append(_T_HANDLE + text(interface) + text(name))
    _emit(rep, depth + 2, blobs, 0, out)


def _emit_dict(
    v: dict[Any, Any], depth: int, blobs: BlobSink | None, handles: int, out: list[bytes]
) -> None:
    for k in v:
        if type(k) is not str:
            _emit_flat(v, depth, blobs, handles, out)
            return
    n = len(v)
    out.append(_MAP[n] if n < 32 else head(5, n))
    if handles & _CANONICAL and n > 1:
        # cbor2's canonical order: by the encoded key, shorter first.
        for key, item in sorted(((text(k), x) for k, x in v.items()), key=_canonical_key):
            out.append(key)
            _emit(item, depth + 1, blobs, handles, out)
        return
    for k, item in v.items():
        out.append(text(k))
        _emit(item, depth + 1, blobs, handles, out)


def _canonical_key(pair: tuple[bytes, Any]) -> tuple[int, bytes]:
    return len(pair[0]), pair[0]


def _emit_flat(
    v: dict[Any, Any], depth: int, blobs: BlobSink | None, handles: int, out: list[bytes]
) -> None:
    _check_hashed(list(v), "a map")
    out.append(_T_MAP)
    out.append(_array_head(2 * len(v)))
    for k, item in v.items():
        _emit(k, depth + 2, blobs, handles & _CANONICAL, out)
        _emit(item, depth + 2, blobs, handles, out)


_ORDERS: dict[tuple[tuple[str, ...], str], tuple[bytes, list[tuple[bytes, str]]]] = {}
_NO_BLOBS = 1 << 62


def canonical_record(record: dict[str, Any], skip: str) -> bytes | None:
    """``emit({k: v for k, v in record.items() if k != skip}, canonical=True)`` for a record of
    text keys whose values ``emit_simple`` takes (the replayer digests every import record),
    else None. Simple values hold no map, so only the record's own keys need ordering; the
    order of one set of keys is worked out once."""
    keys = tuple(record)
    known = _ORDERS.get((keys, skip))
    if known is None:
        if not all(type(k) is str for k in keys):
            return None
        try:
            order = sorted(((text(k), k) for k in keys if k != skip), key=_canonical_key)
        except UnicodeEncodeError:
            return None
        n = len(order)
        if len(_ORDERS) >= 256:
            _ORDERS.clear()
        known = _ORDERS[(keys, skip)] = (_MAP[n] if n < 32 else head(5, n), order)
    map_head, order = known
    parts = [map_head]
    append = parts.append
    for key, name in order:
        value = record[name]
        t = type(value)
        # The commonest fields inline (text and small ints), the rest as _canonical_simple says.
        if t is str:
            part: bytes | None = _TEXT.get(value)
            if part is None:
                part = _simple_item(value, _NO_BLOBS)
        elif t is int and 0 <= value < 256:
            part = _UINT[value]
        else:
            part = _canonical_simple(value)
        if part is None:
            return None
        append(key)
        append(part)
    return b"".join(parts)


_T_OF = {Ok: _T_OK, Err: _T_ERR, Some: _T_SOME}
_DICT_ORDERS: dict[tuple[str, ...], list[tuple[bytes, str]]] = {}


def _canonical_simple(value: Any) -> bytes | None:
    """``emit(value, canonical=True)`` for a value one level deep in a record when it is a
    simple item (``_simple_item``), a flat list of them, an ``Ok``/``Err``/``Some`` of one, or a
    map of text keys to them (a WIT record such as a clock's datetime); else None."""
    t = type(value)
    if t is list:
        return _simple_list(value, _NO_BLOBS)
    tag = _T_OF.get(t)
    if tag is not None:
        inner = value.value
        if inner is None:
            return tag + _NONE
        part = _simple_item(inner, _NO_BLOBS)
        return None if part is None else tag + part
    if t is dict:
        keys = tuple(value)
        order = _DICT_ORDERS.get(keys)
        if order is None:
            if not all(type(k) is str for k in keys):
                return None
            try:
                order = sorted(((text(k), k) for k in keys), key=_canonical_key)
            except UnicodeEncodeError:
                return None
            if len(_DICT_ORDERS) >= 256:
                _DICT_ORDERS.clear()
            _DICT_ORDERS[keys] = order
        n = len(order)
        parts = [_MAP[n] if n < 32 else head(5, n)]
        for key, name in order:
            part = _simple_item(value[name], _NO_BLOBS)
            if part is None:
                return None
            parts.append(key)
            parts.append(part)
        return b"".join(parts)
    return _simple_item(value, _NO_BLOBS)
