"""The replayer's argument check against what it stands for: ``recorded == _refs(args)``."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from mighty.abi import Ok
from mighty.gate import Handle, ResourceKind
from mighty.trace._replay import _refs, _same_args
from mighty.trace._values import HandleRef

_STREAM = ResourceKind("wasi:io/streams", "output-stream")
_FILE = ResourceKind("wasi:filesystem/types", "descriptor")
_NAN = math.nan

plain = (
    st.integers(-3, 3)
    | st.booleans()
    | st.none()
    | st.binary(max_size=3)
    | st.text(max_size=2)
    | st.sampled_from([0.0, -0.0, 1.0, _NAN, math.inf])
)
handles = st.builds(Handle, st.sampled_from([_STREAM, _FILE]), st.integers(0, 3))
refs = st.builds(
    HandleRef,
    st.sampled_from(["wasi:io/streams", "wasi:filesystem/types"]),
    st.sampled_from(["output-stream", "descriptor"]),
    st.integers(0, 3),
)
# What a guest passes (Handles, plain values, some nested) and what a trace may hold.
live = st.lists(
    plain | handles | st.lists(plain | handles, max_size=2) | st.builds(Ok, plain), max_size=3
)
recorded = (
    st.lists(plain | refs | st.lists(plain | refs, max_size=2) | st.builds(Ok, plain), max_size=3)
    | plain
)


@given(recorded, live)
def test_same_args_is_list_equality_of_the_refs(want: Any, args: list[Any]) -> None:
    assert _same_args(want, args) == (want == _refs(args))


@given(live)
def test_the_refs_of_the_args_themselves_match(args: list[Any]) -> None:
    want = _refs(args)
    # Equal but not identical values (and NaN, unequal to itself, found by identity in the list).
    assert _same_args(want, args) == (want == _refs(args))
    if not any(isinstance(v, float) and v != v for v in want):
        assert _same_args([_copy(v) for v in want], args)


def _copy(value: Any) -> Any:
    if isinstance(value, HandleRef):
        return HandleRef(value.interface, value.name, value.rep)
    if isinstance(value, bytes):
        return bytes(bytearray(value))
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value
