"""mighty._cbor: untrusted CBOR is plain data or refused before cbor2 decodes it."""

from __future__ import annotations

import datetime
import re
from typing import Any

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mighty._cbor import CBORRefused, loads_untrusted

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**80), 2**80)  # past 64 bits: bignums, the one tag allowed
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20)
)
PLAIN = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.dictionaries(st.text(max_size=8) | st.integers(-100, 100), inner, max_size=5)
    ),
    max_leaves=30,
)


@settings(max_examples=400)
@given(PLAIN)
def test_plain_data_decodes_as_cbor2_does(value: Any) -> None:
    """Whatever plain data cbor2 encodes, loads_untrusted gives back what cbor2.loads does."""
    data = cbor2.dumps(value)
    assert loads_untrusted(data) == cbor2.loads(data)


@pytest.mark.parametrize(
    "value",
    [
        re.compile("a+"),  # tag 35: re.compile on decode
        datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),  # tag 0/1
        frozenset({1, 2}),  # tag 258
        cbor2.CBORTag(36, "Content-Type: text/plain\n\nhello"),  # MIME: email's parser
        cbor2.CBORTag(28, [1, 2]),  # shared references (cycles)
    ],
)
def test_every_tag_is_refused(value: Any) -> None:
    """Tagged items (the semantic decoders cbor2 runs before any hook) are refused."""
    with pytest.raises(CBORRefused, match="tag"):
        loads_untrusted(cbor2.dumps(value))


def test_a_big_frame_of_mime_tags_is_refused_at_once() -> None:
    """750 KB of MIME-tagged items (22 s to decode with cbor2.loads on a node's loop) is
    refused at the first tag; the scan never reaches cbor2."""
    frame = cbor2.dumps([cbor2.CBORTag(36, "Content-Type: text/plain\n\n" + "x" * 70)] * 7500)
    assert len(frame) > 700_000
    with pytest.raises(CBORRefused, match=r"tag 36 .*\(byte 3\)"):  # the first item
        loads_untrusted(frame)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x5b" + (1 << 40).to_bytes(8, "big"),  # a byte string claiming a terabyte
        b"\x9b" + (1 << 40).to_bytes(8, "big"),  # an array claiming a trillion items
        b"\x9f\x01\xff",  # indefinite length
        b"\x01\x02",  # bytes after the item
        b"\x81" * 100 + b"\x01",  # nested 100 deep
        b"\xf8\x20",  # a simple value
        b"\xc2\x01",  # a bignum tag on something not a byte string
    ],
)
def test_malformed_data_is_refused_without_allocating(data: bytes) -> None:
    """Lengths past the end, indefinite lengths, trailing bytes, deep nesting and simple values
    are CBORRefused (a cbor2.CBORDecodeError)."""
    with pytest.raises(cbor2.CBORDecodeError):
        loads_untrusted(data)


def _reference(data: bytes) -> Any:
    """The slow path alone: the full scan, then cbor2."""
    from mighty._cbor import _scan

    _scan(data, 64, 1 << 20)
    return cbor2.loads(data)


@settings(max_examples=1000)
@given(st.binary(max_size=80) | PLAIN.map(cbor2.dumps))
def test_the_short_path_agrees_with_the_full_scan(data: bytes) -> None:
    """For any bytes, the short-body path refuses what the full scan refuses and decodes the
    rest to the same value."""
    try:
        expected: Any = _reference(data)
    except (cbor2.CBORDecodeError, RecursionError) as exc:
        expected = type(exc)
    try:
        got: Any = loads_untrusted(data)
    except (cbor2.CBORDecodeError, RecursionError) as exc:
        got = type(exc)
    if isinstance(expected, type) or isinstance(got, type):
        assert isinstance(got, type) and issubclass(got, cbor2.CBORDecodeError)
        assert isinstance(expected, type)
    else:
        assert got == expected or (got != got and expected != expected)  # NaN
