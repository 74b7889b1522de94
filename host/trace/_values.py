"""mighty's Python values <-> CBOR-able data, losslessly and closed.

``encode_value`` turns a value into plain data (``None``, ``bool``, ``int``, ``str``, ``bytes``,
``list``, ``dict`` with ``str`` keys) plus ``cbor2.CBORTag`` for everything CBOR cannot say by
itself; ``decode_value`` reverses it exactly. Anything else is refused with a ``TraceError`` that
names the type and where it sits (``args[1].cfg``).

Tags (one private range, 27000-27099; not IANA-registered, which does not matter because a trace
is only ever read by the closed decoder in this package, after its magic has identified it):

| tag   | Python                          | content                                         |
|-------|---------------------------------|-------------------------------------------------|
| 27000 | ``tuple``                       | array of the items                              |
| 27001 | ``frozenset`` (``set`` too)     | array of the items, sorted by their CBOR bytes  |
| 27002 | ``Ok(v)``                       | ``v``                                           |
| 27003 | ``Err(v)``                      | ``v``                                           |
| 27004 | ``Variant(case, v)``            | ``[case, v]``                                   |
| 27005 | ``Some(v)``                     | ``v``                                           |
| 27006 | ``HandleRef(interface, name, rep)`` | ``[interface, name, rep]``                  |
| 27007 | ``float``                       | 8 bytes, IEEE 754 binary64, big-endian          |
| 27008 | ``dict`` with a non-``str`` key | flat array ``[k0, v0, k1, v1, ...]``            |
| 27009 | (format layer) blob reference   | 32-byte sha256 of a blob frame's data           |
| 27010 | ``int`` outside -2**64..2**64-1 | two's-complement big-endian bytes, minimal      |

Floats are bytes so that NaN payloads, signalling NaNs and ``-0.0`` survive bit for bit whatever
a CBOR library does with native floats. A ``dict`` whose keys are all ``str`` (a record) stays a
CBOR map; one with any other key (a WIT ``map``) keeps its insertion order in the flat array.
A ``set`` decodes as ``frozenset`` (what ``mighty.abi`` lifts flags to); ``bytearray`` and
``memoryview`` decode as ``bytes``. Subclasses of the built-in types are refused rather than
silently flattened.

Nesting is capped at ``MAX_DEPTH`` CBOR levels (each array, map and tag is one level) both ways,
so everything the writer accepts the reader can read. So are big integers (``MAX_BIGINT_BYTES``:
a 24,000-digit int could not even be printed in an error message, Python's int->str limit is
4300 digits).

Hostile input (issue 11): sets and non-``str``-keyed maps are hash containers, and ``int``
hashes are not randomised (``n`` and ``n + 2**61 - 1`` collide), so 40k colliding big ints made
one ``frozenset`` quadratic (17 s for an 879 KB file). The decoder counts the items that share a
hash before it builds the container and refuses more than ``MAX_COLLISIONS`` of them; with that,
building one costs at most ``MAX_COLLISIONS`` comparisons per item. ``str`` and ``bytes`` hash
with a per-process key, so CBOR maps (text keys) need no such check. Rejected: requiring the
encoder's canonical order on read (needs each item's bytes kept beside it; the collision count
is enough and cheaper).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cbor2

from mighty._errors import WrongType
from mighty.abi import Err, Ok, Some, Variant
from mighty.trace._errors import TraceError

__all__ = [
    "MAX_BIGINT_BYTES",
    "MAX_COLLISIONS",
    "MAX_DEPTH",
    "MAX_HASHED",
    "TAG_BIGINT",
    "TAG_BLOB",
    "TAG_ERR",
    "TAG_FLOAT",
    "TAG_FROZENSET",
    "TAG_HANDLE",
    "TAG_MAP",
    "TAG_OK",
    "TAG_SOME",
    "TAG_TUPLE",
    "TAG_VARIANT",
    "HandleRef",
    "decode_value",
    "encode_value",
    "handle_ref",
    "value_from_tag",
]

TAG_TUPLE = 27000
TAG_FROZENSET = 27001
TAG_OK = 27002
TAG_ERR = 27003
TAG_VARIANT = 27004
TAG_SOME = 27005
TAG_HANDLE = 27006
TAG_FLOAT = 27007
TAG_MAP = 27008
TAG_BLOB = 27009
TAG_BIGINT = 27010

MAX_DEPTH = 128
"""Deepest nesting, in CBOR containers (array, map, tag), that a trace will write or read."""
MAX_BIGINT_BYTES = 1024
"""Longest big integer (tag 27010) a trace will write or read: 8192 bits, 2466 digits."""
MAX_HASHED = 1 << 18
"""Most items in one set, or pairs in one non-``str``-keyed map, that a trace will read."""
MAX_COLLISIONS = 16
"""Most items of one set (or keys of one map) with the same Python hash that a trace will read."""

_CBOR_INT_MIN = -(2**64)
_CBOR_INT_MAX = 2**64 - 1
_DOUBLE = struct.Struct(">d")

_KNOWN = (
    "None, bool, int, float, str, bytes, list, tuple, dict, set/frozenset, "
    "Ok, Err, Variant, Some and HandleRef"
)


@dataclass(frozen=True, slots=True)
class HandleRef:
    """A resource handle as a trace records it: its resource type and the host's ``rep``.

    The recorder turns a gate ``Handle`` into one; replay maps ``rep`` back to a live object.
    """

    interface: str
    name: str
    rep: int

    def __post_init__(self) -> None:
        if type(self.interface) is not str or type(self.name) is not str:
            raise WrongType("HandleRef interface and name must be str")
        if type(self.rep) is not int:
            raise WrongType(f"HandleRef rep must be an int, got {type(self.rep).__name__}")


BytesHook = Callable[[bytes, int], Any]
"""``hook(data, depth) -> replacement``: the writer's chance to store large bytes as a blob."""


class _Unencodable(Exception):
    """Raised deep in the encoder; each level on the way up adds its place to ``where``."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.where: list[str] = []


def encode_value(value: Any) -> Any:
    """``value`` as CBOR-able data (plain types and ``cbor2.CBORTag``); see the tag table."""
    return encode_with(value, None)


def encode_with(value: Any, bytes_hook: BytesHook | None) -> Any:
    """``encode_value``, letting ``bytes_hook`` replace byte strings (the writer's blobs)."""
    try:
        return _encode(value, 0, bytes_hook)
    except _Unencodable as exc:
        where = "".join(reversed(exc.where)).lstrip(".") or "the value"
        raise TraceError(f"cannot record {where}: it is {exc.message}") from None


def _encode(v: Any, depth: int, hook: BytesHook | None) -> Any:
    t = type(v)
    if v is None or t is bool or t is str:
        return v
    if t is int:
        if _CBOR_INT_MIN <= v <= _CBOR_INT_MAX:
            return v
        _check_depth(depth)
        size = (v.bit_length() + 8) // 8
        if size > MAX_BIGINT_BYTES:
            raise _Unencodable(f"an int of {size} bytes, over the {MAX_BIGINT_BYTES}-byte limit")
        return cbor2.CBORTag(TAG_BIGINT, v.to_bytes(size, "big", signed=True))
    if t is bytes or t is bytearray or t is memoryview:
        data = v if t is bytes else bytes(v)
        return data if hook is None else hook(data, depth)
    if t is float:
        _check_depth(depth)
        return cbor2.CBORTag(TAG_FLOAT, _DOUBLE.pack(v))
    _check_depth(depth)
    if t is list:
        return _encode_items(v, depth + 1, hook)
    if t is dict:
        return _encode_dict(v, depth, hook)
    if t is tuple:
        return cbor2.CBORTag(TAG_TUPLE, _encode_items(v, depth + 2, hook))
    if t is frozenset or t is set:
        try:
            _check_hashed(list(v), "a set")
        except ValueError as exc:
            raise _Unencodable(str(exc)) from None
        items = _encode_items(list(v), depth + 2, hook)
        items.sort(key=cbor2.dumps)
        return cbor2.CBORTag(TAG_FROZENSET, items)
    if t is Ok or t is Err or t is Some:
        tag = TAG_OK if t is Ok else TAG_ERR if t is Err else TAG_SOME
        try:
            return cbor2.CBORTag(tag, _encode(v.value, depth + 1, hook))
        except _Unencodable as exc:
            exc.where.append(f".<{t.__name__.lower()}>")
            raise
    if t is Variant:
        if type(v.case) is not str:
            raise _Unencodable(f"a Variant whose case is a {type(v.case).__name__}, not str")
        try:
            return cbor2.CBORTag(TAG_VARIANT, [v.case, _encode(v.value, depth + 2, hook)])
        except _Unencodable as exc:
            exc.where.append(f".<{v.case}>")
            raise
    if t is HandleRef:
        return cbor2.CBORTag(TAG_HANDLE, [v.interface, v.name, _encode(v.rep, depth + 2, hook)])
    hint = ""
    if t.__name__ in ("Handle", "ResourceAny", "ResourceHost"):
        hint = "; record a resource as HandleRef(interface, name, rep)"
    raise _Unencodable(f"a {t.__module__}.{t.__qualname__}; a trace holds only {_KNOWN}{hint}")


def _encode_dict(v: dict[Any, Any], depth: int, hook: BytesHook | None) -> Any:
    if all(type(k) is str for k in v):
        out = {}
        for k, item in v.items():
            try:
                out[k] = _encode(item, depth + 1, hook)
            except _Unencodable as exc:
                exc.where.append(f".{k}")
                raise
        return out
    try:
        _check_hashed(list(v), "a map")
    except ValueError as exc:
        raise _Unencodable(str(exc)) from None
    flat: list[Any] = []
    for i, (k, item) in enumerate(v.items()):
        try:
            flat.append(_encode(k, depth + 2, hook))
        except _Unencodable as exc:
            exc.where.append(f"<key {i}>")
            raise
        try:
            flat.append(_encode(item, depth + 2, hook))
        except _Unencodable as exc:
            exc.where.append(f"[{k!r}]")
            raise
    return cbor2.CBORTag(TAG_MAP, flat)


def _encode_items(items: Any, depth: int, hook: BytesHook | None) -> list[Any]:
    out = []
    for i, item in enumerate(items):
        try:
            out.append(_encode(item, depth, hook))
        except _Unencodable as exc:
            exc.where.append(f"[{i}]")
            raise
    return out


def _check_depth(depth: int) -> None:
    if depth >= MAX_DEPTH:
        raise _Unencodable(f"a value nested deeper than {MAX_DEPTH} levels")


# Handles decoded so far, each once: a HandleRef is immutable, so every record naming the same
# handle may share one (a stream is named by most of a print-heavy trace's records).
_HANDLE_REFS: dict[tuple[Any, Any, Any], HandleRef] = {}
_HANDLE_REFS_MAX = 4096


def handle_ref(interface: str, name: str, rep: int) -> HandleRef:
    """``HandleRef(interface, name, rep)``, the one already made if there is one."""
    if type(interface) is str and type(name) is str and type(rep) is int:
        known = _HANDLE_REFS.get((interface, name, rep))
        if known is not None:
            return known
        if len(_HANDLE_REFS) >= _HANDLE_REFS_MAX:
            _HANDLE_REFS.clear()
        known = _HANDLE_REFS[(interface, name, rep)] = HandleRef(interface, name, rep)
        return known
    return HandleRef(interface, name, rep)


def value_from_tag(tag: int, content: Any) -> Any:  # noqa: PLR0915 - one dispatch on the tag
    """The value a tag of the table stands for, its content already decoded.

    Raises ``ValueError`` (or ``TypeError`` for an unhashable set item or key) for a tag
    outside the table or content of the wrong shape, including non-canonical forms the encoder
    never writes.
    """
    if tag == TAG_OK:
        return Ok(content)
    if tag == TAG_HANDLE and type(content) is list and len(content) == 3:
        interface, name, rep = content
        if type(interface) is str and type(name) is str and type(rep) is int:
            known = _HANDLE_REFS.get((interface, name, rep))
            if known is not None:
                return known
    if tag == TAG_FLOAT:
        if type(content) is not bytes or len(content) != 8:
            raise ValueError("a float must be 8 bytes")
        return _DOUBLE.unpack(content)[0]
    if tag == TAG_TUPLE:
        return tuple(_array(content, "a tuple"))
    if tag == TAG_ERR:
        return Err(content)
    if tag == TAG_SOME:
        return Some(content)
    if tag == TAG_VARIANT:
        pair = _array(content, "a variant")
        if len(pair) != 2 or type(pair[0]) is not str:
            raise ValueError("a variant must be [case: str, value]")
        return Variant(pair[0], pair[1])
    if tag == TAG_HANDLE:
        parts = _array(content, "a handle")
        if (
            len(parts) != 3
            or type(parts[0]) is not str
            or type(parts[1]) is not str
            or type(parts[2]) is not int
        ):
            raise ValueError("a handle must be [interface: str, name: str, rep: int]")
        ref = HandleRef(parts[0], parts[1], parts[2])
        if len(_HANDLE_REFS) >= _HANDLE_REFS_MAX:
            _HANDLE_REFS.clear()
        _HANDLE_REFS[(ref.interface, ref.name, ref.rep)] = ref
        return ref
    if tag == TAG_FROZENSET:
        items = _array(content, "a set")
        _check_hashed(items, "a set")
        out = frozenset(items)
        if len(out) != len(items):
            raise ValueError("a set holds the same item twice")
        return out
    if tag == TAG_MAP:
        flat = _array(content, "a map")
        if len(flat) % 2:
            raise ValueError("a map must hold key, value pairs")
        _check_hashed(flat[::2], "a map")
        result: dict[Any, Any] = {}
        for i in range(0, len(flat), 2):
            key = flat[i]
            if key in result:
                raise ValueError(f"a map holds the key {key!r} twice")
            result[key] = flat[i + 1]
        if all(type(k) is str for k in result):
            raise ValueError("a map with only str keys must be a plain CBOR map")
        return result
    if tag == TAG_BIGINT:
        if type(content) is not bytes or not content:
            raise ValueError("a big integer must be non-empty bytes")
        if len(content) > MAX_BIGINT_BYTES:
            raise ValueError(f"a big integer over {MAX_BIGINT_BYTES} bytes")
        n = int.from_bytes(content, "big", signed=True)
        if _CBOR_INT_MIN <= n <= _CBOR_INT_MAX or len(content) != (n.bit_length() + 8) // 8:
            raise ValueError("a big integer must be outside the CBOR range and minimal")
        return n
    raise ValueError("not a tag that traces use")


def _check_hashed(items: list[Any], what: str) -> None:
    """Refuse a hash container too big, or built to collide (see the module note)."""
    if len(items) > MAX_HASHED:
        raise ValueError(f"{what} of {len(items)} items, over the {MAX_HASHED} limit")
    if len(items) <= MAX_COLLISIONS:
        return
    counts: dict[int, int] = {}
    for item in items:
        h = hash(item)  # TypeError for an unhashable item, as frozenset() would raise
        n = counts.get(h, 0) + 1
        if n > MAX_COLLISIONS:
            raise ValueError(f"{what} with more than {MAX_COLLISIONS} items of one hash")
        counts[h] = n


def _array(content: Any, what: str) -> list[Any]:
    if type(content) is not list:
        raise ValueError(f"{what} must be an array, got {type(content).__name__}")
    return content


def decode_value(data: Any) -> Any:
    """The value ``encode_value`` turned into ``data``, exactly.

    Raises ``TraceError`` for data ``encode_value`` cannot produce (an unknown tag, a native
    float, a wrong shape, nesting deeper than ``MAX_DEPTH``).
    """
    try:
        return _decode(data, 0)
    except (ValueError, TypeError) as exc:
        raise TraceError(f"not an encoded value: {exc}") from None


def _decode(x: Any, depth: int) -> Any:
    t = type(x)
    if x is None or t is bool or t is int or t is str or t is bytes:
        return x
    if depth >= MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
    if t is list:
        return [_decode(item, depth + 1) for item in x]
    if t is dict:
        out = {}
        for k, item in x.items():
            if type(k) is not str:
                raise ValueError(f"a plain map key is a {type(k).__name__}, not str")
            out[k] = _decode(item, depth + 1)
        return out
    if t is cbor2.CBORTag:
        return value_from_tag(x.tag, _decode(x.value, depth + 1))
    raise ValueError(f"a {t.__name__} is not part of the encoding")
