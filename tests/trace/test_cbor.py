"""The closed CBOR decoder's fast path against its reference: same value or same refusal."""

from __future__ import annotations

from typing import Any

import cbor2
from hypothesis import given
from hypothesis import strategies as st

from mighty.trace._cbor import CBORInvalid, decode, decode_reference
from mighty.trace._values import MAX_DEPTH, value_from_tag


def _outcome(fn: Any, payload: bytes, max_depth: int, max_items: int) -> tuple[str, Any]:
    try:
        value = fn(payload, value_from_tag, max_depth, max_items)
    except CBORInvalid as exc:
        return "refused", (exc.reason, exc.at)
    return "value", (repr(value), _types(value))


def _types(value: Any) -> Any:
    """The value's shape with its types, so True and 1 (equal in Python) are told apart."""
    if isinstance(value, list | tuple):
        return (type(value).__name__, [_types(v) for v in value])
    if isinstance(value, dict):
        return ("dict", [(_types(k), _types(v)) for k, v in value.items()])
    return type(value).__name__


def _same(payload: bytes, max_depth: int = MAX_DEPTH, max_items: int = 1 << 21) -> None:
    fast = _outcome(decode, payload, max_depth, max_items)
    reference = _outcome(decode_reference, payload, max_depth, max_items)
    assert fast == reference, payload.hex()


leaves = (
    st.integers(-(2**64), 2**64 - 1)
    | st.text(max_size=30)
    | st.binary(max_size=30)
    | st.booleans()
    | st.none()
    | st.floats()
)
# Tags of the trace's table (and some that are not), with contents of any shape.
tags = st.builds(
    cbor2.CBORTag,
    st.sampled_from([27000, 27002, 27003, 27005, 27006, 27007, 27008, 1, 258]),
    leaves,
)
values = st.recursive(
    leaves | tags,
    lambda inner: (
        st.lists(inner, max_size=6)
        | st.dictionaries(st.text(max_size=6) | st.integers(0, 30), inner, max_size=6)
        | st.builds(cbor2.CBORTag, st.sampled_from([27000, 27002, 27004, 27006]), inner)
    ),
    max_leaves=30,
)


@given(values)
def test_well_formed_payloads_decode_alike(value: Any) -> None:
    _same(cbor2.dumps(value))


@given(values, st.data())
def test_damaged_payloads_are_refused_alike(value: Any, data: st.DataObject) -> None:
    payload = bytearray(cbor2.dumps(value))
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(payload) - 1))
        payload[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(payload)))
    _same(bytes(payload[:cut]))
    _same(bytes(payload))


@given(st.binary(max_size=64))
def test_random_bytes_are_refused_alike(payload: bytes) -> None:
    _same(payload)


@given(values, st.integers(0, 6), st.integers(0, 40))
def test_depth_and_item_limits_alike(value: Any, max_depth: int, max_items: int) -> None:
    _same(cbor2.dumps(value), max_depth, max_items)


def test_short_items_in_containers_take_the_fast_path() -> None:
    # Keys, small ints, short text and bytes inside a map and an array, as records hold them.
    payload = cbor2.dumps({"k": "import", "s": 7, "args": [1, b"ab", "x", None, True], "z": ""})
    assert decode(payload, value_from_tag, MAX_DEPTH) == {
        "k": "import",
        "s": 7,
        "args": [1, b"ab", "x", None, True],
        "z": "",
    }
    _same(payload)
    _same(payload, max_items=5)
