"""wasi:io: stream reads and writes, bounds, errors, poll."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mighty import Cancelled, CancelScope, DeadlineExceeded, HostError
from mighty.abi import Err, Ok, Variant
from mighty.budget import CallScope
from mighty.gate import GuestContext, Handle
from mighty.wasi import _io
from mighty.wasi._cli import BytesInput
from mighty.wasi._io import PollRefused, ReadyPollable, VirtualPollable
from mighty.wasi._output import CaptureOutput
from mighty.wasi._policy import Policy
from mighty.wasi._streams import IO_ERROR, POLLABLE, OutputStream, Pollable, StreamClosed
from tests.wasi import call, make_ctx, obj

S = "wasi:io/streams"
U64_MAX = (1 << 64) - 1


class _Never(Pollable):
    def ready(self) -> bool:
        return False


def _returns_within(seconds: float, work: Callable[[], object]) -> bool:
    """Whether ``work`` returned within ``seconds`` (run on a daemon thread that is left behind
    if not): a bound far from both outcomes, not a guess at how fast the machine is."""
    done = threading.Event()

    def run() -> None:
        work()
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done.wait(seconds)


class _Soon(Pollable):
    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds

    def ready(self) -> bool:
        return time.monotonic() >= self.at

    def wait_seconds(self) -> float:
        return max(0.0, self.at - time.monotonic())


class _Closed(OutputStream):
    def write(self, data: bytes) -> None:
        raise AssertionError("never called")

    def check_write(self) -> int:
        raise StreamClosed("closed")


def _debug(ctx: GuestContext, result: object) -> str:
    assert isinstance(result, Err)
    assert isinstance(result.value, Variant)
    assert result.value.case == "last-operation-failed"
    handle = result.value.value
    assert isinstance(handle, Handle)
    assert handle.kind is IO_ERROR
    return str(call(ctx, "wasi:io/error", "[method]error.to-debug-string", obj(ctx, handle)))


def test_resources_are_the_shared_kinds() -> None:
    """_io declares exactly the four shared kinds of _streams."""
    assert [k.name for k in _io.resources()] == [
        "input-stream",
        "output-stream",
        "pollable",
        "error",
    ]


def test_read_of_u64_max_is_bounded_by_max_read() -> None:
    """A read of 2**64-1 bytes returns at most max_read bytes."""
    ctx = make_ctx(Policy(max_read=10))
    result = call(ctx, S, "[method]input-stream.read", BytesInput(b"x" * 100), U64_MAX)
    assert result == Ok(b"x" * 10)


@given(data=st.binary(max_size=300), length=st.integers(0, U64_MAX), cap=st.integers(1, 64))
def test_read_never_exceeds_length_or_max_read(data: bytes, length: int, cap: int) -> None:
    """Every read returns at most min(len, max_read) bytes, and reads concatenate to the input."""
    ctx = make_ctx(Policy(max_read=cap))
    stream = BytesInput(data)
    got = b""
    for _ in range(400):
        result = call(ctx, S, "[method]input-stream.read", stream, length)
        if result == Err(Variant("closed")):
            break
        assert isinstance(result, Ok)
        assert len(result.value) <= min(length, cap)
        got += result.value
        if length == 0:
            break
    if length:
        assert got == data


def test_read_after_end_is_closed() -> None:
    """Reading an exhausted stream gives stream-error.closed, blocking or not."""
    ctx = make_ctx()
    stream = BytesInput(b"ab")
    assert call(ctx, S, "[method]input-stream.blocking-read", stream, 5) == Ok(b"ab")
    assert call(ctx, S, "[method]input-stream.read", stream, 5) == Err(Variant("closed"))
    assert call(ctx, S, "[method]input-stream.blocking-read", stream, 5) == Err(Variant("closed"))
    assert call(ctx, S, "[method]input-stream.skip", stream, 5) == Err(Variant("closed"))


def test_skip_counts_bytes() -> None:
    """skip and blocking-skip return how many bytes were skipped, bounded by max_read."""
    ctx = make_ctx(Policy(max_read=4))
    stream = BytesInput(b"abcdefgh")
    assert call(ctx, S, "[method]input-stream.skip", stream, U64_MAX) == Ok(4)
    assert call(ctx, S, "[method]input-stream.blocking-skip", stream, 3) == Ok(3)
    assert call(ctx, S, "[method]input-stream.read", stream, 10) == Ok(b"h")


def test_write_within_permit_is_captured() -> None:
    """check-write grants a permit; a write within it lands in the stream."""
    ctx = make_ctx()
    out = CaptureOutput(100)
    permit = call(ctx, S, "[method]output-stream.check-write", out)
    assert isinstance(permit, Ok) and permit.value > 0
    assert call(ctx, S, "[method]output-stream.write", out, b"hi") == Ok(None)
    assert call(ctx, S, "[method]output-stream.flush", out) == Ok(None)
    assert out.getvalue() == b"hi"


def test_write_beyond_check_write_fails() -> None:
    """A write larger than the permit is last-operation-failed with a readable error."""
    ctx = make_ctx()
    out = CaptureOutput(10, permit=16)
    permit = call(ctx, S, "[method]output-stream.check-write", out).value
    assert permit == 16
    result = call(ctx, S, "[method]output-stream.write", out, bytes(permit + 1))
    assert "exceeds the check-write permit" in _debug(ctx, result)
    assert out.total == 0
    zeroes = call(ctx, S, "[method]output-stream.write-zeroes", out, U64_MAX)
    assert "exceeds" in _debug(ctx, zeroes)


def test_closed_output_stream() -> None:
    """Every output operation on a closed stream is stream-error.closed."""
    ctx = make_ctx()
    out = _Closed()
    closed = Err(Variant("closed"))
    assert call(ctx, S, "[method]output-stream.check-write", out) == closed
    assert call(ctx, S, "[method]output-stream.write", out, b"x") == closed
    assert call(ctx, S, "[method]output-stream.blocking-write-and-flush", out, b"x") == closed
    assert call(ctx, S, "[method]output-stream.flush", out) == closed
    assert call(ctx, S, "[method]output-stream.blocking-flush", out) == closed
    assert call(ctx, S, "[method]output-stream.write-zeroes", out, 1) == closed
    assert call(ctx, S, "[method]output-stream.splice", out, BytesInput(b"a"), 1) == closed


def test_blocking_write_and_zeroes() -> None:
    """blocking-write-and-flush accepts any size in chunks; zeroes are bounded by max_read."""
    ctx = make_ctx(Policy(max_read=1 << 20))
    out = CaptureOutput(1 << 21)
    big = bytes(range(256)) * 1024  # beyond one permit
    assert call(ctx, S, "[method]output-stream.blocking-write-and-flush", out, big) == Ok(None)
    assert call(ctx, S, "[method]output-stream.blocking-write-zeroes-and-flush", out, 5) == Ok(None)
    assert call(ctx, S, "[method]output-stream.write-zeroes", out, 3) == Ok(None)
    assert out.getvalue() == big + bytes(8)
    result = call(ctx, S, "[method]output-stream.blocking-write-zeroes-and-flush", out, U64_MAX)
    assert "exceeds" in _debug(ctx, result)


def test_splice_moves_bounded_bytes() -> None:
    """splice moves at most min(len, max_read, permit) bytes and reports closed at the end."""
    ctx = make_ctx(Policy(max_read=3))
    src = BytesInput(b"abcdefg")
    out = CaptureOutput(100)
    assert call(ctx, S, "[method]output-stream.splice", out, src, U64_MAX) == Ok(3)
    assert call(ctx, S, "[method]output-stream.blocking-splice", out, src, 2) == Ok(2)
    assert call(ctx, S, "[method]output-stream.blocking-splice", out, src, 9) == Ok(2)
    assert call(ctx, S, "[method]output-stream.splice", out, src, 9) == Err(Variant("closed"))
    assert out.getvalue() == b"abcdefg"


def test_subscribe_gives_ready_pollables() -> None:
    """Streams subscribe to pollables that are ready when the stream is."""
    ctx = make_ctx()
    h_in = call(ctx, S, "[method]input-stream.subscribe", BytesInput(b""))
    h_out = call(ctx, S, "[method]output-stream.subscribe", CaptureOutput(1))
    assert h_in.kind is POLLABLE and h_out.kind is POLLABLE
    pollables = [obj(ctx, h_in), obj(ctx, h_out)]
    assert call(ctx, "wasi:io/poll", "poll", pollables) == [0, 1]
    assert call(ctx, "wasi:io/poll", "[method]pollable.ready", pollables[0]) is True
    assert call(ctx, "wasi:io/poll", "[method]pollable.block", pollables[1]) is None


def test_empty_poll_raises() -> None:
    """poll([]) is refused with a clear host error (WASI says trap)."""
    with pytest.raises(PollRefused, match="empty list"):
        call(make_ctx(), "wasi:io/poll", "poll", [])


def test_poll_on_never_ready_raises_at_once() -> None:
    """Polling only pollables that can never become ready stops the guest instead of hanging."""
    raised: list[BaseException] = []

    def poll() -> None:
        try:
            call(make_ctx(), "wasi:io/poll", "poll", [_Never(), _Never()])
        except PollRefused as exc:
            raised.append(exc)

    # Hanging is forever: a minute tells the two apart on any machine, however loaded.
    assert _returns_within(60, poll)
    assert len(raised) == 1 and "ever make ready" in str(raised[0])


def test_poll_waits_for_earliest() -> None:
    """poll sleeps until a pollable with a wake-up time is ready and returns only ready indices."""
    got = call(make_ctx(), "wasi:io/poll", "poll", [_Never(), _Soon(0.02), _Soon(30)])
    assert got == [1]


def test_poll_prefers_virtual_time() -> None:
    """A virtual pollable is fired instead of sleeping, even next to a real one."""

    class _Virtual(VirtualPollable):
        fired = False

        def ready(self) -> bool:
            return self.fired

        def virtual_wait(self) -> int:
            return 10**18

        def fire(self) -> None:
            self.fired = True

    got: list[object] = []
    # The real one wakes in an hour: a tenth of it tells firing from sleeping, however loaded.
    poll = [_Soon(3600), _Virtual()]
    assert _returns_within(360, lambda: got.append(call(make_ctx(), "wasi:io/poll", "poll", poll)))
    assert got == [[1]]


def test_the_call_scope_stops_a_wait() -> None:
    """A wait in poll is a wait of the call's scope: a cancel from another thread ends it."""
    ctx = make_ctx()
    cancel = CancelScope()
    ctx.scope = CallScope(60.0, cancel)
    timer = threading.Timer(0.05, cancel.cancel, args=("stop waiting",))
    timer.start()
    try:
        with pytest.raises(Cancelled) as info:
            call(ctx, "wasi:io/poll", "[method]pollable.block", _Soon(30))
    finally:
        timer.cancel()
    assert (info.value.by, info.value.reason) == ("host", "stop waiting")


def test_the_call_deadline_stops_a_sleep() -> None:
    """A guest sleeping past its call's deadline is stopped with DeadlineExceeded."""
    ctx = make_ctx()
    ctx.scope = CallScope(0.05, None)
    with pytest.raises(DeadlineExceeded):
        call(ctx, "wasi:io/poll", "poll", [_Soon(30)])


def test_a_wait_outside_a_call_is_refused() -> None:
    """With no call in flight there is no deadline to bound a wait: it is refused."""
    ctx = make_ctx()
    pollable = _Soon(30)
    with pytest.raises(HostError, match="outside a guest call"):
        _io.wait_any(ctx, [pollable])


def test_wait_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real wait longer than MAX_BLOCK_SECONDS is refused instead of blocking the host."""
    monkeypatch.setattr(_io, "MAX_BLOCK_SECONDS", 0.05)
    with pytest.raises(PollRefused, match="blocked for more than"):
        call(make_ctx(), "wasi:io/poll", "poll", [_Soon(30)])


def test_ready_pollable() -> None:
    """ReadyPollable is always ready."""
    assert call(make_ctx(), "wasi:io/poll", "poll", [ReadyPollable()]) == [0]
