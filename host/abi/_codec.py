"""Python values <-> ``wasmtime_component_val_t``, compiled once per WIT type.

Design. Each WIT type compiles (cached) into a small codec object with ``lower(store, value,
dst)`` and ``lift(src)``. ``dst`` is always a zeroed (``bool false``) value slot; a codec writes
the payload and sets the kind byte last, and when it fails it frees what it allocated and leaves
the slot untouched, so the caller can always delete the slot. Lifting only reads: whoever owns
the tree (us for an export's result, wasmtime for a host import's arguments) deletes it in one C
call. Errors travel up as an internal ``_MismatchError`` that collects path segments while
unwinding, so the happy path builds no path strings; the boundary turns it into
``ArgumentError``.

Lists of primitives never touch elements one at a time in Python: the value array's memory is
viewed as a memoryview and the kind bytes and payloads are written with strided slice
assignment (kind at offset 0, payload at offset 8, stride 32); lifting reads a strided slice.

Rejected:
- wasmtime-py's ``ValType.convert_to_c``: it re-fetches child type objects through the C API on
  every value (``self.element`` per list), converts ``list<u8>`` one element at a time (~68 ms
  for 64 KiB), and guesses the case of results and variants from Python types.
- Nulling each lifted child as wasmtime-py does (``kind = BOOL`` after every field) to free the
  tree piecemeal: one ``wasmtime_component_val_delete`` at the top is simpler and cannot miss.
- Taking resource pointers out of a lifted tree (``take_pointer``): a host import's arguments are
  dropped by wasmtime after the callback, and a NULL ``Box`` there is not ours to reason about.
  We clone the ``ResourceAny`` handle box instead (a handle copy, not a new resource).
- Boxing option/variant/result payloads with ``val_new`` of a filled temporary (wasmtime-py):
  whether ``val_new`` moves or copies decides who frees the temporary. We box a zeroed slot
  first and lower into the box in place, so there is exactly one owner.
- Validating a whole value before allocating anything: it walks big values twice; the
  free-on-failure rule above keeps the single pass safe.
"""

from __future__ import annotations

import array
import ctypes
import functools
import math
import reprlib
import struct
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, NamedTuple

from wasmtime.component import FuncType, ResourceAny, ResourceHost

from mighty._errors import ArgumentError, WrongType
from mighty._wasmtime import ffi, resource_any_from_ptr

from ._native import native as _cmod
from ._native import use_native
from ._types import (
    INT_RANGES,
    BorrowType,
    EnumType,
    FlagsType,
    FuncSig,
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

__all__ = ["FuncCodec", "ParamArray", "codec_for"]

_VAL: Final = ffi.wasmtime_component_val_t
_VAL_SIZE: Final = ctypes.sizeof(_VAL)
_PAYLOAD: Final = _VAL.of.offset
_ENTRY_SIZE: Final = ctypes.sizeof(ffi.wasmtime_component_valrecord_entry_t)
_MAP_ENTRY_SIZE: Final = ctypes.sizeof(ffi.wasmtime_component_valmap_entry_t)
assert _VAL_SIZE == 32
assert _PAYLOAD == 8

K_BOOL: Final = 0
K_CHAR: Final = 11
K_STRING: Final = 12
K_LIST: Final = 13
K_RECORD: Final = 14
K_TUPLE: Final = 15
K_VARIANT: Final = 16
K_ENUM: Final = 17
K_OPTION: Final = 18
K_RESULT: Final = 19
K_FLAGS: Final = 20
K_RESOURCE: Final = 21
# The value kind for `map`; wasmtime-py 50 has no constant for it (measured: 22).
K_MAP: Final = 22

# name -> (value kind, union field, array/memoryview typecode)
_PRIM: Final[dict[str, tuple[int, str, str]]] = {
    "bool": (0, "boolean", "B"),
    "s8": (1, "s8", "b"),
    "u8": (2, "u8", "B"),
    "s16": (3, "s16", "h"),
    "u16": (4, "u16", "H"),
    "s32": (5, "s32", "i"),
    "u32": (6, "u32", "I"),
    "s64": (7, "s64", "q"),
    "u64": (8, "u64", "Q"),
    "f32": (9, "f32", "f"),
    "f64": (10, "f64", "d"),
}
for _code in "bBhHiIqQfd":
    assert array.array(_code).itemsize == struct.calcsize(_code)

_byref = ctypes.byref
_string_at = ctypes.string_at
_memset = ctypes.memset
_memmove = ctypes.memmove
_cast = ctypes.cast
_c_void_p = ctypes.c_void_p
_c_char = ctypes.c_char
_val_delete = ffi.wasmtime_component_val_delete
_val_new = ffi.wasmtime_component_val_new
_val_free = ffi.wasmtime_component_val_free
_byte_vec_new_uninit = ffi.wasm_byte_vec_new_uninitialized
_byte_vec_delete = ffi.wasm_byte_vec_delete
_repr = reprlib.Repr()
_repr.maxstring = 40
_repr.maxother = 40
_repr.maxlist = 4
_repr.maxdict = 4

_ZERO_VAL: Final = _VAL()


class _MismatchError(Exception):
    """A value does not fit its type; ``segs`` is the path from the innermost part outward."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.segs: list[str] = []

    def to_error(self, root: str) -> ArgumentError:
        path = root + "".join(reversed(self.segs))
        where = f" at {path}" if path else ""
        return ArgumentError(f"{self.message}{where}", path=path)


def _describe(v: object) -> str:
    if v is None:
        return "None"
    if type(v) in (int, float):
        return repr(v)
    return f"{type(v).__name__} {_repr.repr(v)}"


def _short(wt: WitType) -> str:
    s = str(wt)
    return s if len(s) <= 80 else s[:77] + "..."


def _expected(wt: WitType, v: object) -> _MismatchError:
    return _MismatchError(f"expected {_short(wt)}, got {_describe(v)}")


# Our own prototype of wasm_byte_vec_new (``dll[name]`` is a new function object, wasmtime-py's
# stays as it is): it allocates and copies in one C call, taking the bytes object's buffer as is.
_byte_vec_new = ffi.dll["wasm_byte_vec_new"]
_byte_vec_new.restype = None
_byte_vec_new.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]


def _set_name(vec: Any, data: bytes) -> None:
    _byte_vec_new(_byref(vec), len(data), data)


def _get_name(vec: Any) -> bytes:
    n = vec.size
    return _string_at(vec.data, n) if n else b""


def _view(data_ptr: Any, nbytes: int) -> memoryview:
    addr = _cast(data_ptr, _c_void_p).value
    return memoryview((_c_char * nbytes).from_address(addr)).cast("B")  # type: ignore[arg-type]  # addr is non-NULL for a non-empty vec


class _Codec(ABC):
    """Converts one WIT type; see the module note for the slot contract."""

    __slots__ = ("wit",)

    def __init__(self, wit: WitType) -> None:
        self.wit = wit

    @abstractmethod
    def lower(self, store: Any, v: Any, dst: Any) -> None:
        """Write ``v`` into the zeroed slot ``dst``; on failure leave it deletable."""

    @abstractmethod
    def lift(self, src: Any) -> Any:
        """Read the value in ``src`` (reading only; the owner frees it)."""


class _BoolCodec(_Codec):
    __slots__ = ()

    def lower(self, store: Any, v: Any, dst: Any) -> None:
        if v is not True and v is not False:
            raise _expected(self.wit, v)
        dst.of.boolean = v
        dst.kind = K_BOOL

    def lift(self, src: Any) -> Any:
        return bool(src.of.boolean)


class _IntCodec(_Codec):
    __slots__ = ("field", "hi", "kind", "lo")

    def __init__(self, wit: PrimitiveType) -> None:
        super().__init__(wit)
        self.kind, self.field, _ = _PRIM[wit.name]
        self.lo, self.hi = INT_RANGES[wit.name]

    def check(self, v: Any) -> int:
        if not isinstance(v, int) or isinstance(v, bool):
            raise _expected(self.wit, v)
        if not self.lo <= v <= self.hi:
            raise _MismatchError(f"expected {self.wit} ({self.lo}..={self.hi}), got {_describe(v)}")
        return int(v)

    def lower(self, store: Any, v: Any, dst: Any) -> None:
        setattr(dst.of, self.field, self.check(v))
        dst.kind = self.kind

    def lift(self, src: Any) -> Any:
        return getattr(src.of, self.field)


class _FloatCodec(_Codec):
    __slots__ = ("f32", "field", "kind")

    def __init__(self, wit: PrimitiveType) -> None:
        super().__init__(wit)
        self.kind, self.field, _ = _PRIM[wit.name]
        self.f32 = wit.name == "f32"

    def check(self, v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise _expected(self.wit, v)
        try:
            x = float(v)
            if self.f32 and math.isfinite(x):
                struct.pack("<f", x)
        except OverflowError:
            raise _MismatchError(
                f"expected {self.wit}, got {_describe(v)} (out of range)"
            ) from None
        return x

    def lower(self, store: Any, v: Any, dst: Any) -> None:
        setattr(dst.of, self.field, self.check(v))
        dst.kind = self.kind

    def lift(self, src: Any) -> Any:
        return float(getattr(src.of, self.field))


class _CharCodec(_Codec):
    __slots__ = ()

    def lower(self, store: Any, v: Any, dst: Any) -> None:
        if not isinstance(v, str) or len(v) != 1:
            raise _MismatchError(f"expected char (a 1-character str), got {_describe(v)}")
        c = ord(v)
        if 0xD800 <= c <= 0xDFFF:
            raise _MismatchError(
                f"expected char, got the surrogate U+{c:04X} (not a Unicode scalar)"
            )
        dst.of.character = c
        dst.kind = K_CHAR

    def lift(self, src: Any) -> Any:
        return chr(src.of.character)


def _utf8(v: Any, wit: WitType) -> bytes:
    if not isinstance(v, str):
        raise _expected(wit, v)
    try:
        return v.encode("utf-8")
    except UnicodeEncodeError as e:
        raise _MismatchError(
            f"expected {wit}, got a str with a lone surrogate at index {e.start} (cannot be UTF-8)"
        ) from None


class _StringCodec(_Codec):
    __slots__ = ()

    def lower(self, store: Any, v: Any, dst: Any) -> None:
        _set_name(dst.of.string, _utf8(v, self.wit))
        dst.kind = K_STRING

    def lift(self, src: Any) -> Any:
        return _get_name(src.of.string).decode("utf-8")


class _ListCodec(_Codec):
    """``list<T>`` for any ``T``, one element at a time."""

    __slots__ = ("elem",)

    def __init__(self, wit: ListType) -> None:
        super().__init__(wit)
        self.elem = codec_for(wit.element)

    def items(self, v: Any) -> Sequence[Any]:
        if not isinstance(v, (list, tuple)):
            raise _expected(self.wit, v)
        return v

    def lower(self, store: Any, v: Any, dst: Any) -> None:
        seq = self.items(v)
        n = len(seq)
        lst = dst.of.list
        ffi.wasmtime_component_vallist_new_uninit(_byref(lst), n)
        data = lst.data
        if n:
            _memset(data, 0, n * _VAL_SIZE)
        lower = self.elem.lower
        i = 0
        try:
            for i, e in enumerate(seq):  # i names the failing element below
                lower(store, e, data[i])
        except _MismatchError as m:
            ffi.wasmtime_component_vallist_delete(_byref(lst))
            m.segs.append(f"[{i}]")
            raise
        except BaseException:
            ffi.wasmtime_component_vallist_delete(_byref(lst))
            raise
        dst.kind = K_LIST

    def lift(self, src: Any) -> Any:
        lst = src.of.list
        data = lst.data
        lift = self.elem.lift
        return [lift(data[i]) for i in range(lst.size)]


# A list<u8> up to this long is written and read through a copy of its value array (32 bytes
# a value, so at most 128 KiB), beyond it through a view over the array.
_SMALL_BYTES: Final = 4096
_U8_VALS: Final = (bytes([2]) + bytes(_VAL_SIZE - 1)) * _SMALL_BYTES  # u8 values of 0


class _PrimListCodec(_ListCodec):
    """``list<P>`` for bool, integers and floats: strided slices over the value array."""

    __slots__ = ("code", "idx", "kind", "kinds", "stride", "types")

    def __init__(self, wit: ListType) -> None:
        super().__init__(wit)
        assert isinstance(wit.element, PrimitiveType)
        name = wit.element.name
        self.kind, _, self.code = _PRIM[name]
        size = struct.calcsize(self.code)
        self.idx, self.stride = _PAYLOAD // size, _VAL_SIZE // size
        self.kinds = bytes([self.kind])
        self.types: frozenset[type] = frozenset(
            {bool} if name == "bool" else {int, float} if name in ("f32", "f64") else {int}
        )

    def pack(self, v: Any) -> Any:
        """A buffer of the payloads in the typecode's format, or raise ``_MismatchError``."""
        if self.code == "B" and isinstance(v, (bytes, bytearray, memoryview)):
            if isinstance(v, memoryview):
                if not v.c_contiguous:
                    raise _MismatchError(f"expected {self.wit}, got a non-contiguous memoryview")
                return v.cast("B") if v.format != "B" else v
            return v
        seq = self.items(v)
        if set(map(type, seq)) <= self.types:
            try:
                packed = array.array(self.code, seq)
            except (OverflowError, ValueError, TypeError):
                pass
            else:
                if self.code != "f" or (math.inf not in packed and -math.inf not in packed):
                    return packed
        # Something does not fit: let the element codec find it and say where.
        out = array.array(self.code)
        check = self.elem.check  # type: ignore[attr-defined]  # int/float codecs both have it
        for i, e in enumerate(seq):
            try:
                out.append(check(e))
            except _MismatchError as m:
                m.segs.append(f"[{i}]")
                raise
        return out

    def lower(self, store: Any, v: Any, dst: Any) -> None:
        if self.kind == K_BOOL:
            seq = self.items(v)
            if not set(map(type, seq)) <= self.types:
                for i, e in enumerate(seq):
                    if e is not True and e is not False:
                        m = _expected(self.elem.wit, e)
                        m.segs.append(f"[{i}]")
                        raise m
            packed: Any = bytes(seq)
        else:
            packed = self.pack(v)
        n = len(packed)
        lst = dst.of.list
        ffi.wasmtime_component_vallist_new_uninit(_byref(lst), n)
        if n and n <= _SMALL_BYTES and self.kind == 2:
            # A short list<u8> (a message body): the values built in a buffer and copied in
            # one memmove; a view over the list costs more than the copy at this size.
            buf = bytearray(_U8_VALS[: n * _VAL_SIZE])
            buf[_PAYLOAD::_VAL_SIZE] = packed
            _memmove(lst.data, bytes(buf), n * _VAL_SIZE)
        elif n:
            mv = _view(lst.data, n * _VAL_SIZE)
            mv[0::_VAL_SIZE] = self.kinds * n
            if self.code == "B":
                mv[_PAYLOAD::_VAL_SIZE] = packed
            else:
                mv.cast(self.code)[self.idx :: self.stride] = packed  # type: ignore[call-overload]  # code is one of bBhHiIqQfd
        dst.kind = K_LIST

    def lift(self, src: Any) -> Any:
        lst = src.of.list
        n = lst.size
        if not n:
            return b"" if self.kind == 2 else []
        if self.kind == 2 and n <= _SMALL_BYTES:  # a copy of 32 bytes a value is cheap here
            return _string_at(lst.data, n * _VAL_SIZE)[_PAYLOAD::_VAL_SIZE]
        mv = _view(lst.data, n * _VAL_SIZE)
        if self.kind == 2:  # list<u8> is bytes
            return mv[_PAYLOAD::_VAL_SIZE].tobytes()
        if self.kind == K_BOOL:
            return [b != 0 for b in mv[_PAYLOAD::_VAL_SIZE].tobytes()]
        return mv.cast(self.code)[self.idx :: self.stride].tolist()  # type: ignore[call-overload]  # code is one of bBhHiIqQfd


class _SeqCodec(_Codec):
    """Records and tuples: a fixed list of fields, each in a value slot."""

    __slots__ = ("fields", "names", "nameset")

    def __init__(self, wit: RecordType | TupleType) -> None:
        super().__init__(wit)
        if isinstance(wit, RecordType):
            self.names = tuple(n for n, _ in wit.fields)
            self.fields = tuple(codec_for(t) for _, t in wit.fields)
        else:
            self.names = ()
            self.fields = tuple(codec_for(t) for t in wit.elements)
        self.nameset = frozenset(self.names)


_ENTRY_VAL: Final = ffi.wasmtime_component_valrecord_entry_t.val.offset
_val_clone = ffi.wasmtime_component_val_clone
_val_at = _VAL.from_address


class _RecordCodec(_SeqCodec):
    """A record. One whose fields are all strings, primitive lists or primitives is lowered
    from a template made once (the field names and each field's zero value, which owns no
    memory): one clone in C, then each field lowered over its placeholder. Building the record
    field by field costs an allocation, a memset and one C call per name (measured for
    ``message { name: string, body: list<u8> }``: 2.7 us of 7.7 us; the clone 0.9 us)."""

    __slots__ = ("_template", "encoded", "vals")

    def __init__(self, wit: RecordType) -> None:
        super().__init__(wit)
        self.encoded = tuple(n.encode("utf-8") for n in self.names)
        self._template: Any = None
        self.vals = tuple(i * _ENTRY_SIZE + _ENTRY_VAL for i in range(len(self.fields)))
        if self.fields and all(type(f) in _FLAT_FIELDS for f in self.fields):
            template = _VAL()
            self._lower_fields(None, [_zero(f) for f in self.fields], template)
            self._template = template

    def __del__(self, delete: Any = _val_delete, ref: Any = _byref) -> None:
        template = getattr(self, "_template", None)
        if template is not None:
            self._template = None
            delete(ref(template))

    def values(self, v: Any) -> list[Any]:
        if not isinstance(v, Mapping):
            raise _expected(self.wit, v)
        try:
            if len(v) == len(self.names):
                return [v[n] for n in self.names]
        except KeyError:
            pass
        missing = [n for n in self.names if n not in v]
        if missing:
            raise _MismatchError(f"missing field {missing[0]!r} of {_short(self.wit)}")
        unknown = [k for k in v if k not in self.nameset]
        raise _MismatchError(
            f"unknown field {unknown[0]!r} for {_short(self.wit)} (fields: {', '.join(self.names)})"
        )

    def lower(self, store: Any, v: Any, dst: Any) -> None:
        vals = self.values(v)
        template = self._template
        if template is None:
            self._lower_fields(store, vals, dst)
            return
        _val_clone(_byref(template), _byref(dst))
        rec = dst.of.record
        base: int = _cast(rec.data, _c_void_p).value  # type: ignore[assignment]  # fields: never NULL
        i = 0
        try:
            for i, c in enumerate(self.fields):
                # Over the placeholder: the codec writes the whole payload and the kind, and
                # on failure leaves the placeholder (no memory) as it was.
                c.lower(store, vals[i], _val_at(base + self.vals[i]))
        except BaseException as exc:
            ffi.wasmtime_component_valrecord_delete(_byref(rec))
            _memmove(_byref(dst), _byref(_ZERO_VAL), _VAL_SIZE)
            if isinstance(exc, _MismatchError):
                exc.segs.append(f".{self.names[i]}")
            raise

    def _lower_fields(self, store: Any, vals: list[Any], dst: Any) -> None:
        n = len(vals)
        rec = dst.of.record
        ffi.wasmtime_component_valrecord_new_uninit(_byref(rec), n)
        data = rec.data
        if n:
            _memset(data, 0, n * _ENTRY_SIZE)
        # Names first: every entry is then a valid (name, bool) pair whatever fails below.
        for i in range(n):
            _set_name(data[i].name, self.encoded[i])
        i = 0
        try:
            for i, (c, e) in enumerate(zip(self.fields, vals, strict=True)):
                c.lower(store, e, data[i].val)
        except _MismatchError as m:
            ffi.wasmtime_component_valrecord_delete(_byref(rec))
            m.segs.append(f".{self.names[i]}")
            raise
        except BaseException:
            ffi.wasmtime_component_valrecord_delete(_byref(rec))
            raise
        dst.kind = K_RECORD

    def lift(self, src: Any) -> Any:
        data = src.of.record.data
        return {
            n: c.lift(data[i].val)
            for i, (n, c) in enumerate(zip(self.names, self.fields, strict=True))
        }


class _TupleCodec(_SeqCodec):
    __slots__ = ()

    def lower(self, store: Any, v: Any, dst: Any) -> None:
        if not isinstance(v, (tuple, list)) or len(v) != len(self.fields):
            raise _expected(self.wit, v)
        n = len(v)
        tup = dst.of.tuple
        ffi.wasmtime_component_valtuple_new_uninit(_byref(tup), n)
        data = tup.data
        if n:
            _memset(data, 0, n * _VAL_SIZE)
        i = 0
        try:
            for i, (c, e) in enumerate(zip(self.fields, v, strict=True)):
                c.lower(store, e, data[i])
        except _MismatchError as m:
            ffi.wasmtime_component_valtuple_delete(_byref(tup))
            m.segs.append(f"[{i}]")
            raise
        except BaseException:
            ffi.wasmtime_component_valtuple_delete(_byref(tup))
            raise
        dst.kind = K_TUPLE

    def lift(self, src: Any) -> Any:
        data = src.of.tuple.data
        return tuple(c.lift(data[i]) for i, c in enumerate(self.fields))


def _boxed(store: Any, codec: _Codec, v: Any, seg: str) -> Any:
    """A heap value slot (owned pointer) holding ``v`` lowered by ``codec``."""
    box = _val_new(_byref(_ZERO_VAL))
    try:
        codec.lower(store, v, box.contents)
    except _MismatchError as m:
        _val_free(box)
        m.segs.append(seg)
        raise
    except BaseException:
        _val_free(box)
        raise
    return box


class _VariantCodec(_Codec):
    __slots__ = ("by_bytes", "cases")

    def __init__(self, wit: VariantType) -> None:
        super().__init__(wit)
        self.cases: dict[str, tuple[bytes, _Codec | None]] = {
            n: (n.encode("utf-8"), None if t is None else codec_for(t)) for n, t in wit.cases
        }
        self.by_bytes = {b: (n, c) for n, (b, c) in self.cases.items()}

    def lower(self, store: Any, v: Any, dst: Any) -> None:
        if not isinstance(v, Variant):
            raise _MismatchError(
                f"expected Variant(case, value) for {_short(self.wit)}, got {_describe(v)}"
            )
        case = self.cases.get(v.case)
        if case is None:
            raise _MismatchError(
                f"unknown case {v.case!r} for {_short(self.wit)} (cases: {', '.join(self.cases)})"
            )
        name, codec = case
        if codec is None:
            if v.value is not None:
                raise _MismatchError(f"case {v.case!r} has no payload, got {_describe(v.value)}")
            box = None
        else:
            box = _boxed(store, codec, v.value, f".<{v.case}>")
        var = dst.of.variant
        _set_name(var.discriminant, name)
        var.val = box
        dst.kind = K_VARIANT

    def lift(self, src: Any) -> Any:
        var = src.of.variant
        name, codec = self.by_bytes[_get_name(var.discriminant)]
        if codec is None:
            return Variant(name)
        return Variant(name, codec.lift(var.val.contents))


class _EnumCodec(_Codec):
    __slots__ = ("by_bytes", "names")

    def __init__(self, wit: EnumType) -> None:
        super().__init__(wit)
        self.names = {n: n.encode("utf-8") for n in wit.names}
        self.by_bytes = {b: n for n, b in self.names.items()}

    def lower(self, store: Any, v: Any, dst: Any) -> None:
        name = self.names.get(v) if isinstance(v, str) else None
        if name is None:
            raise _MismatchError(
                f"expected one of {', '.join(map(repr, self.names))} for {_short(self.wit)},"
                f" got {_describe(v)}"
            )
        _set_name(dst.of.enumeration, name)
        dst.kind = K_ENUM

    def lift(self, src: Any) -> Any:
        return self.by_bytes[_get_name(src.of.enumeration)]


class _OptionCodec(_Codec):
    __slots__ = ("nested", "payload")

    def __init__(self, wit: OptionType) -> None:
        super().__init__(wit)
        self.payload = codec_for(wit.payload)
        self.nested = isinstance(wit.payload, OptionType)

    def lower(self, store: Any, v: Any, dst: Any) -> None:
        if v is None:
            box = None
        else:
            if isinstance(v, Some):
                v = v.value
            elif self.nested:
                raise _MismatchError(
                    f"expected None or Some(...) for {_short(self.wit)} (the payload is itself"
                    f" an option, so its some case must be written Some(value)),"
                    f" got {_describe(v)}"
                )
            box = _boxed(store, self.payload, v, ".<some>")
        dst.of.option = box
        dst.kind = K_OPTION

    def lift(self, src: Any) -> Any:
        box = src.of.option
        if not box:
            return None
        inner = self.payload.lift(box.contents)
        return Some(inner) if self.nested else inner


class _ResultCodec(_Codec):
    __slots__ = ("err", "ok")

    def __init__(self, wit: ResultType) -> None:
        super().__init__(wit)
        self.ok = None if wit.ok is None else codec_for(wit.ok)
        self.err = None if wit.err is None else codec_for(wit.err)

    def lower(self, store: Any, v: Any, dst: Any) -> None:
        if isinstance(v, Ok):
            is_ok, codec, seg = True, self.ok, ".<ok>"
        elif isinstance(v, Err):
            is_ok, codec, seg = False, self.err, ".<err>"
        else:
            raise _MismatchError(
                f"expected Ok(...) or Err(...) for {_short(self.wit)}, got {_describe(v)}"
            )
        if codec is None:
            if v.value is not None:
                m = _MismatchError(
                    f"this case of {_short(self.wit)} has no payload, got {_describe(v.value)}"
                )
                m.segs.append(seg)
                raise m
            box = None
        else:
            box = _boxed(store, codec, v.value, seg)
        res = dst.of.result
        res.is_ok = is_ok
        res.val = box
        dst.kind = K_RESULT

    def lift(self, src: Any) -> Any:
        res = src.of.result
        if res.is_ok:
            return Ok(None if self.ok is None else self.ok.lift(res.val.contents))
        return Err(None if self.err is None else self.err.lift(res.val.contents))


class _FlagsCodec(_Codec):
    __slots__ = ("by_bytes", "names", "order")

    def __init__(self, wit: FlagsType) -> None:
        super().__init__(wit)
        self.names = {n: n.encode("utf-8") for n in wit.names}
        self.order = {n: i for i, n in enumerate(wit.names)}
        self.by_bytes = {b: n for n, b in self.names.items()}

    def lower(self, store: Any, v: Any, dst: Any) -> None:
        if not isinstance(v, (set, frozenset, list, tuple)):
            raise _MismatchError(
                f"expected a set of flag names for {_short(self.wit)}, got {_describe(v)}"
            )
        for f in v:
            if not isinstance(f, str) or f not in self.names:
                raise _MismatchError(
                    f"unknown flag {f!r} for {_short(self.wit)} (flags: {', '.join(self.names)})"
                )
        chosen = sorted(set(v), key=self.order.__getitem__)
        flags = dst.of.flags
        ffi.wasmtime_component_valflags_new_uninit(_byref(flags), len(chosen))
        data = flags.data
        for i, f in enumerate(chosen):
            _set_name(data[i], self.names[f])
        dst.kind = K_FLAGS

    def lift(self, src: Any) -> Any:
        flags = src.of.flags
        data = flags.data
        return frozenset(self.by_bytes[_get_name(data[i])] for i in range(flags.size))


class _MapCodec(_Codec):
    __slots__ = ("key", "value")

    def __init__(self, wit: MapType) -> None:
        super().__init__(wit)
        self.key = codec_for(wit.key)
        self.value = codec_for(wit.value)

    def lower(self, store: Any, v: Any, dst: Any) -> None:
        if not isinstance(v, Mapping):
            raise _expected(self.wit, v)
        n = len(v)
        m_ = dst.of.map
        ffi.wasmtime_component_valmap_new_uninit(_byref(m_), n)
        data = m_.data
        if n:
            _memset(data, 0, n * _MAP_ENTRY_SIZE)
        k: Any = None
        seg = ""
        try:
            for i, (k, e) in enumerate(v.items()):
                seg = f".<key {_repr.repr(k)}>"
                self.key.lower(store, k, data[i].key)
                seg = f"[{_repr.repr(k)}]"
                self.value.lower(store, e, data[i].value)
        except _MismatchError as m:
            ffi.wasmtime_component_valmap_delete(_byref(m_))
            m.segs.append(seg)
            raise
        except BaseException:
            ffi.wasmtime_component_valmap_delete(_byref(m_))
            raise
        dst.kind = K_MAP

    def lift(self, src: Any) -> Any:
        m_ = src.of.map
        data = m_.data
        return {self.key.lift(data[i].key): self.value.lift(data[i].value) for i in range(m_.size)}


class _HandleCodec(_Codec):
    __slots__ = ("own",)

    def __init__(self, wit: OwnType | BorrowType) -> None:
        super().__init__(wit)
        self.own = isinstance(wit, OwnType)

    def lower(self, store: Any, v: Any, dst: Any) -> None:
        # As wasmtime-py's OwnType/BorrowType: own moves the ResourceAny (it is unusable after),
        # borrow lends a copy of the handle; a ResourceHost is converted and moved either way.
        if isinstance(v, ResourceAny):
            ptr = v._consume() if self.own else ffi.wasmtime_component_resource_any_clone(v.ptr())
        elif isinstance(v, ResourceHost):
            ptr = v.to_any(store)._consume()
        else:
            raise _MismatchError(
                f"expected ResourceAny or ResourceHost for {self.wit}, got {_describe(v)}"
            )
        dst.of.resource = ptr
        dst.kind = K_RESOURCE

    def lift(self, src: Any) -> Any:
        # A copy of the handle box: the tree we read from is freed by its owner afterwards.
        return resource_any_from_ptr(ffi.wasmtime_component_resource_any_clone(src.of.resource))


# Field codecs whose lowering overwrites a slot's whole payload and whose zero value owns no
# memory: a record of only these is lowered from a cloned template (see _RecordCodec).
_FLAT_FIELDS: Final = (_BoolCodec, _IntCodec, _FloatCodec, _CharCodec, _StringCodec, _PrimListCodec)


def _zero(codec: _Codec) -> Any:
    """A flat field codec's zero value (one that owns no memory once lowered)."""
    if isinstance(codec, _PrimListCodec):
        return b"" if codec.kind == 2 else []
    return {
        _BoolCodec: False,
        _IntCodec: 0,
        _FloatCodec: 0.0,
        _CharCodec: "\0",
        _StringCodec: "",
    }[type(codec)]


@functools.lru_cache(maxsize=4096)
def codec_for(wit: WitType) -> _Codec:
    """The (shared, stateless) codec for one WIT type."""
    if isinstance(wit, PrimitiveType):
        name = wit.name
        if name == "bool":
            return _BoolCodec(wit)
        if name in ("f32", "f64"):
            return _FloatCodec(wit)
        if name == "char":
            return _CharCodec(wit)
        if name == "string":
            return _StringCodec(wit)
        return _IntCodec(wit)
    if isinstance(wit, ListType):
        el = wit.element
        if isinstance(el, PrimitiveType) and el.name in _PRIM:
            return _PrimListCodec(wit)
        return _ListCodec(wit)
    if isinstance(wit, RecordType):
        return _RecordCodec(wit)
    if isinstance(wit, TupleType):
        return _TupleCodec(wit)
    if isinstance(wit, VariantType):
        return _VariantCodec(wit)
    if isinstance(wit, EnumType):
        return _EnumCodec(wit)
    if isinstance(wit, OptionType):
        return _OptionCodec(wit)
    if isinstance(wit, ResultType):
        return _ResultCodec(wit)
    if isinstance(wit, FlagsType):
        return _FlagsCodec(wit)
    if isinstance(wit, MapType):
        return _MapCodec(wit)
    if isinstance(wit, (OwnType, BorrowType)):
        return _HandleCodec(wit)
    raise WrongType(f"no codec for {wit!r}")


_NO_SPEC: Final = "none"


def _spec(wit: WitType) -> tuple[Any, ...] | None:
    """The compiled codec's description of ``wit`` (``_speedups.c``'s nested tuples), or None
    when it has a part that only the Python codec serves (flags, maps, resources)."""
    if isinstance(wit, PrimitiveType):
        return (wit.name,)
    if isinstance(wit, ListType):
        if wit.element == PrimitiveType("u8"):
            return ("bytes",)
        inner = _spec(wit.element)
        return None if inner is None else ("list", inner)
    if isinstance(wit, OptionType):
        inner = _spec(wit.payload)
        return None if inner is None else ("option", inner)
    if isinstance(wit, (RecordType, TupleType)):
        kinds = [t for _, t in wit.fields] if isinstance(wit, RecordType) else list(wit.elements)
        specs = [_spec(t) for t in kinds]
        if any(sp is None for sp in specs):
            return None
        if isinstance(wit, TupleType):
            return ("tuple", tuple(specs))
        return ("record", tuple(n for n, _ in wit.fields), tuple(specs))
    if isinstance(wit, ResultType):
        ok = None if wit.ok is None else _spec(wit.ok)
        err = None if wit.err is None else _spec(wit.err)
        if (wit.ok is not None and ok is None) or (wit.err is not None and err is None):
            return None
        return ("result", ok, err)
    if isinstance(wit, EnumType):
        return ("enum", tuple(wit.names))
    if isinstance(wit, VariantType):
        cases = [None if t is None else _spec(t) for _, t in wit.cases]
        if any(sp is None and t is not None for sp, (_, t) in zip(cases, wit.cases, strict=True)):
            return None
        return ("variant", tuple(n for n, _ in wit.cases), tuple(cases))
    return None


@functools.lru_cache(maxsize=4096)
def _compiled(wit: WitType) -> Any:
    """The compiled codec of ``wit`` (shared, immutable), or None (see ``_spec``)."""
    if _cmod is None:
        return None
    spec = _spec(wit)
    if spec is None:
        return None
    try:
        return _cmod.Codec(spec)
    except ValueError:  # nests deeper than the compiled codec goes: the Python codec's
        return None


def _lift_at(lift: Callable[[Any], Any], address: int) -> Any:
    return lift(_val_at(address))


class ParamArray(NamedTuple):
    """Lowered arguments for ``wasmtime_component_func_call``; free with ``free_params``."""

    array: Any
    size: int


class FuncCodec:
    """Lowers and lifts the values of one component function signature.

    ``native`` (``native=None``: whenever :func:`use_native` says so) adds the compiled codec
    (``_speedups.c``) for the types it covers: it lowers and lifts first, and wherever it
    declines a value the Python codec takes it, so both give the same values and errors.
    ``self.native`` is the whole signature compiled (a ``_speedups.Func`` that also makes the
    call), or None when a parameter or the result is not covered or the codec is not used.
    """

    __slots__ = ("_cparams", "_cresult", "_names", "_params", "_result", "native", "sig")

    def __init__(self, sig: FuncSig, native: bool | None = None) -> None:
        self.sig = sig
        self._names = tuple(n for n, _ in sig.params)
        self._params = tuple(codec_for(t) for _, t in sig.params)
        self._result = None if sig.result is None else codec_for(sig.result)
        use = (use_native() if native is None else native) and _cmod is not None
        self._cparams: tuple[Any, ...] = tuple(_compiled(t) if use else None for _, t in sig.params)
        self._cresult: Any = _compiled(sig.result) if use and sig.result is not None else None
        self.native: Any = None
        if (
            use
            and all(c is not None for c in self._cparams)
            and (sig.result is None or self._cresult is not None)
        ):
            self.native = _cmod.Func(self._cparams, self._cresult)

    @classmethod
    def from_func_type(cls, fty: FuncType, native: bool | None = None) -> FuncCodec:
        """Compile the codec for a wasmtime ``FuncType`` (reads the type once)."""
        return cls(FuncSig.from_func_type(fty), native)

    @property
    def nparams(self) -> int:
        """How many parameters the function takes."""
        return len(self._params)

    @property
    def has_result(self) -> bool:
        """Whether the function returns a value."""
        return self._result is not None

    # -- calling an export ----------------------------------------------------------------------

    def lower_params(self, store: Any, args: Sequence[Any]) -> ParamArray:
        """Lower ``args`` into a fresh value array, or raise ``ArgumentError`` having freed it."""
        n = len(self._params)
        if len(args) != n:
            raise ArgumentError(
                f"expected {n} argument{'s' if n != 1 else ''} ({', '.join(self._names)}),"
                f" got {len(args)}"
            )
        arr = (_VAL * n)()
        i = 0
        try:
            for i, (c, a) in enumerate(zip(self._params, args, strict=True)):
                c.lower(store, a, arr[i])
        except _MismatchError as m:
            self.free_params(arr, i)
            raise m.to_error(self._names[i]) from None
        except BaseException:
            self.free_params(arr, i)
            raise
        return ParamArray(arr, n)

    @staticmethod
    def free_params(array: Any, n: int) -> None:
        """Free the C allocations of the first ``n`` values of a lowered argument array."""
        for i in range(n):
            _val_delete(_byref(array[i]))

    def lift_result(self, val: Any) -> Any:
        """Lift an export's result value; takes ownership of ``val`` and frees its allocations."""
        try:
            return None if self._result is None else self._result.lift(val)
        finally:
            _val_delete(_byref(val))

    # -- serving a host import ------------------------------------------------------------------

    def lifters(self) -> list[Callable[[Any], Any]]:
        """One lift function per parameter, for a caller that lifts some parameters itself (the
        gate turns top-level resource handles straight into its own handles)."""
        return [c.lift for c in self._params]

    @property
    def compiled_params(self) -> tuple[bool, ...]:
        """Per parameter, whether the compiled codec serves it."""
        return tuple(c is not None for c in self._cparams)

    @property
    def compiled_result(self) -> bool:
        """Whether the compiled codec serves the result."""
        return self._cresult is not None

    def address_lifters(self) -> list[Callable[[int], Any]]:
        """One lift function per parameter that takes the value's address (an int): the
        compiled codec's where it covers the type, else the Python codec's."""
        return [
            fast.lift if fast is not None else functools.partial(_lift_at, c.lift)
            for fast, c in zip(self._cparams, self._params, strict=True)
        ]

    def lift_args(self, args_ptr: Any, nargs: int) -> list[Any]:
        """Lift a host import's arguments. Reads only: wasmtime frees them after the callback."""
        if nargs != len(self._params):
            raise ArgumentError(f"expected {len(self._params)} arguments, got {nargs}")
        return [c.lift(args_ptr[i]) for i, c in enumerate(self._params)]

    def lower_result(self, store: Any, value: Any, results_ptr: Any) -> None:
        """Lower a host import's return value into wasmtime's result slot (wasmtime frees it)."""
        if self._result is None:
            if value is not None:
                raise ArgumentError(
                    f"the function returns nothing, got {_describe(value)}", path="result"
                )
            return
        self.lower_result_into(store, value, results_ptr[0])

    def lower_result_at(self, store: Any, value: Any, address: int) -> None:
        """``lower_result`` into the result slot at ``address``: the compiled codec first."""
        fast = self._cresult
        if fast is not None and fast.lower(value, address):
            return
        self.lower_result_into(store, value, _val_at(address))

    def lower_result_into(self, store: Any, value: Any, slot: Any) -> None:
        """``lower_result`` into the result slot itself (a ``wasmtime_component_val_t``), for
        a caller that holds the slot's address rather than a pointer object."""
        if self._result is None:
            if value is not None:
                raise ArgumentError(
                    f"the function returns nothing, got {_describe(value)}", path="result"
                )
            return
        try:
            self._result.lower(store, value, slot)
        except _MismatchError as m:
            raise m.to_error("result") from None
