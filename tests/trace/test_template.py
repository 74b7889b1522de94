"""Import records read by template (``_template.py``) against the closed decoder's reference:
the same record (value, types, key order) and the same canonical bytes, or no answer at all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mighty.trace._format as trace_format
from mighty.abi import Err, Ok, Some
from mighty.trace import TraceReader, TraceWriter
from mighty.trace._cbor import CBORInvalid, decode_reference
from mighty.trace._emit import canonical_record, emit
from mighty.trace._format import MAX_ITEMS
from mighty.trace._native import native
from mighty.trace._schema import check_record
from mighty.trace._template import ImportTemplates, _split
from mighty.trace._values import MAX_DEPTH, HandleRef, value_from_tag

UINT = st.integers(0, 2**64 - 1)
_AFTER = b"\x61k\x66import\x61i"  # what every import record starts with, after its map head
small = (
    UINT
    | st.integers(-(2**64), -1)
    | st.text(max_size=12)
    | st.binary(max_size=40)
    | st.booleans()
    | st.none()
    | st.builds(HandleRef, st.sampled_from(["wasi:io/streams", "x"]), st.text(max_size=5), UINT)
)
# What a call's arguments hold; a few not "simple" (a float, a tuple, an Ok) on purpose.
args = st.lists(
    small | st.floats(allow_nan=False) | st.tuples(small) | st.builds(Ok, small), max_size=3
)
results = (
    UINT
    | st.binary(max_size=300)
    | st.builds(Ok, st.none() | UINT)
    | st.booleans()
    | st.none()
    | st.dictionaries(st.text(max_size=8), UINT, max_size=3)  # a datetime
    # shapes the template leaves to the decoder
    | st.dictionaries(st.text(max_size=3), small, max_size=9)
    | st.integers(-(2**64), -1)
    | st.text(max_size=5)
    | st.builds(Err, small)
    | st.builds(Some, small)
    | st.lists(small, max_size=3)
    | st.builds(Ok, st.text(max_size=4))
)
outs = st.sampled_from(["ok", "exit", "violation", "host_error"]) | st.text(max_size=4)
calls = st.fixed_dictionaries(
    {
        "if": st.sampled_from(["wasi:io/streams", "wasi:clocks/monotonic-clock"]),
        "fn": st.text(max_size=8),
        "args": args,
    },
    optional={"a": st.text(max_size=6)},
)


def _record(call: dict[str, Any], i: int, s: int, res: Any, out: str, fuel: int) -> dict[str, Any]:
    return {"k": "import", "i": i, "s": s, **call, "res": res, "out": out, "fuel": fuel}


def _shape(value: Any) -> Any:
    """The value with its types (True and 1, equal in Python, told apart) and key order."""
    if isinstance(value, list | tuple):
        return (type(value).__name__, [_shape(v) for v in value])
    if isinstance(value, dict):
        return ("dict", [(k, _shape(v)) for k, v in value.items()])
    if isinstance(value, Ok | Err | Some):
        return (type(value).__name__, _shape(value.value))
    return (type(value).__name__, repr(value))


def _reference(payload: bytes) -> Any:
    try:
        return decode_reference(payload, value_from_tag, MAX_DEPTH, MAX_ITEMS)
    except CBORInvalid:
        return None


def _check(templates: ImportTemplates, payload: bytes) -> bool:
    """Read ``payload`` as the reader does (template, else the decoder then learn); compare
    with the reference. True when the template answered."""
    reference = _reference(payload)
    got = templates.get(payload, True)
    if got is None:
        if type(reference) is dict and reference.get("k") == "import":
            learnt = templates.learn(payload, reference, MAX_ITEMS)
            assert learnt is None or learnt == canonical_record(reference, "@")
        return False
    record, canonical, checked = got
    assert reference is not None, payload.hex()
    assert _shape(record) == _shape(reference)
    assert canonical is None or canonical == canonical_record(reference, "@")
    if checked:  # the reader then skips the schema check: it must pass
        check_record(record, 0)
    return True


@settings(max_examples=200, deadline=None)
@given(
    st.lists(calls, min_size=1, max_size=3),
    st.lists(
        st.tuples(st.integers(0, 2), UINT, UINT, results, outs, UINT), min_size=1, max_size=12
    ),
)
def test_records_read_by_template_are_the_decoders(
    known: list[dict[str, Any]], rows: list[tuple[int, int, int, Any, str, int]]
) -> None:
    templates = ImportTemplates()
    for which, i, s, res, out, fuel in rows:
        _check(templates, emit(_record(known[which % len(known)], i, s, res, out, fuel)))


def _damage(
    payload: bytes, data: st.DataObject, *, low: int = 0, fuel: bool = False, least: int = 0
) -> bytes:
    """``payload`` with ``least``..3 random edits at or after byte ``low`` (``fuel``: one may
    rewrite the fuel 1234 in its last two bytes, another number in the same layout)."""
    damaged = bytearray(payload)
    hows = ["set", "insert", "delete", "cut", "extend"] + (["fuel"] if fuel else [])
    for _ in range(data.draw(st.integers(least, 3))):
        how = data.draw(st.sampled_from(hows))
        at = data.draw(st.integers(min(low, len(damaged) - 1), max(0, len(damaged) - 1)))
        byte = data.draw(st.integers(0, 255))
        if how == "fuel" and len(damaged) >= 2:
            damaged[-1 - at % 2] = byte
        elif how == "set" and damaged:
            damaged[at] = byte
        elif how == "insert":
            damaged.insert(at, byte)
        elif how == "delete" and damaged:
            del damaged[at]
        elif how == "cut":
            del damaged[at:]
        else:
            damaged += data.draw(st.binary(min_size=1, max_size=9))
    return bytes(damaged)


@settings(max_examples=300, deadline=None)
@given(calls, results, st.data())
def test_damaged_payloads_get_no_answer_the_decoder_would_not_give(
    call: dict[str, Any], res: Any, data: st.DataObject
) -> None:
    templates = ImportTemplates()
    payload = emit(_record(call, 1, 7, res, "ok", 1234))
    _check(templates, payload)  # seen
    _check(templates, payload)  # learnt, if it can be
    split = _split(payload)
    # Half the time only where the variable fields are (the call's bytes still match).
    low = split[1] if split is not None and data.draw(st.booleans()) else 0
    _check(templates, _damage(payload, data, low=low, fuel=True, least=1))


@pytest.mark.skipif(native is None, reason="the trace speedups are not built")
@settings(max_examples=500, deadline=None)
@given(calls, st.tuples(UINT, UINT, results, outs, UINT), st.data())
def test_the_compiled_split_is_the_python_split(
    call: dict[str, Any], row: tuple[int, int, Any, str, int], data: st.DataObject
) -> None:
    """The reader's compiled ``split`` gives what ``_split`` gives (values, types, key order),
    for records in the recorder's layout, damaged ones and random bytes."""
    i, s, res, out, fuel = row
    payload = data.draw(
        st.one_of(
            st.just(emit(_record(call, i, s, res, out, fuel))),
            st.binary(max_size=64),
            st.binary(min_size=24, max_size=64).map(lambda b: b"\xa9" + _AFTER + b),
        )
    )
    payload = _damage(payload, data)
    assert native is not None
    want, got = _split(payload), native.split(payload, Ok)
    assert (None if want is None else _shape(want)) == (None if got is None else _shape(got))


def test_a_call_is_learnt_the_second_time_and_read_by_template_from_the_third() -> None:
    templates = ImportTemplates()
    stream = HandleRef("wasi:io/streams", "output-stream", 1)
    rows = [
        ({"if": "wasi:io/streams", "fn": "w", "args": [stream, b"hi"]}, [Ok(None)] * 3),
        ({"if": "wasi:clocks/monotonic-clock", "fn": "now", "args": []}, [5, 2**40, 0]),
        ({"if": "wasi:random/random", "fn": "bytes", "args": [16]}, [b"x", b"y" * 300, b""]),
        (
            {"if": "wasi:clocks/wall-clock", "fn": "now", "args": []},
            [{"seconds": 1}, {"seconds": 2, "n": 3}, {}],
        ),
    ]
    for call, results in rows:
        answered = [
            _check(templates, emit(_record(call, 1, s, res, "ok", 1000 + s)))
            for s, res in enumerate(results)
        ]
        assert answered == [False, False, True]
    # A call the template cannot keep (a tuple among the arguments) is not tried again.
    odd = {"if": "x", "fn": "f", "args": [(1, 2)]}
    assert not any(_check(templates, emit(_record(odd, 1, s, 0, "ok", 9))) for s in range(4))
    assert templates._seen[emit(odd)[1:]] is True
    # Heads longer than they need be read as the decoder reads them; the canonical bytes are
    # the canonical record's, not the payload's.
    payload = emit(_record({"if": "a", "fn": "now", "args": []}, 1, 3, 5, "ok", 7))
    longer = payload.replace(b"as\x03", b"as\x19\x00\x03").replace(
        b"res\x05", b"res\x1a\x00\x00\x00\x05"
    )
    assert not _check(templates, payload)  # seen
    assert not _check(templates, payload)  # learnt
    assert _check(templates, longer)
    assert templates.get(longer, True) == templates.get(payload, True)


class _Never(ImportTemplates):
    """Templates that never answer: every record goes to the closed decoder."""

    __slots__ = ()

    def get(self, payload: bytes, canonical: bool) -> None:
        return None

    def learn(self, payload: bytes, record: dict[str, Any], max_items: int) -> None:
        return None


def _write(path: Path, records: list[dict[str, Any]], blob_min: int) -> None:
    with TraceWriter(path, {"note": "t"}, blob_min=blob_min) as writer:
        for record in records:
            writer.append(record)


def _read(path: Path, templated: bool) -> list[tuple[Any, Any, int, bytes | None]]:
    with TraceReader(path) as reader:
        if not templated:
            reader._templates = _Never()
        return [
            (_shape(r), r, reader.record_offset, reader.record_canonical)
            for r in reader.records(schema=True, canonical=True)
        ]


@pytest.mark.parametrize("read_ahead", [13, 1 << 20])
def test_reader_by_template_and_read_ahead_reads_what_the_decoder_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_ahead: int
) -> None:
    """Whole traces: the same records at the same offsets with or without templates, across
    read-ahead refills (a tiny buffer) and blobs (results of 64 bytes and more)."""
    monkeypatch.setattr(trace_format, "_READ_AHEAD", read_ahead)
    stream = HandleRef("wasi:io/streams", "output-stream", 1)
    records: list[dict[str, Any]] = [
        {"k": "call", "i": 1, "s": 0, "fn": "run", "args": [], "budget": {}}
    ]
    for s in range(1, 400):
        kind = s % 4
        if kind == 0:
            call, res = {"if": "wasi:io/streams", "fn": "w", "args": [stream, b"line"]}, Ok(None)
        elif kind == 1:
            call, res = {"if": "wasi:clocks/monotonic-clock", "fn": "now", "args": []}, s * 977
        elif kind == 2:
            call, res = {"if": "wasi:random/random", "fn": "b", "args": [s % 100]}, bytes(s % 100)
        else:
            call, res = {"if": "wasi:random/random", "fn": "b", "args": [70]}, bytes([s % 7]) * 70
        records.append(_record(call, 1, s, res, "ok", 10 * s))
    path = tmp_path / "t.bin"
    _write(path, records, blob_min=64)
    templated = _read(path, True)
    plain = _read(path, False)
    assert [(shape, at) for shape, _, at, _ in templated] == [(s, a) for s, _, a, _ in plain]
    assert sum(1 for *_, canonical in templated if canonical is not None) > 200
    for _, record, _, canonical in templated:
        assert canonical is None or canonical == canonical_record(record, "@")
    # With a blob: never by template (its reference is resolved by the reader).
    assert all(c is None for _, r, _, c in templated if r.get("res") == bytes([1]) * 70)


def test_calls_that_never_repeat_are_tried_now_and_then_until_one_does() -> None:
    """Past a run of payloads with no answer only one in 16 is split; a call that repeats is
    still learnt from those, and every payload is tried again from its first answer on."""
    templates = ImportTemplates()
    for s in range(300):
        call = {"if": "wasi:io/streams", "fn": "w", "args": [b"line %d" % s]}
        assert not _check(templates, emit(_record(call, 1, s, Ok(None), "ok", s)))
    same = {"if": "wasi:io/streams", "fn": "w", "args": [b"again"]}
    answered = [_check(templates, emit(_record(same, 1, s, Ok(None), "ok", s))) for s in range(60)]
    first = answered.index(True)
    assert 2 <= first < 50
    assert all(answered[first:])
