"""The guest SDK's CBOR codec (guests/sdk/mighty_agent/_cbor.py), run here in CPython: its fast
paths write the same bytes and read the same values, with the same errors, as the plain
recursive codec it replaced (tests/agents/_guest_cbor_reference.py, the c04a061 code).

Bodies a guest encodes are recorded in traces (an ask's message is an import argument), so a
byte that differed would make an existing trace diverge under ``policy = "strict"``."""

from __future__ import annotations

import collections
import enum
import importlib.util
import math
import struct
from pathlib import Path
from types import ModuleType
from typing import Any

import cbor2
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FAST = _load("guest_cbor_fast", ROOT / "guests" / "sdk" / "mighty_agent" / "_cbor.py")
OLD = _load("guest_cbor_reference", Path(__file__).parent / "_guest_cbor_reference.py")


class Colour(enum.IntEnum):
    RED = 1
    BIG = 70_000


class Text(str):
    __slots__ = ()


class Blob(bytes):
    __slots__ = ()


class Number(float):
    __slots__ = ()


def _odd(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Subclasses and other buffer types, which the fast paths leave to the generic chain."""
    return st.one_of(
        st.sampled_from([Colour.RED, Colour.BIG, True, False]),
        st.text(max_size=30).map(Text),
        st.binary(max_size=30).map(Blob),
        st.binary(max_size=30).map(bytearray),
        st.binary(max_size=30).map(memoryview),
        st.floats().map(Number),
        st.lists(values, max_size=3).map(tuple),
        st.dictionaries(st.text(max_size=4), values, max_size=3).map(collections.OrderedDict),
    )


scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**64), max_value=2**64 - 1)
    | st.integers(min_value=-30, max_value=30)
    | st.integers(min_value=-(2**70), max_value=2**70)  # out of range too
    | st.floats()
    | st.text(max_size=30)
    | st.text(max_size=3)
    | st.binary(max_size=30)
)

values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=30)
        | st.dictionaries(
            st.text(max_size=30) | st.integers(-5, 30) | st.none(), inner, max_size=30
        )
        | _odd(inner)
    ),
    max_leaves=40,
)


def _outcome(fn: Any, *args: Any) -> tuple[str, str]:
    """What a call gives, comparable across the two codecs: (type, repr) of the value, or of
    the exception and its message."""
    try:
        value = fn(*args)
    except Exception as exc:  # noqa: BLE001 -- the error is the outcome being compared
        return f"raises {type(exc).__name__}", str(exc)
    return type(value).__name__, repr(value)


def _nested(depth: int, leaf: Any, kind: str) -> Any:
    for _ in range(depth):
        leaf = [leaf] if kind == "list" else {"k": leaf}
    return leaf


@given(values)
@example(_nested(64, 1, "list"))
@example(_nested(65, 1, "list"))
@example(_nested(64, "x", "map"))
@example(_nested(65, "x", "map"))
@example(_nested(63, {"a": "b"}, "map"))
@example({"\ud800": 1})
@example(_nested(64, {"\ud800": 1}, "map"))  # too deep is said before the bad key
@example(_nested(63, {"\ud800": 1}, "map"))
@example({"k": "\udfff"})
@example(2**64)
@example(-(2**64) - 1)
@example(-(2**64))
@example({(1, 2): 3})
@example({1j: 1})
def test_fast_encoder_writes_the_reference_bytes(value: Any) -> None:
    """The same bytes for every value, the same error (type and text) where it fails."""
    assert _outcome(FAST.dumps, value) == _outcome(OLD.dumps, value)


@given(values)
def test_fast_codec_round_trips_through_cbor2(value: Any) -> None:
    """What encodes decodes back to what cbor2 reads from the same bytes, and cbor2's own
    encoding of it decodes the same."""
    try:
        encoded = FAST.dumps(value)
    except (ValueError, TypeError, UnicodeEncodeError):
        return
    assert _outcome(FAST.loads, encoded) == _outcome(OLD.loads, encoded)
    assert repr(FAST.loads(encoded)) == repr(cbor2.loads(encoded))


def _items(draw: st.DrawFn, depth: int) -> bytes:
    """A CBOR-ish byte string biased to the shapes the fast paths take (short text keys, small
    ints, nested maps), with truncation, bad lengths and bad UTF-8 now and then."""
    kind = draw(st.integers(0, 9))
    if kind == 0 or depth > 3:
        return draw(st.binary(max_size=6))
    if kind in (1, 2):
        return bytes([draw(st.integers(0, 0x1F))])
    if kind == 3:
        raw = draw(st.binary(max_size=30) | st.text(max_size=10).map(str.encode))
        return bytes([0x60 | min(len(raw) + draw(st.integers(-1, 1)), 23) % 24]) + raw
    if kind == 4:
        return draw(st.sampled_from([b"\xf4", b"\xf5", b"\xf6", b"\xf7", b"\xf8", b"\xf9\x3c"]))
    if kind == 5:
        return bytes([0xC0 | draw(st.integers(0, 28))]) + _items(draw, depth + 1)
    n = draw(st.integers(0, 5))
    head = bytes([(0xA0 if kind < 8 else 0x80) | (n + draw(st.integers(0, 1)))])
    return head + b"".join(_items(draw, depth + 1) for _ in range(n * (2 if kind < 8 else 1)))


@st.composite
def cbor_ish(draw: st.DrawFn) -> bytes:
    return _items(draw, 0)


@given(st.binary(max_size=64) | cbor_ish())
@example(b"")
@example(b"\xa1")
@example(b"\xa1\x61")
@example(b"\xa1\x62a")
@example(b"\xa1\x61a\x62b")
@example(b"\xa1\x61a\x61\xff")
@example(b"\xa1\x61\xffa")
@example(b"\xa1\x81\x01\x01")
@example(b"\xa1\x61a\x01\x00")
@example(b"\x1c")
@example(b"\x19\x01")
@example(b"\xf9\x3c\x00")
@example(b"\xfa\x3f\x80\x00\x00")
@example(b"\xc1\xa1\x61a\x01")
@example(FAST.dumps(_nested(63, {"a": "b"}, "map")))
@example(b"\xa1\x61k" * 64 + b"\xa1\x61a\x61b")  # the inner map's key one level too deep
@example(b"\xa1\x61k" * 64 + b"\x01")
@example(b"\xa1\x61k" * 65 + b"\x01")
@example(b"\x81" * 65 + b"\x01")
@example(b"\xa1\xa0\x00")  # a map as a key: refused (a ValueError), not a TypeError
@example(b"\xa1\x80\x18\x00")
@example(b"\x81\xa1\xa0\x19\x00\x00")
def test_fast_decoder_reads_what_the_reference_reads(data: bytes) -> None:
    """The same value, or the same error (type and text), from any bytes."""
    assert _outcome(FAST.loads, data) == _outcome(OLD.loads, data)
    assert _outcome(FAST.loads, bytearray(data)) == _outcome(OLD.loads, bytearray(data))
    assert _outcome(FAST.loads, memoryview(data)) == _outcome(OLD.loads, memoryview(data))


def test_text_cache_is_bounded_and_keeps_short_strings_only() -> None:
    """The encoded-text cache holds at most its bound, and nothing of 24 bytes or more."""
    for i in range(2000):
        FAST.dumps({f"key-{i}": f"value-{i}", "x" * (24 + i % 5): i})
    assert len(FAST._TEXT) <= 512
    assert all(len(data) <= 24 for data in FAST._TEXT.values())
    assert FAST.dumps({"key-0": "value-0"}) == OLD.dumps({"key-0": "value-0"})


@pytest.mark.parametrize("number", [0.0, -0.0, math.inf, -math.inf, 1.5, 1e308, math.nan])
def test_floats_are_eight_bytes_as_before(number: float) -> None:
    """Every float is a double (major 7, 27), as before: never shortened to half or single."""
    assert FAST.dumps(number) == OLD.dumps(number) == b"\xfb" + struct.pack(">d", number)
