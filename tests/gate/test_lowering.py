"""The gate's fast paths (arguments read at their address, results written as bytes) do
what the codec does, and refuse what it refuses."""

from __future__ import annotations

import ctypes
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from wasmtime import _ffi as ffi

from mighty._errors import ArgumentError
from mighty.abi import (
    BOOL,
    S8,
    S16,
    U8,
    U32,
    U64,
    Err,
    FuncCodec,
    FuncSig,
    ListType,
    Ok,
    RecordType,
    ResultType,
)
from mighty.gate._gate import _getter, _lowerer

_VAL = ffi.wasmtime_component_val_t

SIGS = [
    FuncSig((), ResultType(None, U32)),  # result<_, u32>: Ok of nothing as bytes
    FuncSig((), ResultType(U64, U8)),  # result<u64, u8>: Ok of an int, boxed
    FuncSig((), ResultType(S16, None)),
    FuncSig((), U32),  # a bare int: the whole slot at once
    FuncSig((), S16),
    # wasi:clocks datetime: a cloned template with its integers written in place
    FuncSig((), RecordType((("seconds", U64), ("nanoseconds", U32)))),
    FuncSig((), RecordType((("a", S8),))),
    FuncSig((), ListType(U8)),  # bytes: the element slots in one buffer
]

ints = st.integers(-(2**70), 2**70) | st.integers(-300, 300)

values = st.one_of(
    st.integers(-(2**70), 2**70),
    st.booleans(),
    st.none(),
    st.text(max_size=2),
    st.builds(Ok, st.none() | st.integers(-(2**70), 2**70) | st.booleans()),
    st.builds(Err, st.none() | st.integers(-(2**10), 2**10)),
    st.dictionaries(
        st.sampled_from(["seconds", "nanoseconds", "a", "b"]), ints | st.booleans() | st.none()
    ),
    st.binary(max_size=5000),  # both sides of the small-list cut-off
    st.binary(max_size=20).map(bytearray),
    st.lists(st.integers(-2, 300), max_size=4),
)


def _through(lower: Any, codec: FuncCodec, value: Any) -> Any:
    """Lower ``value`` into a fresh slot, then lift it back (freeing what it holds)."""
    slot = _VAL()
    try:
        lower(None, None, value, ctypes.addressof(slot))
    except ArgumentError as exc:
        return ("refused", str(exc))
    return codec.lift_result(slot)


@given(st.sampled_from(SIGS), values)
def test_fast_lowering_is_the_codecs(sig: FuncSig, value: Any) -> None:
    """Every value, right or wrong for the type: the gate's lowerer gives back what the
    codec's own lowering gives back, or the same refusal."""
    codec = FuncCodec(sig)

    def generic(_ctx: Any, store: Any, result: Any, address: int) -> None:
        codec.lower_result_into(store, result, _VAL.from_address(address))

    assert _through(_lowerer(codec, None), codec, value) == _through(generic, codec, value)


@pytest.mark.parametrize("sig", SIGS, ids=str)
@given(
    seen=st.lists(values | st.builds(Ok, st.integers(0, 300)) | st.integers(-300, 300), max_size=8)
)
def test_a_lowerer_used_again_is_the_codecs(sig: FuncSig, seen: list[Any]) -> None:
    """One lowerer serving many results, each value twice (what it keeps from one result for
    the next, e.g. an Ok(int) payload ready to box, changes nothing): the codec's answers."""
    codec = FuncCodec(sig)
    lower = _lowerer(codec, None)

    def generic(_ctx: Any, store: Any, result: Any, address: int) -> None:
        codec.lower_result_into(store, result, _VAL.from_address(address))

    for value in seen + seen:
        assert _through(lower, codec, value) == _through(generic, codec, value)


@pytest.mark.parametrize(
    ("sig", "value"),
    [
        (SIGS[0], Ok(None)),
        (SIGS[1], Ok(2**64 - 1)),
        (SIGS[3], 2**32 - 1),
        (SIGS[4], -(2**15)),
        (SIGS[5], {"seconds": 2**64 - 1, "nanoseconds": 999_999_999}),
        (SIGS[6], {"a": -128}),
        (SIGS[7], b""),
        (SIGS[7], bytes(range(256)) * 16),
    ],
)
def test_fast_lowering_round_trips(sig: FuncSig, value: Any) -> None:
    """The values the fast paths take come back as they went in."""
    codec = FuncCodec(sig)
    assert _through(_lowerer(codec, None), codec, value) == value


def _arg_values(t: Any) -> st.SearchStrategy[Any]:
    if t == BOOL:
        return st.booleans()
    if isinstance(t, ListType):
        return st.binary(max_size=5000)  # both sides of the small-list cut-off
    lo, hi = {"u8": (0, 255), "u32": (0, 2**32 - 1), "u64": (0, 2**64 - 1)}.get(
        t.name, (-(2**15), 2**15 - 1)
    )
    return st.integers(lo, hi)


@given(st.sampled_from([U8, U32, U64, S16, BOOL, ListType(U8)]).flatmap(
    lambda t: st.tuples(st.just(t), _arg_values(t))
))  # fmt: skip
def test_arguments_read_at_their_address_are_the_codecs(case: tuple[Any, Any]) -> None:
    """An argument the gate reads straight from its value's address is what the codec lifts."""
    t, value = case
    codec = FuncCodec(FuncSig((("x", t),), None))
    params = codec.lower_params(None, [value])
    try:
        lift = codec.lifters()[0]
        read = _getter(t, lift)
        assert read(ctypes.addressof(params.array[0])) == lift(params.array[0]) == value
    finally:
        codec.free_params(params.array, 1)
