"""The gate's result-slot fast paths write what the codec writes, and refuse what it refuses."""

from __future__ import annotations

import ctypes
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from wasmtime import _ffi as ffi

from mighty._errors import ArgumentError
from mighty.abi import S16, U8, U32, U64, Err, FuncCodec, FuncSig, Ok, ResultType
from mighty.gate._gate import _lowerer

_VAL = ffi.wasmtime_component_val_t

SIGS = [
    FuncSig((), ResultType(None, U32)),  # result<_, u32>: Ok of nothing as bytes
    FuncSig((), ResultType(U64, U8)),  # result<u64, u8>: Ok of an int, boxed
    FuncSig((), ResultType(S16, None)),
    FuncSig((), U32),  # a bare int: the whole slot at once
    FuncSig((), S16),
]

values = st.one_of(
    st.integers(-(2**70), 2**70),
    st.booleans(),
    st.none(),
    st.text(max_size=2),
    st.builds(Ok, st.none() | st.integers(-(2**70), 2**70) | st.booleans()),
    st.builds(Err, st.none() | st.integers(-(2**10), 2**10)),
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


@pytest.mark.parametrize(
    ("sig", "value"),
    [(SIGS[0], Ok(None)), (SIGS[1], Ok(2**64 - 1)), (SIGS[3], 2**32 - 1), (SIGS[4], -(2**15))],
)
def test_fast_lowering_round_trips(sig: FuncSig, value: Any) -> None:
    """The values the fast paths take come back as they went in."""
    codec = FuncCodec(sig)
    assert _through(_lowerer(codec, None), codec, value) == value
