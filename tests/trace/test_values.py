"""The lossless value encoding of traces: mighty values <-> CBOR-able data."""

from __future__ import annotations

import math
import struct
from typing import Any

import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mighty.abi import Err, Ok, Some, Variant
from mighty.trace import HandleRef, TraceError, decode_value, encode_value
from mighty.trace._cbor import decode
from mighty.trace._values import MAX_DEPTH, TAG_FLOAT, TAG_TUPLE, value_from_tag

_DOUBLE = struct.Struct(">d")


def same(a: Any, b: Any) -> bool:
    """Equal with the same types all the way down, floats compared bit for bit."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return _DOUBLE.pack(a) == _DOUBLE.pack(b)
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is dict:
        return len(a) == len(b) and all(
            same(ka, kb) and same(va, vb)
            for (ka, va), (kb, vb) in zip(a.items(), b.items(), strict=True)
        )
    if type(a) is frozenset:
        return a == b and all(any(x == y and same(x, y) for y in b) for x in a)
    if type(a) in (Ok, Err, Some):
        return same(a.value, b.value)
    if type(a) is Variant:
        return a.case == b.case and same(a.value, b.value)
    return bool(a == b)


def _any_double(bits: int) -> float:
    return float(_DOUBLE.unpack(bits.to_bytes(8, "big"))[0])


floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(0, 2**64 - 1).map(_any_double),  # every bit pattern, NaN payloads included
    st.sampled_from([-0.0, 0.0, _any_double(0x7FF0000000000001), _any_double(0xFFF8DEADBEEF0001)]),
)
ints = st.integers(-(2**64), 2**64 - 1) | st.integers(-(2**200), 2**200)
handles = st.builds(
    HandleRef, st.sampled_from(["wasi:io/streams", "x:y/z"]), st.text(max_size=8), ints
)
names = st.text(max_size=6)
hashable_leaves = st.none() | st.booleans() | ints | st.text(max_size=8) | st.binary(max_size=8)
hashables = st.recursive(
    hashable_leaves,
    lambda inner: (
        st.lists(inner, max_size=3).map(tuple)
        | st.frozensets(inner, max_size=3)
        | inner.map(Ok)
        | inner.map(Err)
        | inner.map(Some)
        | st.builds(Variant, names, inner)
        | handles
    ),
    max_leaves=6,
)
leaves = hashable_leaves | floats | handles | st.binary(max_size=64)


def _containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=4).map(tuple)
        | st.dictionaries(names, inner, max_size=4)
        | st.dictionaries(hashables, inner, max_size=4)
        | st.frozensets(hashables, max_size=4)
        | st.frozensets(names, max_size=4)
        | inner.map(Ok)
        | inner.map(Err)
        | inner.map(Some)
        | st.builds(Variant, names, inner)
    )


values = st.recursive(leaves, _containers, max_leaves=20)


@given(values)
def test_any_value_round_trips(value: Any) -> None:
    """Every value of the model decodes to exactly what was encoded."""
    assert same(decode_value(encode_value(value)), value)


@given(values)
def test_encoding_survives_cbor_bytes(value: Any) -> None:
    """Encoded, written by cbor2 and read by the trace's closed decoder, a value is unchanged."""
    back = decode(cbor2.dumps(encode_value(value)), value_from_tag, MAX_DEPTH)
    assert same(back, value)


@given(st.frozensets(st.text(max_size=5), max_size=6))
def test_sets_encode_the_same_whatever_their_order(flags: frozenset[str]) -> None:
    """A set's encoding does not depend on iteration order, so equal values give equal bytes."""
    reordered = frozenset(sorted(flags, reverse=True))
    assert cbor2.dumps(encode_value(flags)) == cbor2.dumps(encode_value(reordered))


def test_float_bits_survive() -> None:
    """NaN payloads, a signalling NaN and negative zero keep every bit."""
    for bits in (0x7FF0000000000001, 0xFFF8DEADBEEF0001, 0x8000000000000000, 0x7FF8000000000000):
        x = _any_double(bits)
        back = decode_value(encode_value(x))
        assert _DOUBLE.pack(back) == bits.to_bytes(8, "big")
    assert math.copysign(1.0, decode_value(encode_value(-0.0))) == -1.0


def test_big_ints_round_trip() -> None:
    """Integers past the CBOR range go through a tag and come back exactly."""
    for n in (2**64, -(2**64) - 1, 2**300, -(2**300), 2**64 - 1, -(2**64)):
        assert decode_value(encode_value(n)) == n


def test_lenient_inputs_decode_as_their_canonical_types() -> None:
    """set decodes as frozenset, bytearray and memoryview as bytes."""
    assert type(decode_value(encode_value({"a", "b"}))) is frozenset
    assert decode_value(encode_value(bytearray(b"ab"))) == b"ab"
    assert type(decode_value(encode_value(memoryview(b"ab")))) is bytes


def test_mixed_key_dict_keeps_its_order() -> None:
    """A dict with a non-str key round-trips with its insertion order."""
    d = {"z": 1, 3: 2, (1, "a"): 3, "a": 4}
    assert list(decode_value(encode_value(d)).items()) == list(d.items())


def test_unknown_type_is_refused_with_its_name_and_place() -> None:
    """An arbitrary object raises TraceError naming its type and where it sits."""

    class Gadget:
        pass

    with pytest.raises(TraceError, match=r"Gadget.*") as info:
        encode_value({"args": [1, Ok({"cfg": Gadget()})]})
    assert "args[1].<ok>.cfg" in info.value.message


def test_subclasses_are_refused() -> None:
    """A subclass of a built-in type is refused rather than flattened."""

    class Name(str):
        pass

    with pytest.raises(TraceError, match="Name"):
        encode_value([Name("x")])


def test_depth_limit_is_the_same_both_ways() -> None:
    """The deepest value the encoder accepts decodes; one level more is refused on encode."""
    v: Any = 1
    for _ in range(MAX_DEPTH):
        v = [v]
    assert decode_value(encode_value(v)) == v
    with pytest.raises(TraceError, match="deeper"):
        encode_value([v])


@pytest.mark.parametrize(
    "data",
    [
        cbor2.CBORTag(0, "2020-01-01T00:00:00Z"),
        cbor2.CBORTag(TAG_FLOAT, b"1234"),
        cbor2.CBORTag(TAG_TUPLE, "abc"),
        cbor2.CBORTag(27099, 1),
        1.5,
        {1: 2},
        object(),
    ],
)
def test_decode_refuses_what_encode_never_makes(data: Any) -> None:
    """Unknown tags, malformed tag content, native floats and odd types raise TraceError."""
    with pytest.raises(TraceError):
        decode_value(data)


def test_handle_ref_checks_its_fields() -> None:
    """A HandleRef is built from str, str, int only."""
    with pytest.raises(TypeError):
        HandleRef("i", "n", "3")  # type: ignore[arg-type]
