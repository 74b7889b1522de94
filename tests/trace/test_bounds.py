"""Hostile trace files stay bounded: decoding is linear and capped, replay trusts no budget."""

from __future__ import annotations

import hashlib
import struct
import zlib
from pathlib import Path
from typing import Any

import cbor2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mighty import Budget, Component, Instance
from mighty._errors import HostError
from mighty.engine import ComponentStore
from mighty.trace import (
    DEFAULT_REPLAY_LIMITS,
    Recorder,
    ReplayLimitExceeded,
    ReplayLimits,
    TraceCorrupt,
    TraceError,
    TraceInvalid,
    TraceReader,
    TraceWriter,
    read_trace,
    replay_trace,
    summarize,
)
from mighty.trace._format import FILE_MAGIC, FORMAT_VERSION, MAX_BLOB_REFS, MAX_ITEMS
from mighty.trace._values import (
    MAX_BIGINT_BYTES,
    MAX_COLLISIONS,
    TAG_BIGINT,
    TAG_BLOB,
    TAG_FROZENSET,
    TAG_MAP,
)

HEADER = {"mighty": "test", "wasmtime": "test", "created": "2024-01-01T00:00:00+00:00"}
MODULUS = (1 << 61) - 1  # ints that differ by this have the same Python hash


def _frame(payload: bytes) -> bytes:
    head = struct.pack(">II", len(payload), zlib.crc32(payload))
    return head + struct.pack(">I", zlib.crc32(head)) + payload


def raw_trace(path: Path, *payloads: bytes) -> Path:
    """A trace of hand-made frames (valid framing, any content) after a real header."""
    header = cbor2.dumps({"k": "header", "format": FORMAT_VERSION, **HEADER})
    body = b"".join(_frame(p) for p in payloads)
    path.write_bytes(struct.pack(">8sH", FILE_MAGIC, FORMAT_VERSION) + _frame(header) + body)
    return path


def _bigint(n: int) -> cbor2.CBORTag:
    return cbor2.CBORTag(TAG_BIGINT, n.to_bytes((n.bit_length() + 8) // 8, "big", signed=True))


def test_colliding_set_is_refused(tmp_path: Path) -> None:
    """40k big ints of one hash in a frozenset: refused as corrupt, not decoded quadratically."""
    items = [_bigint((1 << 70) + k * MODULUS) for k in range(40_000)]
    payload = cbor2.dumps({"k": "x", "v": cbor2.CBORTag(TAG_FROZENSET, items)})
    path = raw_trace(tmp_path / "t", payload)
    with pytest.raises(TraceCorrupt, match=f"more than {MAX_COLLISIONS} items of one hash"):
        summarize(path)


def test_colliding_map_keys_are_refused(tmp_path: Path) -> None:
    """A WIT map whose int keys collide is refused the same way."""
    flat: list[Any] = []
    for k in range(1000):
        flat += [_bigint((1 << 70) + k * MODULUS), k]
    payload = cbor2.dumps({"k": "x", "v": cbor2.CBORTag(TAG_MAP, flat)})
    with pytest.raises(TraceCorrupt, match="of one hash"):
        read_trace(raw_trace(tmp_path / "t", payload))


def test_writer_refuses_what_the_reader_would(tmp_path: Path) -> None:
    """The writer refuses colliding sets and oversized ints, so it never writes an unreadable trace."""
    with TraceWriter(tmp_path / "t", HEADER) as w:
        with pytest.raises(TraceError, match="of one hash"):
            w.append({"k": "x", "v": frozenset((1 << 70) + k * MODULUS for k in range(100))})
        with pytest.raises(TraceError, match="byte limit"):
            w.append({"k": "x", "v": 10**24_000})
        w.append({"k": "x", "v": frozenset(range(1000)), "n": -(10**2000)})
    assert read_trace(tmp_path / "t").all_records[0]["n"] == -(10**2000)


def test_huge_int_argument_is_corrupt(tmp_path: Path) -> None:
    """A 24,000-digit int (past Python's int->str limit) is a TraceCorrupt, not a ValueError."""
    n = 10**24_000
    assert (n.bit_length() + 8) // 8 > MAX_BIGINT_BYTES
    payload = cbor2.dumps({"k": "call", "i": 0, "s": 0, "fn": "f", "args": [_bigint(n)]})
    with pytest.raises(TraceCorrupt, match="big integer over"):
        replay_trace(raw_trace(tmp_path / "t", payload))


def test_frame_of_empty_maps_is_refused_up_front(tmp_path: Path) -> None:
    """A 60 MB frame of one-byte empty maps is refused by the item cap before it is built."""
    n = 60_000_000
    payload = b"\xa2\x61k\x61x\x61v" + b"\x9a" + n.to_bytes(4, "big") + b"\xa0" * n
    path = raw_trace(tmp_path / "t", payload)
    with pytest.raises(TraceCorrupt, match=f"more than {MAX_ITEMS} items"):
        summarize(path)


def test_items_are_counted_across_containers(tmp_path: Path) -> None:
    """Many small arrays that together pass the item cap are refused too."""
    chunk: list[dict[str, int]] = [{}] * 1000
    payload = cbor2.dumps({"k": "x", "v": [chunk] * (MAX_ITEMS // 1000 + 1)})
    with pytest.raises(TraceCorrupt, match="items in one payload"):
        read_trace(raw_trace(tmp_path / "t", payload))


def test_blob_references_share_one_object(tmp_path: Path) -> None:
    """References alternating between two blobs decode to those two objects, never copies."""
    a, b = b"a" * 200_000, b"b" * 200_000
    with TraceWriter(tmp_path / "t", HEADER) as w:
        for i in range(100):
            w.append({"k": "x", "v": a if i % 2 else b})
    records = read_trace(tmp_path / "t").all_records
    assert {id(r["v"]) for r in records} == {id(records[0]["v"]), id(records[1]["v"])}
    assert [r["v"] for r in records] == [a if i % 2 else b for i in range(100)]


def test_too_many_blob_references_in_one_frame(tmp_path: Path) -> None:
    """One frame may name at most MAX_BLOB_REFS blobs."""
    data = b"q" * 5000
    digest = hashlib.sha256(data).digest()
    blob = cbor2.dumps({"k": "blob", "sha256": digest.hex(), "data": data})
    refs = [cbor2.CBORTag(TAG_BLOB, digest)] * (MAX_BLOB_REFS + 1)
    path = raw_trace(tmp_path / "t", blob, cbor2.dumps({"k": "x", "v": refs}))
    with pytest.raises(TraceCorrupt, match="blob references"):
        read_trace(path)


def _valid_records() -> list[dict[str, Any]]:
    sha = "ab" * 32
    return [
        {"k": "instance", "i": 0, "component": sha, "budget": {"fuel": 10}, "policy": {}},
        {"k": "call", "i": 0, "s": 0, "fn": "f", "args": [], "budget": {"fuel": 10}},
        {"k": "import", "i": 0, "s": 1, "if": "a", "fn": "b", "args": [], "res": 1, "out": "ok"},
        {"k": "export", "i": 0, "s": 2, "fn": "f", "res": 1, "ok": True, "error": None},
        {"k": "close", "i": 0, "stdout": b"", "stderr": b""},
    ]


_JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(), st.text(max_size=5), st.binary(max_size=5),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)  # fmt: skip


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    which=st.integers(0, 4),
    field=st.sampled_from(["i", "s", "fn", "if", "args", "res", "out", "ok", "error", "budget",
                           "component", "stdout", "stderr", "fuel"]),
    junk=_JUNK,
    drop=st.booleans(),
)  # fmt: skip
def test_malformed_records_are_trace_errors(
    tmp_path: Path, which: int, field: str, junk: Any, drop: bool
) -> None:
    """Any field of any record dropped or replaced: a TraceError naming the offset, or fine."""
    records = _valid_records()
    if drop:
        records[which].pop(field, None)
    else:
        records[which][field] = junk
    path = tmp_path / "t"
    path.unlink(missing_ok=True)
    with TraceWriter(path, HEADER) as w:
        for r in records:
            w.append(r)
    summary_error = _error_of(summarize, path)
    if summary_error is not None:
        assert isinstance(summary_error, TraceInvalid), summary_error
        assert summary_error.offset > 0
        assert f"byte {summary_error.offset}" in str(summary_error)
    # Replay finds no component for the made-up sha: a HostError at worst, never internal.
    assert isinstance(_error_of(replay_trace, path), HostError)


def _error_of(fn: Any, path: Path) -> BaseException | None:
    try:
        fn(path)
    except Exception as exc:  # noqa: BLE001 - the test inspects whatever came out
        return exc
    return None


def test_non_int_instance_ids_are_invalid(tmp_path: Path) -> None:
    """A trace whose instance ids are not ints does not "replay ok" having replayed nothing."""
    records = _valid_records()
    for r in records:
        r["i"] = "zero"
    with TraceWriter(tmp_path / "t", HEADER) as w:
        for r in records:
            w.append(r)
    with pytest.raises(TraceInvalid, match='field "i"'):
        replay_trace(tmp_path / "t")
    with TraceWriter(tmp_path / "empty", HEADER) as w:
        w.append({"k": "note", "text": "nothing"})
    with pytest.raises(TraceInvalid, match="no instance to replay"):
        replay_trace(tmp_path / "empty")


def _record_budget_trace(tmp_path: Path, budget_wasm_path: Path) -> Path:
    trace = tmp_path / "rec.mtytrace"
    with Recorder(trace) as recorder:
        instance = Instance(Component.load(budget_wasm_path), record=recorder)
        try:
            instance.call("count", 10)
        finally:
            instance.close()
    return trace


def _rewrite(src: Path, dst: Path, change: Any) -> Path:
    trace = read_trace(src)
    with TraceWriter(dst, {k: v for k, v in trace.header.items() if k != "format"}) as w:
        for record in trace.records():
            w.append(change(dict(record)))
    return dst


def test_component_path_checked_before_reading(tmp_path: Path, budget_wasm_path: Path) -> None:
    """A trace naming a 3 GiB file, a FIFO or /dev/zero as its component reads none of them."""
    import os

    trace = _record_budget_trace(tmp_path, budget_wasm_path)
    big = tmp_path / "big.wasm"
    with big.open("wb") as f:
        f.truncate(3 << 30)
    fifo = tmp_path / "fifo.wasm"
    os.mkfifo(fifo)
    for target, message in ((big, "over the replay limit"), (fifo, "not a regular file"),
                            (Path("/dev/zero"), "not a regular file")):  # fmt: skip

        def point(r: dict[str, Any], target: Path = target) -> dict[str, Any]:
            if r["k"] == "instance":
                r["path"] = str(target)
            return r

        bad = _rewrite(trace, tmp_path / f"{target.name}.mtytrace", point)
        with pytest.raises(HostError, match=message):
            replay_trace(bad, store=ComponentStore(tmp_path / "empty-store"))
    assert replay_trace(trace).instances[0].exports == 1  # the host is fine after


def test_replay_caps_a_rewritten_budget(tmp_path: Path, budget_wasm_path: Path) -> None:
    """A trace rewritten to spin under 2**62 fuel and 4 GiB runs under the replayer's limits."""
    trace = _record_budget_trace(tmp_path, budget_wasm_path)
    huge = {"fuel": 1 << 62, "memory": 4 << 30, "timeout": 1e9}

    def spin(r: dict[str, Any]) -> dict[str, Any]:
        if r["k"] in ("instance", "call"):
            r["budget"] = huge
        if r["k"] in ("call", "export"):
            r["fn"], r["args"] = "spin", []
        if r["k"] == "export":
            r["res"] = None
        return r

    bad = _rewrite(trace, tmp_path / "spin.mtytrace", spin)
    limits = ReplayLimits(fuel=10_000_000, memory=16 << 20, timeout=30)
    with pytest.raises(ReplayLimitExceeded, match="raise --max-fuel"):
        replay_trace(bad, limits=limits)
    assert DEFAULT_REPLAY_LIMITS.fuel < huge["fuel"]
    assert limits.cap(huge, 0) == (Budget(fuel=10_000_000, memory=16 << 20, timeout=30), True)
    assert replay_trace(trace, limits=limits).instances[0].exports == 1


def test_replay_limits_are_validated() -> None:
    """Nonsense limits are refused when made, like a Budget."""
    with pytest.raises(ValueError, match="fuel"):
        ReplayLimits(fuel=0)
    with pytest.raises(ValueError, match="component_bytes"):
        ReplayLimits(component_bytes=0)


def test_reader_stays_usable_after_refusals(tmp_path: Path) -> None:
    """After a refused frame the process reads good traces as before."""
    with TraceWriter(tmp_path / "good", HEADER) as w:
        w.append({"k": "x", "v": b"z" * 10_000})
    with TraceReader(tmp_path / "good") as reader:
        assert [r["v"] for r in reader.records()] == [b"z" * 10_000]


def test_mty_replay_takes_the_limits(tmp_path: Path, budget_wasm_path: Path) -> None:
    """`mty replay --max-fuel` caps a rewritten budget and reports which limit to raise."""
    import json
    import subprocess
    import sys

    trace = _record_budget_trace(tmp_path, budget_wasm_path)

    def spin(r: dict[str, Any]) -> dict[str, Any]:
        if r["k"] in ("instance", "call"):
            r["budget"] = {"fuel": 1 << 62, "memory": 4 << 30, "timeout": 1e9}
        if r["k"] in ("call", "export"):
            r["fn"], r["args"] = "spin", []
        if r["k"] == "export":
            r["res"] = None
        return r

    bad = _rewrite(trace, tmp_path / "spin.mtytrace", spin)
    mty = str(Path(sys.executable).parent / "mty")
    done = subprocess.run(
        [mty, "replay", str(bad), "--max-fuel", "1000000", "--timeout", "30", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["ok"] is False
    assert out["error"]["kind"] == "replay_limit"
    ok = subprocess.run(
        [mty, "replay", str(trace), "--max-fuel", "1000000", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert json.loads(ok.stdout)["ok"] is True


def _http_read(result: Any) -> bytes:
    """An import record of a wasi:http response body read, with ``result`` as its result."""
    return cbor2.dumps(
        {
            "k": "import",
            "i": 1,
            "s": 1,
            "if": "wasi:io/streams@0.2.9",
            "fn": "[method]input-stream.read",
            "args": [1, 65536],
            "res": result,
            "fuel": 0,
        }
    )


def test_a_recorded_http_body_claiming_a_terabyte_is_refused_before_allocation(
    tmp_path: Path,
) -> None:
    """A recorded response body whose CBOR head claims 2**40 bytes, in a small frame, is
    corrupt: nothing that size is allocated."""
    record = _http_read(b"x")
    claimed = b"\x5b" + (1 << 40).to_bytes(8, "big") + b"payload"
    hostile = record.replace(b"\x41x", claimed)
    assert hostile != record
    with pytest.raises(TraceError):
        read_trace(raw_trace(tmp_path / "t", hostile))


def test_a_recorded_http_body_over_the_frame_limit_is_refused(tmp_path: Path) -> None:
    """A frame whose header claims more than MAX_FRAME bytes is refused by its size alone."""
    from mighty.trace._format import MAX_FRAME

    path = raw_trace(tmp_path / "t", _http_read(b"y" * 1000))
    data = bytearray(path.read_bytes())
    # The last frame's length field: claim MAX_FRAME + 1 bytes (its CRC then fails too).
    last = data.rfind(struct.pack(">I", len(_http_read(b"y" * 1000))))
    data[last : last + 4] = struct.pack(">I", MAX_FRAME + 1)
    path.write_bytes(bytes(data))
    with pytest.raises(TraceError):
        read_trace(path)
