"""Hypothesis strategies: random WIT types of bounded depth, and values of a given type."""

from __future__ import annotations

import math
import struct
from typing import Any

from hypothesis import strategies as st

from mighty.abi import (
    PRIMITIVES,
    EnumType,
    Err,
    FlagsType,
    ListType,
    MapType,
    Ok,
    OptionType,
    PrimitiveType,
    RecordType,
    ResultType,
    Some,
    TupleType,
    Variant,
    VariantType,
    WitType,
)
from mighty.abi._types import INT_RANGES

_NAMES = st.lists(
    st.sampled_from(["a", "b", "c-d", "e", "f-g-h", "x1"]), min_size=1, max_size=4, unique=True
)
_KEYS = st.sampled_from([p for p in PRIMITIVES if p.name not in ("f32", "f64")])


def wit_types(depth: int = 3, *, maps: bool = True) -> st.SearchStrategy[WitType]:
    """Random WIT types nested at most ``depth`` deep (no resources)."""
    prims: st.SearchStrategy[WitType] = st.sampled_from(PRIMITIVES)
    leaves = st.one_of(
        prims,
        _NAMES.map(lambda n: EnumType(tuple(n))),
        _NAMES.map(lambda n: FlagsType(tuple(n))),
    )
    if depth <= 0:
        return leaves
    inner = wit_types(depth - 1, maps=maps)
    opt_inner = st.none() | inner
    compound = [
        inner.map(ListType),
        inner.map(OptionType),
        st.tuples(opt_inner, opt_inner).map(lambda p: ResultType(*p)),
        st.lists(inner, min_size=1, max_size=3).map(lambda ts: TupleType(tuple(ts))),
        _NAMES.flatmap(
            lambda ns: st.tuples(*[inner for _ in ns]).map(
                lambda ts: RecordType(tuple(zip(ns, ts, strict=True)))
            )
        ),
        _NAMES.flatmap(
            lambda ns: st.tuples(*[opt_inner for _ in ns]).map(
                lambda ts: VariantType(tuple(zip(ns, ts, strict=True)))
            )
        ),
    ]
    if maps:
        compound.append(st.tuples(_KEYS, inner).map(lambda kv: MapType(*kv)))
    return st.one_of(leaves, *compound)


def _f32_of(bits: int) -> float:
    return float(struct.unpack("<f", struct.pack("<I", bits))[0])


# Every f32 by its bit pattern (NaN as the one canonical NaN): hypothesis's own
# `floats(width=32)` can fail inside its shrinker ("float too large to pack") near f32's max.
_F32 = st.one_of(
    st.integers(0, 2**32 - 1).map(_f32_of).filter(lambda x: not math.isnan(x)),
    st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0]),
)


def values(wt: WitType) -> st.SearchStrategy[Any]:
    """Random Python values of type ``wt`` in mighty.abi's representation."""
    if isinstance(wt, PrimitiveType):
        name = wt.name
        if name == "bool":
            return st.booleans()
        if name in INT_RANGES:
            lo, hi = INT_RANGES[name]
            return st.integers(lo, hi)
        if name == "f32":
            return _F32
        if name == "f64":
            return st.floats()
        if name == "char":
            return st.characters(codec="utf-8")
        return st.text(st.characters(codec="utf-8"), max_size=20)
    if isinstance(wt, ListType):
        if wt.element == PrimitiveType("u8"):
            return st.binary(max_size=40)
        return st.lists(values(wt.element), max_size=4)
    if isinstance(wt, RecordType):
        return st.fixed_dictionaries({n: values(t) for n, t in wt.fields})
    if isinstance(wt, TupleType):
        return st.tuples(*[values(t) for t in wt.elements])
    if isinstance(wt, VariantType):
        return st.one_of(
            *[
                st.just(Variant(n)) if t is None else values(t).map(lambda v, n=n: Variant(n, v))
                for n, t in wt.cases
            ]
        )
    if isinstance(wt, EnumType):
        return st.sampled_from(wt.names)
    if isinstance(wt, FlagsType):
        return st.frozensets(st.sampled_from(wt.names))
    if isinstance(wt, OptionType):
        some = values(wt.payload)
        if isinstance(wt.payload, OptionType):
            some = some.map(Some)
        return st.none() | some
    if isinstance(wt, ResultType):
        ok = st.just(Ok()) if wt.ok is None else values(wt.ok).map(Ok)
        err = st.just(Err()) if wt.err is None else values(wt.err).map(Err)
        return ok | err
    if isinstance(wt, MapType):
        return st.dictionaries(values(wt.key), values(wt.value), max_size=3)
    raise TypeError(wt)


def typed_values(depth: int = 3, *, maps: bool = True) -> st.SearchStrategy[tuple[WitType, Any]]:
    """A random type together with a random value of it."""
    return wit_types(depth, maps=maps).flatmap(lambda t: st.tuples(st.just(t), values(t)))


def same(a: Any, b: Any) -> bool:
    """Equality that treats NaN as equal to NaN, through every container."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (a != a and b != b)
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (Ok, Err, Some)):
        return same(a.value, b.value)
    if isinstance(a, Variant):
        return a.case == b.case and same(a.value, b.value)
    return bool(a == b)
