"""The trace file: framing, truncation, damage, hostile payloads, blobs."""

from __future__ import annotations

import struct
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import cbor2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mighty.trace
from mighty.abi import Err, Ok, Variant
from mighty.trace import (
    FORMAT_VERSION,
    HandleRef,
    TraceCorrupt,
    TraceError,
    TraceReader,
    TraceTruncated,
    TraceVersionError,
    TraceWriter,
    encode_value,
    read_trace,
)
from tests.trace.test_values import same, values

HEADER = {"engine": {"nan_canonicalization": True}, "policy": {"net": False}}
FILE_HEAD = 10  # "MTYTRACE" + u16 version


def frame(payload: bytes) -> bytes:
    """One frame around ``payload``, with correct checksums."""
    head = struct.pack(">II", len(payload), zlib.crc32(payload))
    return head + struct.pack(">I", zlib.crc32(head)) + payload


def frames(data: bytes) -> list[tuple[int, int, str]]:
    """(start, end, kind) of every frame of a well-formed trace, header included."""
    out, pos = [], FILE_HEAD
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        end = pos + 12 + length
        out.append((pos, end, cbor2.loads(data[pos + 12 : end])["k"]))
        pos = end
    return out


def sample_records() -> list[dict[str, Any]]:
    """A small run: an instance, imports with results of several shapes, an export, a close."""
    return [
        {"k": "instance", "i": 1, "component": "ab" * 32, "policy": {}, "budget": {"fuel": 10}},
        {"k": "import", "i": 1, "s": 0, "if": "wasi:random/random", "fn": "get-random-u64",
         "args": [], "res": 2**64 - 1, "out": "ok", "fuel": 5},
        {"k": "import", "i": 1, "s": 1, "if": "wasi:io/streams", "fn": "[method]x.write",
         "args": [HandleRef("wasi:io/streams", "output-stream", 2), b"payload" * 8],
         "res": Ok(None), "out": "ok", "fuel": 9},
        {"k": "export", "i": 1, "s": 2, "fn": "handle", "args": [(1, -0.0)], "budget": {},
         "res": Err(Variant("bad", float("nan"))), "ok": True, "error": None, "fuel": 20,
         "memory_peak": 65536},
        {"k": "close", "i": 1, "stdout": b"hi\n", "stderr": b"", "digest": "00" * 32},
    ]  # fmt: skip


def write(path: Path, records: list[dict[str, Any]], *, blob_min: int = 4096) -> bytes:
    """Write a trace of ``records`` and return its bytes."""
    with TraceWriter(path, HEADER, blob_min=blob_min) as w:
        for r in records:
            w.append(r)
    return path.read_bytes()


def read_prefix(path: Path) -> tuple[list[dict[str, Any]], BaseException | None]:
    """Records read before the reader stopped, and what stopped it (None: the end)."""
    got: list[dict[str, Any]] = []
    try:
        with TraceReader(path) as reader:
            got.extend(reader.records())
    except Exception as exc:  # noqa: BLE001 - the test inspects whatever came out
        return got, exc
    return got, None


def test_public_names_are_pinned() -> None:
    """mighty.trace exports exactly these names, and each one resolves."""
    assert set(mighty.trace.__all__) == {
        "FORMAT_VERSION", "MAX_FRAME", "HandleRef", "Trace", "TraceCorrupt", "TraceError",
        "TraceReader", "TraceTruncated", "TraceVersionError", "TraceWriter", "decode_value",
        "encode_value", "read_trace", "InstanceRecording", "InstanceReport", "NondeterminismError",
        "Recorder", "ReplayReport", "default_trace_path", "replay_trace", "summarize", "Debugger",
        "DEFAULT_REPLAY_LIMITS", "ReplayLimitExceeded", "ReplayLimits", "TraceInvalid",
        "ReplayAborted", "ReplayEvent", "FLUSH_MODES", "FlushMode",
        "AnswerPolicy", "AnsweredImport", "LiveFrom", "TraceAnswers", "answer_gate",
        "read_instances", "AcrossReport", "Segment", "migration_link", "replay_across",
        "write_chrome_trace", "write_html",
    }  # fmt: skip
    for name in mighty.trace.__all__:
        assert getattr(mighty.trace, name) is not None


def test_errors_sit_under_host_error() -> None:
    """Trace errors are HostErrors with stable kinds; a version error is also corrupt."""
    from mighty._errors import HostError

    assert issubclass(TraceError, HostError)
    assert issubclass(TraceVersionError, TraceCorrupt)
    assert {TraceCorrupt.kind, TraceTruncated.kind, TraceVersionError.kind} == {
        "trace_corrupt", "trace_truncated", "trace_version",
    }  # fmt: skip


def test_round_trip_with_header(tmp_path: Path) -> None:
    """Header (with what the writer fills in) and records read back exactly."""
    records = sample_records()
    write(tmp_path / "t", records)
    trace = read_trace(tmp_path / "t")
    assert trace.header["format"] == FORMAT_VERSION
    assert trace.header["engine"] == HEADER["engine"]
    assert trace.header["policy"] == HEADER["policy"]
    assert {"mighty", "wasmtime", "created", "components"} <= set(trace.header)
    assert not trace.truncated
    assert trace.readable_records == len(records)
    assert trace.readable_bytes == (tmp_path / "t").stat().st_size
    assert same(list(trace.records()), records)


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(values, min_size=1, max_size=4), st.sampled_from([8, 4096]))
def test_any_value_round_trips_through_a_file(vals: list[Any], blob_min: int) -> None:
    """Any value written in records is read back exactly, blobs or not."""
    records = [{"k": "import", "s": i, "res": v, "args": [v, v]} for i, v in enumerate(vals)]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t"
        write(path, records, blob_min=blob_min)
        assert same(list(read_trace(path, strict=True).records()), records)


@pytest.mark.parametrize("blob_min", [16, 4096])
def test_cut_at_every_offset(tmp_path: Path, blob_min: int) -> None:
    """A file cut anywhere reads its whole frames and reports the cut, or raises if headless."""
    records = sample_records()
    data = write(tmp_path / "full", records, blob_min=blob_min)
    layout = frames(data)
    if blob_min == 16:
        assert any(kind == "blob" for _, _, kind in layout)
    header_end = layout[0][1]
    cut = tmp_path / "cut"
    for n in range(len(data) + 1):
        cut.write_bytes(data[:n])
        if n < header_end:
            with pytest.raises(TraceTruncated):
                read_trace(cut)
            continue
        whole = [f for f in layout[1:] if f[1] <= n]
        trace = read_trace(cut)
        expected = sum(1 for f in whole if f[2] != "blob")
        assert trace.readable_records == expected, n
        assert same(list(trace.records()), records[:expected])
        assert trace.readable_bytes == (whole[-1][1] if whole else header_end)
        at_boundary = n == header_end or any(f[1] == n for f in layout)
        assert trace.truncated is not at_boundary, n
        if not at_boundary:
            with pytest.raises(TraceTruncated) as info:
                read_trace(cut, strict=True)
            assert info.value.readable_records == expected
            assert info.value.readable_bytes == trace.readable_bytes


def test_flip_every_byte(tmp_path: Path) -> None:
    """Any single damaged byte is TraceCorrupt; records before it are the originals."""
    records = sample_records()
    data = write(tmp_path / "full", records, blob_min=16)
    bad = tmp_path / "bad"
    for i in range(len(data)):
        for mask in (0xFF, 0x01):
            flipped = bytearray(data)
            flipped[i] ^= mask
            bad.write_bytes(bytes(flipped))
            got, exc = read_prefix(bad)
            assert isinstance(exc, TraceCorrupt), (i, mask, exc)
            assert same(got, records[: len(got)]), i


@settings(max_examples=200)
@given(st.data())
def test_random_damage_never_misreads(data: st.DataObject) -> None:
    """Random byte changes give TraceCorrupt or TraceTruncated, never other errors or bad data."""
    records = sample_records()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t"
        original = write(path, records, blob_min=16)
        damaged = bytearray(original)
        for _ in range(data.draw(st.integers(1, 4))):
            i = data.draw(st.integers(0, len(damaged) - 1))
            damaged[i] = data.draw(st.integers(0, 255))
        path.write_bytes(bytes(damaged))
        got, exc = read_prefix(path)
        assert exc is None or isinstance(exc, TraceCorrupt | TraceTruncated), exc
        assert same(got, records[: len(got)])


def test_edited_result_with_fixed_checksum_reads(tmp_path: Path) -> None:
    """A record changed in place with its checksums fixed reads fine: the replayer must catch it."""
    records = sample_records()
    data = write(tmp_path / "t", records)
    start, end, _ = frames(data)[2]
    edited = dict(records[1], res=12345)
    patched = data[:start] + frame(cbor2.dumps(encode_value(edited))) + data[end:]
    (tmp_path / "t").write_bytes(patched)
    got = read_trace(tmp_path / "t", strict=True).all_records
    assert got[1]["res"] == 12345
    assert same(list(got[2:]), records[2:])


def test_reordered_frames_read(tmp_path: Path) -> None:
    """Swapped record frames read fine in their new order; order checks are the replayer's."""
    records = sample_records()
    data = write(tmp_path / "t", records)
    layout = frames(data)
    (s1, e1, _), (s2, e2, _) = layout[2], layout[3]
    swapped = data[:s1] + data[s2:e2] + data[s1:e1] + data[e2:]
    (tmp_path / "t").write_bytes(swapped)
    got = list(read_trace(tmp_path / "t", strict=True).records())
    assert same(got, [records[0], records[2], records[1], *records[3:]])


def test_zero_filled_tail_is_truncation(tmp_path: Path) -> None:
    """Zeros after the last frame (a power cut) read as a truncated tail, not damage."""
    data = write(tmp_path / "t", sample_records())
    (tmp_path / "t").write_bytes(data + bytes(100))
    trace = read_trace(tmp_path / "t")
    assert trace.truncated
    assert trace.readable_records == len(sample_records())
    assert trace.readable_bytes == len(data)


def _with_frame(tmp_path: Path, raw: bytes) -> Path:
    """A valid trace with ``raw`` (a frame, or any bytes) appended."""
    data = write(tmp_path / "base", sample_records()[:1])
    path = tmp_path / "hostile"
    path.write_bytes(data + raw)
    return path


def _assert_corrupt_fast(path: Path) -> TraceCorrupt:
    """Refused as fast as a valid trace is read (a margin scaled from that baseline, measured
    here: a loaded machine slows both alike), never after reading what a frame claims."""
    started = time.monotonic()
    read_trace(path.parent / "base")  # the valid trace _with_frame appended to
    baseline = time.monotonic() - started
    started = time.monotonic()
    with pytest.raises(TraceCorrupt) as info:
        read_trace(path)
    assert time.monotonic() - started < max(2.0, 100 * baseline)
    return info.value


def test_frame_claiming_4_gib(tmp_path: Path) -> None:
    """A well-checksummed prefix claiming 4 GiB is refused before anything is read."""
    head = struct.pack(">II", 0xFFFFFFFF, 0)
    path = _with_frame(tmp_path, head + struct.pack(">I", zlib.crc32(head)) + b"x" * 10)
    exc = _assert_corrupt_fast(path)
    assert "limit" in exc.message
    assert exc.offset == len(path.read_bytes()) - 22


def test_damaged_prefix_is_not_taken_for_truncation(tmp_path: Path) -> None:
    """A length that does not match its prefix checksum is corruption, even past the end."""
    head = struct.pack(">II", 1000, 0)
    path = _with_frame(tmp_path, head + struct.pack(">I", zlib.crc32(head) ^ 1) + b"x" * 10)
    _assert_corrupt_fast(path)


def test_deep_nesting(tmp_path: Path) -> None:
    """Arrays nested 100000 deep inside a valid frame are refused at once."""
    payload = b"\xa2\x61k\x61x\x61a" + b"\x81" * 100_000 + b"\x00"
    exc = _assert_corrupt_fast(_with_frame(tmp_path, frame(payload)))
    assert "deeper" in exc.message


@pytest.mark.parametrize(
    ("tag", "content"),
    [
        (0, "2013-03-21T20:04:00Z"), (1, 1363896240), (2, b"\x01"), (3, b"\x01"),
        (4, [-2, 27315]), (5, [1, 3]), (24, b"\x01"), (25, 0), (28, [1]), (29, 0),
        (30, [1, 2]), (35, "a+"), (36, "Content-Type: text/plain\n\nhi"), (37, b"0" * 16),
        (52, b"\x7f\0\0\1"), (256, ["a"]), (258, [1, 2]), (260, b"\x7f\0\0\1"),
        (261, [24, b"\x7f"]), (1004, "2020-01-01"), (43000, [1.0, 2.0]), (55799, 5),
        (26999, 1), (27099, 1), (2**64 - 1, 1),
    ],
)  # fmt: skip
def test_foreign_tags_are_refused(tmp_path: Path, tag: int, content: Any) -> None:
    """cbor2's semantic tags and any tag outside our table are TraceCorrupt."""
    payload = cbor2.dumps({"k": "import", "res": cbor2.CBORTag(tag, content)})
    exc = _assert_corrupt_fast(_with_frame(tmp_path, frame(payload)))
    assert "tag" in exc.message or "float" in exc.message


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (b"\xa2\x61k\x61x\x61a\x5b" + b"\x7f" * 8, "claims"),  # byte string of 2**63 bytes
        (b"\xa2\x61k\x61x\x61a\x9b\x00\x00\x00\x01\x00\x00\x00\x00", "claims"),  # 2**32 items
        (b"\xa2\x61k\x61x\x61a\x9f\x01\xff", "indefinite"),
        (b"\xa2\x61k\x61x\x61a\xfb" + bytes(8), "float"),
        (b"\xa2\x61k\x61x\x61a\xf7", "simple"),  # undefined
        (b"\xa2\x61k\x61x\x61k\x61y", "duplicate"),
        (b"\xa1\x01\x02", "key"),
        (b"\xa1\x61k\x61x\x00", "left after"),
        (b"\x83\x01\x02\x03", '"k"'),
        (b"\xa1\x61j\x61x", '"k"'),
        (b"\xa1\x61k\x62\xff\xfe", "UTF-8"),
        (b"", "ends"),
    ],
)
def test_malformed_payloads_are_refused(tmp_path: Path, payload: bytes, why: str) -> None:
    """Lengths past the frame, indefinite items, floats, bad keys and stray bytes are corrupt."""
    exc = _assert_corrupt_fast(_with_frame(tmp_path, frame(payload)))
    assert why in exc.message


def test_blob_reference_without_blob(tmp_path: Path) -> None:
    """A record referring to a blob no earlier frame holds is corrupt."""
    payload = cbor2.dumps({"k": "import", "res": cbor2.CBORTag(27009, bytes(32))})
    exc = _assert_corrupt_fast(_with_frame(tmp_path, frame(payload)))
    assert "no earlier frame" in exc.message


def test_blob_with_wrong_hash(tmp_path: Path) -> None:
    """A blob frame whose data does not match its sha256 is corrupt."""
    payload = cbor2.dumps({"k": "blob", "sha256": "00" * 32, "data": b"abc"})
    exc = _assert_corrupt_fast(_with_frame(tmp_path, frame(payload)))
    assert "sha256" in exc.message


def test_bad_magic_and_version(tmp_path: Path) -> None:
    """A foreign file is corrupt; another format version is a TraceVersionError."""
    data = write(tmp_path / "t", sample_records())
    (tmp_path / "m").write_bytes(b"NOTTRACE" + data[8:])
    with pytest.raises(TraceCorrupt, match="magic"):
        read_trace(tmp_path / "m")
    (tmp_path / "v").write_bytes(data[:8] + struct.pack(">H", 2) + data[10:])
    with pytest.raises(TraceVersionError) as info:
        read_trace(tmp_path / "v")
    assert info.value.version == 2


def test_blob_stored_once(tmp_path: Path) -> None:
    """The same 100 KB in ten records is stored once and read back into every record."""
    big = bytes(range(256)) * 400
    records = [{"k": "close", "i": i, "stdout": big, "stderr": [Ok(big)]} for i in range(10)]
    write(tmp_path / "t", records)
    assert (tmp_path / "t").stat().st_size < 2 * len(big)
    assert list(read_trace(tmp_path / "t", strict=True).records()) == records


def test_reader_records_can_be_read_twice(tmp_path: Path) -> None:
    """records() starts from the top each time, blobs resolved again if needed."""
    records = [{"k": "x", "b": bytes([i]) * 5000} for i in range(3)]
    write(tmp_path / "t", records)
    with TraceReader(tmp_path / "t") as reader:
        assert list(reader.records()) == records
        reader._cache.clear()  # force re-reading blob frames from the file
        assert list(reader.records()) == records


def test_refused_record_writes_nothing(tmp_path: Path) -> None:
    """A record holding an unencodable value raises, naming it, and leaves the file as it was."""
    path = tmp_path / "t"
    with TraceWriter(path, HEADER) as w:
        w.append(sample_records()[0])
        size = path.stat().st_size
        with pytest.raises(TraceError, match=r"args\[0\]: it is a builtins.object"):
            w.append({"k": "import", "args": [object()], "big": b"x" * 10_000})
        with pytest.raises(TraceError, match="surrogate"):
            w.append({"k": "import", "res": "\ud800"})
        assert path.stat().st_size == size
        w.append(sample_records()[1])
    assert same(list(read_trace(path).records()), sample_records()[:2])


@pytest.mark.parametrize("record", [{"i": 1}, {"k": 1}, {"k": "blob"}, {"k": "header"}, [1]])
def test_records_need_a_kind(tmp_path: Path, record: Any) -> None:
    """A record must be a dict with a str "k" that is not reserved for the format."""
    with TraceWriter(tmp_path / "t", HEADER) as w, pytest.raises(TraceError):
        w.append(record)


def test_writer_lifecycle(tmp_path: Path) -> None:
    """An existing file is not overwritten by default; appending after close raises."""
    path = tmp_path / "t"
    write(path, [])
    with pytest.raises(TraceError, match="cannot create"):
        TraceWriter(path, HEADER)
    w = TraceWriter(path, HEADER, overwrite=True)
    w.close()
    w.close()
    with pytest.raises(TraceError, match="closed"):
        w.append({"k": "x"})
    assert read_trace(path).all_records == ()


@pytest.mark.parametrize(
    "header", [{"k": "x"}, {"format": 2}, {"components": [{"sha256": 1}]}, {"engine": []}]
)
def test_bad_headers_are_refused(tmp_path: Path, header: dict[str, Any]) -> None:
    """The writer refuses a header it would not read back as one."""
    with pytest.raises(TraceError):
        TraceWriter(tmp_path / "t", header)


def test_records_appear_as_they_are_appended(tmp_path: Path) -> None:
    """Each append is flushed: a reader sees it while the writer is still open."""
    path = tmp_path / "t"
    with TraceWriter(path, HEADER) as w:
        for n, record in enumerate(sample_records(), start=1):
            w.append(record)
            trace = read_trace(path)
            assert trace.readable_records == n
            assert not trace.truncated
