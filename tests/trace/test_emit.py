"""The writer's fast encoder gives exactly the bytes of the reference encoder, or refuses."""

from __future__ import annotations

import enum
import hashlib
import struct
from pathlib import Path
from typing import Any

import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mighty import Component, Instance
from mighty.abi import Err, Ok, Some, Variant
from mighty.gate import Handle, ResourceKind
from mighty.trace import HandleRef, Recorder, TraceError, encode_value, read_trace
from mighty.trace._emit import (
    BlobSink,
    Refused,
    canonical_record,
    emit,
    emit_args,
    emit_simple,
    uint,
)
from mighty.trace._recorder import to_refs
from mighty.trace._values import MAX_DEPTH, TAG_BLOB, encode_with
from tests.trace.test_values import values

STREAM = ResourceKind("wasi:io/streams", "output-stream")
gate_handles = st.builds(Handle, st.just(STREAM), st.integers(0, 2**70))


def reference(value: Any, blob_min: int | None) -> tuple[bytes, dict[bytes, bytes]]:
    """What the writer wrote before: encode_with + cbor2.dumps, blobs collected."""
    pending: dict[bytes, bytes] = {}

    def blob(data: bytes, depth: int) -> Any:
        if blob_min is None or len(data) < blob_min or depth >= MAX_DEPTH:
            return data
        digest = hashlib.sha256(data).digest()
        pending[digest] = data
        return cbor2.CBORTag(TAG_BLOB, digest)

    data = encode_with(value, blob)
    try:
        return cbor2.dumps(data), pending
    except (ValueError, TypeError) as exc:  # as TraceWriter reports it
        raise TraceError(str(exc)) from exc


def fast(
    value: Any, blob_min: int | None, handles: bool = False
) -> tuple[bytes, dict[bytes, bytes]]:
    sink = None if blob_min is None else BlobSink(blob_min, set())
    return emit(value, sink, handles=handles), ({} if sink is None else sink.pending)


class Color(enum.IntEnum):
    RED = 1


class Name(str):
    pass


@given(values, st.sampled_from([None, 0, 5, 4096]))
def test_same_bytes_as_the_reference(value: Any, blob_min: int | None) -> None:
    """Every value of the model: byte for byte what encode_with + cbor2.dumps give."""
    assert fast(value, blob_min) == reference(value, blob_min)


with_gate_handles = st.recursive(
    gate_handles | values,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(st.text(max_size=3), inner, max_size=3)
        | inner.map(Ok)
        | inner.map(Some)
        | st.builds(Variant, st.text(max_size=3), inner)
    ),
    max_leaves=8,
)


@given(with_gate_handles)
def test_gate_handles_encode_as_their_refs(value: Any) -> None:
    """With ``handles``, a gate Handle encodes as the HandleRef that to_refs would make."""
    assert fast(value, 16, handles=True) == reference(to_refs(value), 16)


@given(
    with_gate_handles | st.lists(gate_handles | values, max_size=4), st.sampled_from([0, 5, 4096])
)
def test_simple_encoding_is_the_general_one(value: Any, blob_min: int) -> None:
    """The recorder's one-go encoding of an import's args or result, where it takes the
    value at all, is byte for byte the general encoder's (and leaves no blob behind)."""
    simple = emit_simple(value, blob_min)
    if simple is not None:
        assert (simple, {}) == fast(value, blob_min, handles=True)


OTHER = ResourceKind("wasi:filesystem/types", "descriptor")


@given(
    st.lists(
        gate_handles
        | st.builds(Handle, st.just(OTHER), st.integers(0, 5))
        | st.integers(-300, 2**65)
        | st.binary(max_size=300)
        | values,
        max_size=4,
    ),
    st.sampled_from([0, 5, 4096]),
)
def test_argument_encoding_is_the_simple_one(args: list[Any], blob_min: int) -> None:
    """The recorder's encoding of an argument list is emit_simple's, taken or not alike (the
    same handles twice: the second time from the per-kind cache)."""
    assert emit_args(args, blob_min) == emit_simple(args, blob_min)
    assert emit_args(args, blob_min) == emit_simple(args, blob_min)
    assert emit_args(tuple(args), blob_min) is None  # a tuple: the general path tags it


refs = st.builds(HandleRef, st.text(max_size=5), st.text(max_size=5), st.integers(0, 2**70))


leaves = refs | st.none() | st.booleans() | st.integers(-(2**65), 2**65) | st.text(max_size=4)
simple_fields = (
    leaves
    | st.binary(max_size=5)
    | st.lists(leaves, max_size=3)
    | st.builds(Ok, leaves)
    | st.builds(Err, leaves)
    | st.builds(Some, leaves)
    | st.dictionaries(st.text(max_size=12), leaves, max_size=4)
    | st.dictionaries(st.integers(0, 3), leaves, max_size=2)
)


@given(
    st.dictionaries(
        st.text(max_size=4), refs | values | st.lists(refs | values, max_size=3) | simple_fields
    )
)
def test_canonical_record_is_the_canonical_encoding(record: dict[str, Any]) -> None:
    """The replayer's digest of a record, where the fast path takes it, is the canonical
    encoding of the record without its offset key."""
    fast_bytes = canonical_record(record, "@")
    if fast_bytes is not None:
        plain = {k: v for k, v in record.items() if k != "@"}
        assert fast_bytes == emit(plain, canonical=True)


def test_canonical_record_takes_import_records() -> None:
    """A replayed import record (HandleRefs, bytes, ints, text, a clock's datetime record)
    takes the fast path."""
    clock = {"k": "import", "i": 1, "s": 2, "res": {"seconds": 5, "nanoseconds": 7}, "@": 3}
    assert canonical_record(clock, "@") == emit(
        {k: clock[k] for k in clock if k != "@"}, canonical=True
    )
    record = {
        "k": "import", "i": 1, "s": 7, "if": "wasi:io/streams",
        "fn": "[method]output-stream.write", "args": [HandleRef("wasi:io/streams", "output-stream", 3), b"hi\n"],
        "res": Ok(None), "out": "ok", "fuel": 123456, "@": 999,
    }  # fmt: skip
    plain = {k: v for k, v in record.items() if k != "@"}
    assert canonical_record(record, "@") == emit(plain, canonical=True)


def test_simple_encoding_takes_the_print_paths_values() -> None:
    """The shapes of the hot imports' records are taken (so the fast path is the one used)."""
    for value in ([Handle(STREAM, 3), b"hello\n"], [Handle(STREAM, 3)], Ok(None), Ok(2**31 - 1)):
        assert emit_simple(value, 4096) == fast(value, 4096, handles=True)[0]
    assert emit_simple([b"x" * 4096], 4096) is None  # a blob: the general path
    assert emit_simple([Name("x")], 4096) is None  # a str subclass: the general path


@pytest.mark.parametrize(
    "value",
    [
        object(), Color.RED, Name("x"), [1, {"a": [object()]}], "\ud800", 2**9000,
        Variant(1, None), frozenset(range(2**61 - 1, 40 * (2**61 - 1), 2**61 - 1)),  # type: ignore[arg-type]
        {(1,): Handle(STREAM, 1)}, [Handle(STREAM, 1)],
    ],
)  # fmt: skip
def test_refused_where_the_reference_refuses(value: Any) -> None:
    """What the reference encoder refuses, the fast one refuses too (the writer then asks
    the reference for the message)."""
    with pytest.raises(TraceError):
        reference(value, 16)
    with pytest.raises(Refused):
        emit(value)


@pytest.mark.parametrize("depth", [MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1, 100_000])
def test_depth_is_counted_as_the_reference_does(depth: int) -> None:
    """Nesting at and past MAX_DEPTH: accepted and refused at the same level (and 100,000
    levels, which crash cbor2's own encoder, are refused before any encoding)."""
    value: Any = [b"x" * 20]
    for _ in range(depth - 1):
        value = [value]
    try:
        expected = reference(value, 16)
    except TraceError:
        with pytest.raises(Refused):
            fast(value, 16)
    else:
        assert fast(value, 16) == expected


@given(st.integers(-(2**64), 2**64 - 1))
def test_uint_is_cbor(n: int) -> None:
    assert uint(n) == cbor2.dumps(n)


def test_known_blobs_are_not_pending_again() -> None:
    data = b"y" * 100
    sink = BlobSink(10, {hashlib.sha256(data).digest()})
    assert (
        emit([data, HandleRef("a", "b", 1)], sink)
        == reference([data, HandleRef("a", "b", 1)], 10)[0]
    )
    assert sink.pending == {}


def test_recorded_frames_are_the_reference_bytes(probe_wasm: Path, tmp_path: Path) -> None:
    """A real recording (imports through the recorder's fast path, with an agent address):
    every record's frame holds exactly the bytes the reference encoder gives for it."""
    path = tmp_path / "t.bin"
    with (
        Recorder(path) as recorder,
        Instance(Component.load(probe_wasm), record=recorder, agent="probe:1") as instance,
    ):
        instance.call("run", "import os\nprint('hi', os.urandom(4), time.time())\nresult = 1.5")
    data = path.read_bytes()
    records = read_trace(path).all_records
    payloads = []
    pos = 10 + 12 + struct.unpack(">I", data[10:14])[0]  # after the header frame
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        payload = data[pos + 12 : pos + 12 + length]
        pos += 12 + length
        if cbor2.loads(payload)["k"] != "blob":  # none here: no byte string of 4 KiB
            payloads.append(payload)
    assert len(payloads) == len(records)
    imports = [r for r in records if r["k"] == "import"]
    assert len(imports) > 10 and all(r["a"] == "probe:1" for r in imports)
    for payload, record in zip(payloads, records, strict=True):
        assert payload == cbor2.dumps(encode_value(record))


@given(values)
def test_canonical_bytes_are_cbor2_canonical(value: Any) -> None:
    """``canonical=True``: what replay digests, cbor2.dumps(encode_value(v), canonical=True)."""
    assert emit(value, canonical=True) == cbor2.dumps(encode_value(value), canonical=True)


@given(st.dictionaries(st.text(max_size=30), st.integers(), max_size=12))
def test_canonical_orders_many_keys(record: dict[str, int]) -> None:
    assert emit(record, canonical=True) == cbor2.dumps(encode_value(record), canonical=True)
