"""Captured stdout/stderr: permits, chunking, caps and totals, as a guest drives them."""

from __future__ import annotations

import ctypes

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from mighty.abi import Err, Ok
from mighty.gate import GuestContext
from mighty.wasi._output import LIFT_LIMIT, WRITE_PERMIT, CaptureOutput, LimitedSink
from mighty.wasi._policy import OutputPolicy, Policy
from tests.wasi import call, make_ctx

S = "wasi:io/streams"


def _cpython_print(ctx: GuestContext, out: CaptureOutput, data: bytes) -> int:
    """What CPython under componentize-py does for one ``print``: wasi-libc's ``write()`` asks
    check-write, writes ``min(permit, n)`` and returns that count, which the unbuffered text
    layer ignores. Returns the count libc reported."""
    permit = call(ctx, S, "[method]output-stream.check-write", out)
    assert isinstance(permit, Ok)
    count: int = min(permit.value, len(data))
    assert call(ctx, S, "[method]output-stream.write", out, data[:count]) == Ok(None)
    assert call(ctx, S, "[method]output-stream.blocking-flush", out) == Ok(None)
    return count


class _Limit:
    """A limited sink like the sandbox's: it raises once more than ``limit`` bytes arrived."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.seen = bytearray()

    def __call__(self, chunk: bytes, /) -> None:
        self.seen += chunk
        if len(self.seen) > self.limit:
            raise _Tripped

    def room(self) -> int:
        return max(0, self.limit - len(self.seen))


class _Tripped(Exception):
    """The limited sink's limit was passed."""


def test_permit_survives_guest_integer_casts() -> None:
    """The permit is positive as u32 and i32 (guests cast it) and above the lifting limit."""
    assert ctypes.c_uint32(WRITE_PERMIT).value == WRITE_PERMIT
    assert ctypes.c_int32(WRITE_PERMIT).value == WRITE_PERMIT
    assert WRITE_PERMIT > LIFT_LIMIT > 1 << 21


@pytest.mark.parametrize("size", [(1 << 16) - 1, 1 << 16, (1 << 16) + 1, 1 << 20, LIFT_LIMIT])
def test_one_print_is_taken_whole(size: int) -> None:
    """A CPython-style write of any size wasmtime can lift lands whole: nothing is cut."""
    ctx = make_ctx()
    out = CaptureOutput(LIFT_LIMIT)
    data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    assert _cpython_print(ctx, out, data) == size
    assert out.getvalue() == data
    assert out.total == size
    assert not out.truncated


def test_print_past_the_cap_is_counted_exactly() -> None:
    """Past the cap the capture keeps the prefix, counts every byte and says it truncated."""
    ctx = make_ctx()
    out = CaptureOutput(OutputPolicy(cap=1 << 20).cap)
    data = b"y" * (2 << 20)
    assert _cpython_print(ctx, out, data) == len(data)
    assert out.getvalue() == data[: 1 << 20]
    assert out.total == 2 << 20
    assert out.kept == 1 << 20
    assert out.truncated


def test_limited_sink_caps_the_permit_one_past_its_room() -> None:
    """With a limited sink, check-write grants room + 1, so passing the limit trips the sink."""
    ctx = make_ctx()
    sink = _Limit(100)
    assert isinstance(sink, LimitedSink)
    out = CaptureOutput(100, sink)
    assert call(ctx, S, "[method]output-stream.check-write", out) == Ok(101)
    _cpython_print(ctx, out, b"a" * 60)
    assert call(ctx, S, "[method]output-stream.check-write", out) == Ok(41)
    with pytest.raises(_Tripped):
        _cpython_print(ctx, out, b"b" * 10_000)
    assert len(sink.seen) == 101


def test_plain_sink_is_not_limited() -> None:
    """A plain callable sink sees every byte and leaves the permit at its maximum."""
    ctx = make_ctx()
    seen: list[bytes] = []
    out = CaptureOutput(4, seen.append)
    assert not isinstance(seen.append, LimitedSink)
    assert call(ctx, S, "[method]output-stream.check-write", out) == Ok(WRITE_PERMIT)
    _cpython_print(ctx, out, b"hello world")
    assert b"".join(seen) == b"hello world"
    assert out.getvalue() == b"hell"


def test_write_zeroes_is_bounded_by_max_read() -> None:
    """write-zeroes within the permit but past max_read fails: the host makes those bytes."""
    ctx = make_ctx(Policy(max_read=1000))
    out = CaptureOutput(1 << 20)
    assert call(ctx, S, "[method]output-stream.write-zeroes", out, 1000) == Ok(None)
    result = call(ctx, S, "[method]output-stream.write-zeroes", out, 1001)
    assert isinstance(result, Err)
    assert out.total == 1000


def test_capture_rejects_a_non_positive_permit() -> None:
    """A capture's permit must be positive."""
    with pytest.raises(ValueError, match="permit"):
        CaptureOutput(1, permit=0)


@given(
    sizes=st.lists(st.integers(0, 5000), max_size=12),
    cap=st.integers(0, 20_000),
    permit=st.integers(1, 3000),
)
def test_blocking_write_and_flush_chunks_within_the_permit(
    sizes: list[int], cap: int, permit: int
) -> None:
    """blocking-write-and-flush of any size arrives in order, in chunks no larger than the permit."""
    ctx = make_ctx()
    chunks: list[bytes] = []
    out = CaptureOutput(cap, chunks.append, permit=permit)
    sent = b""
    for i, size in enumerate(sizes):
        data = bytes([i % 256]) * size
        assert call(ctx, S, "[method]output-stream.blocking-write-and-flush", out, data) == Ok(None)
        sent += data
    assert all(0 < len(c) <= permit for c in chunks)
    assert b"".join(chunks) == sent
    assert out.getvalue() == sent[:cap]
    assert out.total == len(sent)
    assert out.truncated == (len(sent) > cap)


class CaptureMachine(RuleBasedStateMachine):
    """A guest mixing every output call on one capture; the model is the bytes it meant."""

    @initialize(cap=st.integers(0, 4000), permit=st.integers(1, 2000), limited=st.booleans())
    def start(self, cap: int, permit: int, limited: bool) -> None:
        self.ctx = make_ctx(Policy(max_read=1500))
        self.limit = _Limit(cap) if limited else None
        self.plain: list[bytes] = []
        sink = self.limit if self.limit is not None else self.plain.append
        self.out = CaptureOutput(cap, sink, permit=permit)
        self.cap = cap
        self.sent = bytearray()
        self.tripped = False

    def _do(self, name: str, arg: object, data: bytes) -> None:
        if self.tripped:
            return
        try:
            result = call(self.ctx, S, f"[method]output-stream.{name}", self.out, arg)
        except _Tripped:
            self.tripped = True
            self.sent += data
            return
        if isinstance(result, Ok):
            self.sent += data

    @rule(size=st.integers(0, 3000), byte=st.integers(0, 255))
    def print_(self, size: int, byte: int) -> None:
        """A CPython print: check-write, then write what the permit allows (the rest is lost
        to the guest's own text layer, which the permit must make impossible below the cap)."""
        if self.tripped:
            return
        data = bytes([byte]) * size
        permit = call(self.ctx, S, "[method]output-stream.check-write", self.out).value
        self._do("write", data[: min(permit, size)], data[: min(permit, size)])

    @rule(size=st.integers(0, 3000), byte=st.integers(0, 255))
    def blocking(self, size: int, byte: int) -> None:
        data = bytes([byte]) * size
        self._do("blocking-write-and-flush", data, data)

    @rule(size=st.integers(0, 2000))
    def zeroes(self, size: int) -> None:
        if self.tripped:
            return
        permit = call(self.ctx, S, "[method]output-stream.check-write", self.out).value
        if size <= min(permit, 1500):
            self._do("write-zeroes", size, bytes(size))

    @invariant()
    def capture_matches_the_model(self) -> None:
        if not hasattr(self, "out"):
            return
        sent = bytes(self.sent)
        seen = bytes(self.limit.seen) if self.limit is not None else b"".join(self.plain)
        if self.tripped:
            # The write that passed the limit reached the sink past the limit, and stopped.
            assert self.limit is not None
            assert len(seen) > self.cap
            assert sent.startswith(seen)
            return
        assert seen == sent
        assert self.out.getvalue() == sent[: self.cap]
        assert self.out.total == len(sent)
        assert self.out.truncated == (len(sent) > self.cap)
        if self.limit is not None:
            assert len(sent) <= self.cap


CaptureMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=20)
test_capture_state_machine = CaptureMachine.TestCase
test_capture_state_machine.__doc__ = "Every mix of output calls keeps a prefix, counts all bytes."
