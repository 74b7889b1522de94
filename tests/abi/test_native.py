"""The compiled codec (host/abi/_speedups.c) against the Python codec it is the fast form of.

The compiled codec lowers what it recognises and declines the rest, which the Python codec then
takes; so for any value, valid or not, a call through either codec must come out the same: the
same value back, or the same ArgumentError. These tests hold it to that through real wasmtime
calls (export arguments and results, host-import arguments and results), mixing the two codecs
on the two sides of the boundary, with hostile values too.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mighty._errors import ArgumentError
from mighty.abi import (
    F32,
    S8,
    S64,
    STRING,
    U8,
    U64,
    EnumType,
    Err,
    FlagsType,
    FuncCodec,
    FuncSig,
    ListType,
    Ok,
    OptionType,
    RecordType,
    ResultType,
    Some,
    TupleType,
    Variant,
    VariantType,
    WitType,
)
from mighty.abi._native import native as compiled
from mighty.abi._native import use_native

from ._harness import Echo
from ._strategies import PRIMITIVES, same, typed_values, values, wit_types

pytestmark = pytest.mark.skipif(
    compiled is None, reason="the compiled codec is not built (MIGHTY_PURE_PYTHON build)"
)

_ECHOES: dict[tuple[WitType, bool, bool], Echo] = {}


def echo(wt: WitType, native: bool, native_import: bool) -> Echo:
    key = (wt, native, native_import)
    if key not in _ECHOES:
        _ECHOES[key] = Echo(wt, native=native, native_import=native_import)
    return _ECHOES[key]


def _has_flags(wt: WitType | None) -> bool:
    if wt is None:
        return False
    if isinstance(wt, FlagsType):
        return True
    if isinstance(wt, ListType):
        return _has_flags(wt.element)
    if isinstance(wt, OptionType):
        return _has_flags(wt.payload)
    if isinstance(wt, ResultType):
        return _has_flags(wt.ok) or _has_flags(wt.err)
    if isinstance(wt, TupleType):
        return any(map(_has_flags, wt.elements))
    if isinstance(wt, RecordType | VariantType):
        parts = wt.fields if isinstance(wt, RecordType) else wt.cases
        return any(_has_flags(t) for _, t in parts)
    return False


def outcome(wt: WitType, value: Any, native: bool, native_import: bool) -> tuple[str, Any]:
    try:
        return ("value", echo(wt, native, native_import).call(value))
    except ArgumentError as e:
        return ("error", (str(e), e.path))


_SIDES = [(True, True), (True, False), (False, True)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(typed_values(depth=2, maps=False), st.sampled_from(_SIDES))
def test_values_round_trip_with_the_compiled_codec_on_either_side(
    tv: tuple[WitType, Any], sides: tuple[bool, bool]
) -> None:
    """Valid values come back unchanged; the compiled path takes every one of a covered type
    (it declines nothing a user writes in the documented forms)."""
    wt, v = tv
    e = echo(wt, *sides)
    assert same(e.call(v), v)
    covered = not _has_flags(wt)
    assert (e.codec.native is not None) == (covered and sides[0])
    if e.codec.native is not None:
        assert e.paths[-1] == "compiled"


# Every integer type's bounds and one past them.
_EDGES = sorted(
    {e + d for b in (8, 16, 32, 64) for e in (-(2 ** (b - 1)), 2 ** (b - 1), 2**b) for d in (-1, 0)}
    | {-1, 0}
)


def _junk(wt: WitType) -> st.SearchStrategy[Any]:
    """Values that may or may not fit ``wt``: its own values, near misses, other types."""
    base = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.integers(-(2**65), 2**65),
        st.sampled_from(_EDGES),
        st.floats(),
        st.sampled_from([3.4028235e38, 3.4028236e38, 3.5e38, -3.4028236e38, 1e300, math.inf]),
        st.text(max_size=4),
        st.sampled_from(["\ud800", "a\udfff", "", "ab", "é"]),
        st.binary(max_size=6),
        st.binary(max_size=6).map(bytearray),
        st.binary(max_size=6).map(memoryview),
    )
    wrapped = st.recursive(
        base,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3),
            st.lists(inner, max_size=3).map(tuple),
            st.dictionaries(st.sampled_from(["a", "b", "c-d", "x1"]), inner, max_size=3),
            inner.map(Ok),
            inner.map(Err),
            inner.map(Some),
            st.tuples(st.sampled_from(["a", "b", "e", "z"]), inner).map(lambda p: Variant(*p)),
        ),
        max_leaves=6,
    )
    return st.one_of(values(wt), wrapped)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(wit_types(depth=2, maps=False).flatmap(lambda t: st.tuples(st.just(t), _junk(t))))
def test_any_value_has_the_same_outcome_through_either_codec(tv: tuple[WitType, Any]) -> None:
    """Whatever the value, the compiled codec gives what the Python codec gives: the same
    value back or the same ArgumentError (message and path)."""
    wt, v = tv
    python = outcome(wt, v, False, False)
    for sides in _SIDES:
        got = outcome(wt, v, *sides)
        assert got[0] == python[0], (sides, got, python)
        if got[0] == "value":
            assert same(got[1], python[1]), (sides, got, python)
        else:
            assert got[1] == python[1]


@pytest.mark.parametrize(
    ("wt", "value"),
    [
        (U8, 256),
        (U8, -1),
        (S8, -129),
        (U64, 2**64),
        (U64, -1),
        (S64, 2**63),
        (F32, 3.5e38),
        (F32, 10**400),
        (STRING, "a\ud800"),
        (ListType(U8), [1, 300]),
        (ListType(U8), [1, True]),
        (RecordType((("a", U8),)), {"a": 1, "b": 2}),
        (RecordType((("a", U8),)), {"b": 1}),
        (OptionType(OptionType(U8)), 5),
        (ResultType(None, U8), Ok(1)),
        (VariantType((("a", U8), ("b", None))), Variant("b", 1)),
        (VariantType((("a", U8),)), Variant("z")),
        (EnumType(("x", "y")), "z"),
        (TupleType((U8, U8)), (1, 2, 3)),
    ],
)
def test_values_that_do_not_fit_are_declined_and_reported_by_the_python_codec(
    wt: WitType, value: Any
) -> None:
    """The compiled codec declines (None: nothing kept) and the call raises the Python
    codec's ArgumentError, with its path."""
    codec = FuncCodec(FuncSig((("x", wt),), None), native=True)
    assert codec.native is not None
    assert codec.native.lower((value,)) is None
    with pytest.raises(ArgumentError) as python:
        FuncCodec(FuncSig((("x", wt),), None), native=False).lower_params(None, [value])
    assert outcome(wt, value, True, True) == ("error", (str(python.value), python.value.path))


def test_other_mappings_and_buffers_are_left_to_the_python_codec() -> None:
    """A Mapping that is not a dict and a memoryview are lowered by the Python codec."""
    from types import MappingProxyType

    wt = RecordType((("a", U8), ("b", ListType(U8))))
    value = MappingProxyType({"a": 1, "b": memoryview(b"xy")})
    e = echo(wt, True, True)
    assert e.call(value) == {"a": 1, "b": b"xy"}
    assert e.paths[-1] == "python"


class _Sly(Some):
    """A Some whose payload, when read, empties the list that holds it."""

    __slots__ = ()
    victim: ClassVar[list[Any]] = []

    def __getattribute__(self, name: str) -> Any:
        if name == "value":
            _Sly.victim.clear()
        return super().__getattribute__(name)


def test_a_value_that_changes_its_container_while_lowered_is_safe() -> None:
    """Lowering runs Python code (a subclass's attribute access): a list emptied under the
    compiled codec makes it decline; the Python codec then lowers what is left."""
    wt = ListType(OptionType(STRING))
    victim: list[Any] = ["a", None, "b"]
    victim.insert(1, _Sly("x"))
    _Sly.victim = victim
    e = echo(wt, True, True)
    got = e.call(victim)
    assert got == []  # the list was empty by the time the Python codec read it
    assert e.paths[-1] == "python"


def test_types_beyond_the_compiled_depth_use_the_python_codec() -> None:
    """A type nested deeper than the compiled codec goes is served by the Python codec."""
    wt: WitType = U8
    for _ in range(70):
        wt = OptionType(wt) if isinstance(wt, ListType) else ListType(wt)
    codec = FuncCodec(FuncSig((("x", wt),), wt), native=True)
    assert codec.native is None


def test_types_with_flags_are_not_compiled() -> None:
    """Flags (and maps, resources) are the Python codec's alone."""
    wt = RecordType((("f", FlagsType(("r", "w"))), ("n", U8)))
    assert FuncCodec(FuncSig((("x", wt),), None), native=True).native is None
    e = echo(wt, True, True)
    assert e.call({"f": frozenset({"w"}), "n": 3}) == {"f": frozenset({"w"}), "n": 3}


def test_mighty_pure_python_turns_the_compiled_codec_off(monkeypatch: pytest.MonkeyPatch) -> None:
    sig = FuncSig((("x", STRING),), STRING)
    monkeypatch.setenv("MIGHTY_PURE_PYTHON", "1")
    assert not use_native()
    assert FuncCodec(sig).native is None
    monkeypatch.delenv("MIGHTY_PURE_PYTHON")
    assert use_native()
    assert FuncCodec(sig).native is not None


_SCALAR_PROBES: list[Any] = [
    *_EDGES,
    True,
    False,
    None,
    0.5,
    -0.0,
    math.nan,
    math.inf,
    -math.inf,
    3.4028234663852886e38,  # f32's largest
    3.4028235677973366e38,  # rounds to it
    3.4028235677973367e38,  # rounds past it: out of f32's range
    -3.5e38,
    1e308,
    "",
    "a",
    "ab",
    "\ud800",
    "\U0010ffff",
    b"a",
    [1],
]


@pytest.mark.parametrize("wt", [p for p in PRIMITIVES if p.name != "string"] + [STRING])
def test_every_scalar_type_at_its_edges_has_the_same_outcome(wt: WitType) -> None:
    """Each primitive type against its own and every other type's boundaries: the compiled
    codec takes exactly what the Python codec takes, and writes the same value."""
    for probe in _SCALAR_PROBES:
        for vt in (wt, ListType(wt), OptionType(wt)):
            v = [probe] if isinstance(vt, ListType) else probe
            python = outcome(vt, v, False, False)
            for sides in _SIDES:
                got = outcome(vt, v, *sides)
                assert got[0] == python[0] and same(got[1], python[1]), (vt, v, sides, got)
