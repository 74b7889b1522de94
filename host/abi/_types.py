"""Our own description of WIT types: frozen, hashable, built once from wasmtime's type objects.

wasmtime-py's type objects own native handles and re-query the C API on every property access
(``ListType.element`` allocates a new wrapper each time), so codecs never look at them after
construction. The tree here is plain data: it renders WIT syntax for error messages, is hashable
so codecs can be cached per type, and is what the JSON mapping and the tests work from.

``map<K, V>`` is not known to wasmtime-py 50 (its ``valtype_from_ptr`` raises on the kind), so
``FuncSig`` reads function types straight from the C API instead of through wasmtime-py.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from wasmtime.component import FuncType, ResourceType

from mighty._errors import InvalidComponent
from mighty._wasmtime import component_types as wt
from mighty._wasmtime import ffi, resource_type_from_ptr

__all__ = [
    "BOOL",
    "CHAR",
    "F32",
    "F64",
    "PRIMITIVES",
    "S8",
    "S16",
    "S32",
    "S64",
    "STRING",
    "U8",
    "U16",
    "U32",
    "U64",
    "BorrowType",
    "EnumType",
    "FlagsType",
    "FuncSig",
    "ListType",
    "MapType",
    "OptionType",
    "OwnType",
    "PrimitiveType",
    "RecordType",
    "ResultType",
    "TupleType",
    "VariantType",
    "WitType",
    "wit_type_of",
]

PrimitiveName = Literal[
    "bool", "s8", "s16", "s32", "s64", "u8", "u16", "u32", "u64", "f32", "f64", "char", "string"
]

# The C API's valtype kind for `map`; wasmtime-py 50 has no constant for it (measured: 26).
VALTYPE_MAP: Final = 26


class WitType:
    """Base of every WIT type node. ``str()`` renders WIT syntax."""

    __slots__ = ()

    def children(self) -> Iterator[WitType]:
        """The directly nested types, in declaration order."""
        return iter(())


@dataclass(frozen=True, slots=True)
class PrimitiveType(WitType):
    """``bool``, the integers, ``f32``/``f64``, ``char`` and ``string``."""

    name: PrimitiveName

    def __str__(self) -> str:
        return self.name


BOOL: Final = PrimitiveType("bool")
S8: Final = PrimitiveType("s8")
S16: Final = PrimitiveType("s16")
S32: Final = PrimitiveType("s32")
S64: Final = PrimitiveType("s64")
U8: Final = PrimitiveType("u8")
U16: Final = PrimitiveType("u16")
U32: Final = PrimitiveType("u32")
U64: Final = PrimitiveType("u64")
F32: Final = PrimitiveType("f32")
F64: Final = PrimitiveType("f64")
CHAR: Final = PrimitiveType("char")
STRING: Final = PrimitiveType("string")
PRIMITIVES: Final[tuple[PrimitiveType, ...]] = (
    BOOL, S8, S16, S32, S64, U8, U16, U32, U64, F32, F64, CHAR, STRING
)  # fmt: skip

# Inclusive ranges of the integer types.
INT_RANGES: Final[dict[str, tuple[int, int]]] = {
    "s8": (-(2**7), 2**7 - 1),
    "s16": (-(2**15), 2**15 - 1),
    "s32": (-(2**31), 2**31 - 1),
    "s64": (-(2**63), 2**63 - 1),
    "u8": (0, 2**8 - 1),
    "u16": (0, 2**16 - 1),
    "u32": (0, 2**32 - 1),
    "u64": (0, 2**64 - 1),
}


@dataclass(frozen=True, slots=True)
class ListType(WitType):
    """``list<T>``; ``list<u8>`` is ``bytes`` in Python."""

    element: WitType

    def __str__(self) -> str:
        return f"list<{self.element}>"

    def children(self) -> Iterator[WitType]:
        """The element type."""
        yield self.element


@dataclass(frozen=True, slots=True)
class RecordType(WitType):
    """``record { name: T, ... }``; field names exactly as wasmtime reports them (kebab-case)."""

    fields: tuple[tuple[str, WitType], ...]

    def __str__(self) -> str:
        return "record { " + ", ".join(f"{n}: {t}" for n, t in self.fields) + " }"

    def children(self) -> Iterator[WitType]:
        """The field types."""
        return (t for _, t in self.fields)


@dataclass(frozen=True, slots=True)
class TupleType(WitType):
    """``tuple<T, ...>``."""

    elements: tuple[WitType, ...]

    def __str__(self) -> str:
        return "tuple<" + ", ".join(map(str, self.elements)) + ">"

    def children(self) -> Iterator[WitType]:
        """The element types."""
        return iter(self.elements)


@dataclass(frozen=True, slots=True)
class VariantType(WitType):
    """``variant { case(T), case, ... }``."""

    cases: tuple[tuple[str, WitType | None], ...]

    def __str__(self) -> str:
        parts = (n if t is None else f"{n}({t})" for n, t in self.cases)
        return "variant { " + ", ".join(parts) + " }"

    def children(self) -> Iterator[WitType]:
        """The payload types of the cases that have one."""
        return (t for _, t in self.cases if t is not None)


@dataclass(frozen=True, slots=True)
class EnumType(WitType):
    """``enum { a, b, ... }``; a ``str`` in Python."""

    names: tuple[str, ...]

    def __str__(self) -> str:
        return "enum { " + ", ".join(self.names) + " }"


@dataclass(frozen=True, slots=True)
class FlagsType(WitType):
    """``flags { a, b, ... }``; a ``frozenset[str]`` in Python."""

    names: tuple[str, ...]

    def __str__(self) -> str:
        return "flags { " + ", ".join(self.names) + " }"


@dataclass(frozen=True, slots=True)
class OptionType(WitType):
    """``option<T>``."""

    payload: WitType

    def __str__(self) -> str:
        return f"option<{self.payload}>"

    def children(self) -> Iterator[WitType]:
        """The payload type."""
        yield self.payload


@dataclass(frozen=True, slots=True)
class ResultType(WitType):
    """``result<T, E>``; either side may be absent."""

    ok: WitType | None
    err: WitType | None

    def __str__(self) -> str:
        if self.ok is None and self.err is None:
            return "result"
        if self.err is None:
            return f"result<{self.ok}>"
        ok = "_" if self.ok is None else str(self.ok)
        return f"result<{ok}, {self.err}>"

    def children(self) -> Iterator[WitType]:
        """The ok and err types that are present."""
        return (t for t in (self.ok, self.err) if t is not None)


@dataclass(frozen=True, slots=True)
class MapType(WitType):
    """``map<K, V>``; a ``dict`` in Python."""

    key: WitType
    value: WitType

    def __str__(self) -> str:
        return f"map<{self.key}, {self.value}>"

    def children(self) -> Iterator[WitType]:
        """The key and value types."""
        yield self.key
        yield self.value


@dataclass(frozen=True, slots=True, eq=False)
class _HandleType(WitType):
    # ResourceType defines __eq__ through the C API but no __hash__, so identity goes through
    # that __eq__ and all handles of one kind share a hash bucket (resources are rare).
    resource: ResourceType = field(repr=False)
    resource_name: str = "resource"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and bool(self.resource == other.resource)

    def __hash__(self) -> int:
        return hash(type(self))


class OwnType(_HandleType):
    """``own<R>``; a ``wasmtime.component.ResourceAny`` in Python."""

    __slots__ = ()

    def __str__(self) -> str:
        return f"own<{self.resource_name}>"


class BorrowType(_HandleType):
    """``borrow<R>``; a ``wasmtime.component.ResourceAny`` in Python."""

    __slots__ = ()

    def __str__(self) -> str:
        return f"borrow<{self.resource_name}>"


_PRIM_BY_CLASS: Final[dict[type, PrimitiveType]] = {
    wt.Bool: BOOL,
    wt.S8: S8,
    wt.S16: S16,
    wt.S32: S32,
    wt.S64: S64,
    wt.U8: U8,
    wt.U16: U16,
    wt.U32: U32,
    wt.U64: U64,
    wt.F32: F32,
    wt.F64: F64,
    wt.Char: CHAR,
    wt.String: STRING,
}


def wit_type_of(valtype: Any) -> WitType:
    """Our type for one of wasmtime-py's ``ValType`` objects.

    Raises ``TypeError`` for the kinds mighty cannot carry (future, stream, error-context).
    """
    prim = _PRIM_BY_CLASS.get(type(valtype))
    if prim is not None:
        return prim
    if isinstance(valtype, wt.ListType):
        return ListType(wit_type_of(valtype.element))
    if isinstance(valtype, wt.RecordType):
        return RecordType(tuple((n, wit_type_of(t)) for n, t in valtype.fields))
    if isinstance(valtype, wt.TupleType):
        return TupleType(tuple(wit_type_of(t) for t in valtype.elements))
    if isinstance(valtype, wt.VariantType):
        return VariantType(
            tuple((n, None if t is None else wit_type_of(t)) for n, t in valtype.cases)
        )
    if isinstance(valtype, wt.EnumType):
        return EnumType(tuple(valtype.names))
    if isinstance(valtype, wt.OptionType):
        return OptionType(wit_type_of(valtype.payload))
    if isinstance(valtype, wt.ResultType):
        ok, err = valtype.ok, valtype.err
        return ResultType(
            None if ok is None else wit_type_of(ok), None if err is None else wit_type_of(err)
        )
    if isinstance(valtype, wt.FlagsType):
        return FlagsType(tuple(valtype.names))
    if isinstance(valtype, wt.OwnType):
        return OwnType(valtype.ty)
    if isinstance(valtype, wt.BorrowType):
        return BorrowType(valtype.ty)
    raise InvalidComponent(f"mighty cannot carry values of this component type: {valtype!r}")


# -- reading types straight from the C API ------------------------------------------------------

_C_PRIMS: Final[dict[int, PrimitiveType]] = {
    ffi.WASMTIME_COMPONENT_VALTYPE_BOOL.value: BOOL,
    ffi.WASMTIME_COMPONENT_VALTYPE_S8.value: S8,
    ffi.WASMTIME_COMPONENT_VALTYPE_S16.value: S16,
    ffi.WASMTIME_COMPONENT_VALTYPE_S32.value: S32,
    ffi.WASMTIME_COMPONENT_VALTYPE_S64.value: S64,
    ffi.WASMTIME_COMPONENT_VALTYPE_U8.value: U8,
    ffi.WASMTIME_COMPONENT_VALTYPE_U16.value: U16,
    ffi.WASMTIME_COMPONENT_VALTYPE_U32.value: U32,
    ffi.WASMTIME_COMPONENT_VALTYPE_U64.value: U64,
    ffi.WASMTIME_COMPONENT_VALTYPE_F32.value: F32,
    ffi.WASMTIME_COMPONENT_VALTYPE_F64.value: F64,
    ffi.WASMTIME_COMPONENT_VALTYPE_CHAR.value: CHAR,
    ffi.WASMTIME_COMPONENT_VALTYPE_STRING.value: STRING,
}


def _name(ptr: Any, length: Any) -> str:
    return ctypes.string_at(ptr, length.value).decode("utf-8")


def _from_c(vt: Any) -> WitType:
    """Our type for an owned ``wasmtime_component_valtype_t``; consumes it."""
    kind = vt.kind
    prim = _C_PRIMS.get(kind)
    if prim is not None:
        return prim
    if kind in (
        ffi.WASMTIME_COMPONENT_VALTYPE_OWN.value,
        ffi.WASMTIME_COMPONENT_VALTYPE_BORROW.value,
    ):
        # The ResourceType wrapper takes the valtype's only allocation, so no valtype_delete.
        is_own = kind == ffi.WASMTIME_COMPONENT_VALTYPE_OWN.value
        res = resource_type_from_ptr(vt.of.own if is_own else vt.of.borrow)
        return OwnType(res) if is_own else BorrowType(res)
    try:
        return _compound_from_c(vt, kind)
    finally:
        ffi.wasmtime_component_valtype_delete(ctypes.byref(vt))


def _child(getter: Any, *args: Any) -> WitType:
    out = ffi.wasmtime_component_valtype_t()
    getter(*args, ctypes.byref(out))
    return _from_c(out)


def _compound_from_c(vt: Any, kind: int) -> WitType:
    byref = ctypes.byref
    if kind == ffi.WASMTIME_COMPONENT_VALTYPE_LIST.value:
        return ListType(_child(ffi.wasmtime_component_list_type_element, vt.of.list))
    if kind == ffi.WASMTIME_COMPONENT_VALTYPE_OPTION.value:
        return OptionType(_child(ffi.wasmtime_component_option_type_ty, vt.of.option))
    if kind == VALTYPE_MAP:
        return MapType(
            _child(ffi.wasmtime_component_map_type_key, vt.of.map),
            _child(ffi.wasmtime_component_map_type_value, vt.of.map),
        )
    name_ptr = ctypes.POINTER(ctypes.c_char)()
    name_len = ctypes.c_size_t()
    if kind == ffi.WASMTIME_COMPONENT_VALTYPE_RECORD.value:
        ty = vt.of.record
        fields = []
        for i in range(ffi.wasmtime_component_record_type_field_count(ty)):
            out = ffi.wasmtime_component_valtype_t()
            ffi.wasmtime_component_record_type_field_nth(
                ty, i, byref(name_ptr), byref(name_len), byref(out)
            )
            fields.append((_name(name_ptr, name_len), _from_c(out)))
        return RecordType(tuple(fields))
    if kind == ffi.WASMTIME_COMPONENT_VALTYPE_TUPLE.value:
        ty = vt.of.tuple
        return TupleType(
            tuple(
                _child(ffi.wasmtime_component_tuple_type_types_nth, ty, i)
                for i in range(ffi.wasmtime_component_tuple_type_types_count(ty))
            )
        )
    if kind == ffi.WASMTIME_COMPONENT_VALTYPE_VARIANT.value:
        ty = vt.of.variant
        cases: list[tuple[str, WitType | None]] = []
        for i in range(ffi.wasmtime_component_variant_type_case_count(ty)):
            has = ctypes.c_bool()
            out = ffi.wasmtime_component_valtype_t()
            ffi.wasmtime_component_variant_type_case_nth(
                ty, i, byref(name_ptr), byref(name_len), byref(has), byref(out)
            )
            cases.append((_name(name_ptr, name_len), _from_c(out) if has.value else None))
        return VariantType(tuple(cases))
    if kind == ffi.WASMTIME_COMPONENT_VALTYPE_ENUM.value:
        ty = vt.of.enum_
        names = []
        for i in range(ffi.wasmtime_component_enum_type_names_count(ty)):
            ffi.wasmtime_component_enum_type_names_nth(ty, i, byref(name_ptr), byref(name_len))
            names.append(_name(name_ptr, name_len))
        return EnumType(tuple(names))
    if kind == ffi.WASMTIME_COMPONENT_VALTYPE_FLAGS.value:
        ty = vt.of.flags
        names = []
        for i in range(ffi.wasmtime_component_flags_type_names_count(ty)):
            ffi.wasmtime_component_flags_type_names_nth(ty, i, byref(name_ptr), byref(name_len))
            names.append(_name(name_ptr, name_len))
        return FlagsType(tuple(names))
    if kind == ffi.WASMTIME_COMPONENT_VALTYPE_RESULT.value:
        ty = vt.of.result
        sides: list[WitType | None] = []
        for getter in (
            ffi.wasmtime_component_result_type_ok,
            ffi.wasmtime_component_result_type_err,
        ):
            out = ffi.wasmtime_component_valtype_t()
            sides.append(_from_c(out) if getter(ty, byref(out)) else None)
        return ResultType(sides[0], sides[1])
    raise InvalidComponent(f"mighty cannot carry values of component type kind {kind}")


@dataclass(frozen=True, slots=True)
class FuncSig:
    """A component function's signature: named parameters and an optional result."""

    params: tuple[tuple[str, WitType], ...]
    result: WitType | None

    @classmethod
    def from_func_type(cls, fty: FuncType) -> FuncSig:
        """Read the signature from a wasmtime ``FuncType`` (unlike wasmtime-py, knows ``map``)."""
        ptr = fty.ptr()
        byref = ctypes.byref
        params = []
        name_ptr = ctypes.POINTER(ctypes.c_char)()
        name_len = ctypes.c_size_t()
        for i in range(ffi.wasmtime_component_func_type_param_count(ptr)):
            out = ffi.wasmtime_component_valtype_t()
            ffi.wasmtime_component_func_type_param_nth(
                ptr, i, byref(name_ptr), byref(name_len), byref(out)
            )
            params.append((_name(name_ptr, name_len), _from_c(out)))
        out = ffi.wasmtime_component_valtype_t()
        result = _from_c(out) if ffi.wasmtime_component_func_type_result(ptr, byref(out)) else None
        return cls(tuple(params), result)

    def __str__(self) -> str:
        params = ", ".join(f"{n}: {t}" for n, t in self.params)
        return f"func({params})" + ("" if self.result is None else f" -> {self.result}")
