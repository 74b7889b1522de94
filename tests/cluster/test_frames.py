"""The frame codec: what it writes it reads back; anything else is a FrameError, never a crash."""

from __future__ import annotations

import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mighty.cluster import VERSION, Frame, FrameError, decode, encode
from mighty.cluster._frames import MAX_BATCH

_text = st.text(max_size=40)
_frames = st.builds(
    Frame,
    k=st.sampled_from(["send", "sends", "spawn", "stop", "ok", "err", "hb", "migrate"]),
    node=_text,
    to=_text,
    sender=_text,
    name=_text,
    body=st.binary(max_size=200),
    ttl=st.integers(0, 10_000),
    chain=st.lists(_text, max_size=5).map(tuple),
    id=_text,
    code=_text,
    msg=_text,
    type=_text,
    batch=st.lists(st.tuples(_text, st.binary(max_size=50)), min_size=1, max_size=5).map(tuple),
    extra=st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)


@given(_frames)
def test_a_frame_reads_back_as_written(frame: Frame) -> None:
    assert decode(encode(frame)) == frame


@given(st.binary(max_size=300))
def test_garbage_is_a_frame_error(data: bytes) -> None:
    reason = None
    try:
        decode(data)
    except FrameError as exc:
        reason = exc.reason
    assert reason in {None, "garbage", "field", "version", "size"}


_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10) | st.binary(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)


@given(
    st.dictionaries(
        st.sampled_from(["v", "k", "to", "body", "ttl", "chain", "x", "node", "m"]), _values
    )
)
def test_well_formed_cbor_with_wrong_fields_is_a_frame_error(data: dict[str, object]) -> None:
    try:
        frame = decode(cbor2.dumps(data))
    except FrameError:
        return
    assert frame.k in {"send", "sends", "ask", "spawn", "stop", "migrate", "hb", "ok", "err"}
    assert isinstance(frame.body, bytes)
    assert all(type(n) is str and type(b) is bytes for n, b in frame.batch)
    assert frame.k != "sends" or frame.batch


def test_a_newer_version_is_refused_as_such() -> None:
    data = cbor2.dumps({"v": VERSION + 1, "k": "send", "to": "echo:1"})
    with pytest.raises(FrameError, match="newer") as caught:
        decode(data)
    assert caught.value.reason == "version"


def test_size_is_checked_before_parsing() -> None:
    with pytest.raises(FrameError) as caught:
        decode(b"\xa0" * 2000, max_frame=1024)
    assert caught.value.reason == "size"


def test_an_ask_carries_its_deadline() -> None:
    with pytest.raises(FrameError, match="deadline"):
        decode(encode(Frame("ask", to="echo:1")))


@pytest.mark.parametrize(
    ("m", "why"),
    [
        ([], "carries its messages"),
        ([["x"]], "not \\[name, body\\]"),
        ([["x", "text, not bytes"]], "not \\[name, body\\]"),
        ([[1, b""]], "not \\[name, body\\]"),
        ([["x" * 513, b""]], "not \\[name, body\\]"),
        ({"x": b""}, "at most"),
        ([["x", b""]] * (MAX_BATCH + 1), "at most"),
    ],
)
def test_a_sends_frame_carries_a_bounded_list_of_messages(m: object, why: str) -> None:
    with pytest.raises(FrameError, match=why) as caught:
        decode(cbor2.dumps({"v": VERSION, "k": "sends", "to": "echo:1", "m": m}))
    assert caught.value.reason == "field"
