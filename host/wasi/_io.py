"""``wasi:io`` 0.2: error, poll and streams, served over the host stream objects of ``_streams``.

Every length a guest passes is bounded by ``Policy.max_read`` before anything is allocated, so a
read of 2**64-1 bytes returns at most ``max_read`` bytes.

Waiting (``poll``, ``pollable.block`` and the ``blocking-*`` methods) never hangs the host:

- pollables on a host-controlled clock (:class:`VirtualPollable`, the fixed and virtual clocks)
  are made ready by moving that clock, instantly, instead of sleeping;
- otherwise the host sleeps until the earliest ``wait_seconds()`` through the call's scope
  (``ctx.scope.wait``: in slices, so a deadline, a cancel or a Ctrl-C stops a sleeping guest),
  and gives up with :class:`PollRefused` after ``MAX_BLOCK_SECONDS`` in one call;
- a wait on pollables that are not ready and give no wake-up time could only end by something
  outside the guest, which does not exist in this host: it raises :class:`PollRefused` at once
  (the guest traps with that message) rather than sleep until the deadline.

Rejected: returning an empty list from ``poll`` after a bounded wait. The WIT promises at least
one ready index, and guests (wasi-libc's ``poll``) would spin on it.

One deliberate difference from the WIT: a ``write`` beyond the ``check-write`` permit is the
error ``last-operation-failed`` rather than a trap, so a careless guest gets a readable error.

Permits must cover every write a guest makes: CPython's unbuffered stdio drops what a short
write leaves over (see ``_output``), so the captures grant more than any single write can carry.
``blocking-write-and-flush`` takes any size and feeds the stream in chunks of its permit; only the
zeroes of the ``*-zeroes`` calls are made by the host, so those are bounded by ``max_read``.
"""

from __future__ import annotations

import threading
import time
from abc import abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mighty.abi import Err, Ok, Variant
from mighty.gate import Binding, GuestContext, GuestViolation, ResourceKind, Slot
from mighty.wasi._policy import Policy
from mighty.wasi._streams import (
    INPUT_STREAM,
    IO_ERROR,
    OUTPUT_STREAM,
    POLLABLE,
    CodedMessage,
    InputStream,
    OutputStream,
    Pollable,
    StreamClosed,
    StreamFailed,
)

__all__ = [
    "MAX_BLOCK_SECONDS",
    "PollRefused",
    "ReadyPollable",
    "StreamPollable",
    "VirtualPollable",
    "bindings",
    "resources",
    "setup",
    "wait_any",
]

_OK = Ok(None)
"""The result of most stream calls (``Ok`` is frozen: one object serves every call)."""

MAX_BLOCK_SECONDS = 60.0
"""The longest one blocking call may sleep in real time before the guest is stopped."""
_ZEROES = bytes(1 << 16)


class PollRefused(GuestViolation):
    """The guest asked to wait in a way that cannot end: an empty ``poll``, pollables that can
    never become ready, or a wait longer than ``MAX_BLOCK_SECONDS``. The guest traps."""


class VirtualPollable(Pollable):
    """A pollable on a clock the host controls: waiting for it moves the clock, never sleeps."""

    @abstractmethod
    def virtual_wait(self) -> int:
        """Nanoseconds of the clock's time until it is ready (0 if ready)."""

    @abstractmethod
    def fire(self) -> None:
        """Move the clock so this pollable is ready."""


class ReadyPollable(Pollable):
    """Always ready (for resources with nothing to wait for)."""

    def ready(self) -> bool:
        return True


class StreamPollable(Pollable):
    """Ready when the stream it was subscribed from is (``stream.ready()``)."""

    def __init__(self, stream: InputStream | OutputStream) -> None:
        self.stream = stream

    def ready(self) -> bool:
        return self.stream.ready()

    def waker(self) -> threading.Event | None:
        return self.stream.waker()


@dataclass(frozen=True, slots=True)
class _IoState:
    policy: Policy


_STATE: Slot[_IoState] = Slot("wasi.io")


def _policy(ctx: GuestContext) -> Policy:
    return ctx.slot(_STATE).policy


def resources() -> list[ResourceKind]:
    """The shared stream, pollable and error kinds (defined in ``_streams``)."""
    return [INPUT_STREAM, OUTPUT_STREAM, POLLABLE, IO_ERROR]


def setup(ctx: GuestContext, policy: Policy) -> None:
    """Remember the policy (for ``max_read``)."""
    ctx.put(_STATE, _IoState(policy))


# -- waiting --------------------------------------------------------------------------------


def _ready(pollables: Sequence[Pollable]) -> list[int]:
    return [i for i, p in enumerate(pollables) if p.ready()]


def wait_any(ctx: GuestContext, pollables: Sequence[Pollable]) -> list[int]:
    """The indices of the ready pollables, waiting (boundedly) until there is at least one."""
    if not pollables:
        raise PollRefused("wasi:io/poll.poll was called with an empty list (WASI: trap)")
    ready = _ready(pollables)
    if ready:
        return ready
    virtual = [p for p in pollables if isinstance(p, VirtualPollable)]
    if virtual:
        # Host-controlled time jumps to the earliest deadline: a sleeping guest costs nothing
        # and the run stays deterministic.
        min(virtual, key=lambda p: p.virtual_wait()).fire()
        ready = _ready(pollables)
        if not ready:
            raise PollRefused("a virtual-clock pollable was fired but did not become ready")
        return ready

    wakers = list({id(w): w for p in pollables if (w := p.waker()) is not None}.values())

    def sleep(most: float) -> bool:
        nonlocal ready
        waits = [w for p in pollables if (w := p.wait_seconds()) is not None]
        if not waits and not wakers:
            raise PollRefused(
                f"the guest waits on {len(pollables)} pollable(s) that are not ready and "
                "that nothing in this host will ever make ready"
            )
        longest = max(0.0, min(*waits, most)) if waits else most
        if wakers:
            # Cleared before the check, so a wake-up between the check and the wait is kept.
            for waker in wakers:
                waker.clear()
            ready = _ready(pollables)
            if ready:
                return True
            # One instance's host threads share one waker; several are waited on in turns.
            wakers[0].wait(longest if len(wakers) == 1 else min(longest, 0.005))
        else:
            time.sleep(longest)
        ready = _ready(pollables)
        return bool(ready)

    if not ctx.scope.wait(sleep, MAX_BLOCK_SECONDS):
        raise PollRefused(f"the guest blocked for more than {MAX_BLOCK_SECONDS:g} s in one wait")
    return ready


# -- wasi:io/error and wasi:io/poll ---------------------------------------------------------


def _error_to_debug_string(_ctx: GuestContext, error: object) -> str:
    return str(error)


def _pollable_ready(_ctx: GuestContext, pollable: Pollable) -> bool:
    return pollable.ready()


def _pollable_block(ctx: GuestContext, pollable: Pollable) -> None:
    wait_any(ctx, [pollable])


def _poll(ctx: GuestContext, pollables: Sequence[Pollable]) -> list[int]:
    return wait_any(ctx, pollables)


# -- wasi:io/streams ------------------------------------------------------------------------


def _failed(ctx: GuestContext, message: str) -> Err:
    return Err(Variant("last-operation-failed", ctx.new(IO_ERROR, message)))


def _stream_error(ctx: GuestContext, exc: Exception) -> Err:
    if isinstance(exc, StreamClosed):
        return Err(Variant("closed"))
    message = str(exc) or type(exc).__name__
    code = exc.code if isinstance(exc, StreamFailed) else None
    if code is None:
        return _failed(ctx, message)
    return Err(Variant("last-operation-failed", ctx.new(IO_ERROR, CodedMessage(message, code))))


# A failing file or device is the guest's error to handle, not a host bug: OSError is reported
# like StreamFailed. Anything else escaping a stream is a host bug and traps the guest.
_STREAM_ERRORS = (StreamClosed, StreamFailed, OSError)


def _read_bounded(ctx: GuestContext, stream: InputStream, length: int) -> bytes:
    limit = min(length, _policy(ctx).max_read)
    data = stream.read(limit)
    if len(data) > limit:
        raise RuntimeError(f"{type(stream).__name__}.read({limit}) returned {len(data)} bytes")
    return bytes(data)


def _read(ctx: GuestContext, stream: InputStream, length: int) -> Ok | Err:
    try:
        return Ok(_read_bounded(ctx, stream, length))
    except _STREAM_ERRORS as exc:
        return _stream_error(ctx, exc)


def _blocking_read(ctx: GuestContext, stream: InputStream, length: int) -> Ok | Err:
    try:
        while True:
            data = _read_bounded(ctx, stream, length)
            if data or length == 0:
                return Ok(data)
            wait_any(ctx, [StreamPollable(stream)])
    except _STREAM_ERRORS as exc:
        return _stream_error(ctx, exc)


def _skip(ctx: GuestContext, stream: InputStream, length: int) -> Ok | Err:
    result = _read(ctx, stream, length)
    return Ok(len(result.value)) if isinstance(result, Ok) else result


def _blocking_skip(ctx: GuestContext, stream: InputStream, length: int) -> Ok | Err:
    result = _blocking_read(ctx, stream, length)
    return Ok(len(result.value)) if isinstance(result, Ok) else result


def _input_subscribe(ctx: GuestContext, stream: InputStream) -> Any:
    return ctx.new(POLLABLE, StreamPollable(stream))


def _check_write(ctx: GuestContext, stream: OutputStream) -> Ok | Err:
    try:
        return Ok(stream.check_write())
    except _STREAM_ERRORS as exc:
        return _stream_error(ctx, exc)


def _over_permit(ctx: GuestContext, size: int, permit: int) -> Err:
    return _failed(ctx, f"write of {size} bytes exceeds the check-write permit of {permit}")


def _write(ctx: GuestContext, stream: OutputStream, contents: bytes) -> Ok | Err:
    try:
        permit = stream.check_write()
        if len(contents) > permit:
            return _over_permit(ctx, len(contents), permit)
        if contents:
            stream.write(bytes(contents))
        return _OK
    except _STREAM_ERRORS as exc:
        return _stream_error(ctx, exc)


def _write_all(
    ctx: GuestContext,
    stream: OutputStream,
    size: int,
    chunk: Callable[[int], bytes],
    most: int,
) -> None:
    """Write ``size`` bytes made by ``chunk(n)`` (``n <= most``) within the stream's permits,
    waiting for room; every byte is written or the stream's error is raised."""
    done = 0
    while done < size:
        permit = stream.check_write()
        if permit <= 0:
            wait_any(ctx, [StreamPollable(stream)])
            continue
        n = min(permit, size - done, most)
        piece = chunk(n)
        if len(piece) != n:
            raise RuntimeError(f"write chunk of {n} bytes came out {len(piece)} bytes long")
        stream.write(piece)
        done += n
    stream.flush()


def _blocking_write_and_flush(ctx: GuestContext, stream: OutputStream, contents: bytes) -> Ok | Err:
    # The WIT caps this at 4096 bytes; a larger write is accepted and sent in permitted chunks
    # (the bytes are already in host memory, so accepting them costs nothing more).
    data = bytes(contents)
    offset = 0

    def chunk(n: int) -> bytes:
        nonlocal offset
        piece = data[offset : offset + n]
        offset += n
        return piece

    try:
        _write_all(ctx, stream, len(data), chunk, len(data))
        return _OK
    except _STREAM_ERRORS as exc:
        return _stream_error(ctx, exc)


def _flush(ctx: GuestContext, stream: OutputStream) -> Ok | Err:
    try:
        stream.check_write()  # a closed stream reports `closed`, as the WIT asks
        stream.flush()
        return _OK
    except _STREAM_ERRORS as exc:
        return _stream_error(ctx, exc)


def _output_subscribe(ctx: GuestContext, stream: OutputStream) -> Any:
    return ctx.new(POLLABLE, StreamPollable(stream))


def _zeroes(n: int) -> bytes:
    return _ZEROES[:n]


def _write_zeroes(ctx: GuestContext, stream: OutputStream, length: int) -> Ok | Err:
    limit = _policy(ctx).max_read
    if length > limit:
        # The zeroes are made by the host: a permit of gigabytes must not become gigabytes of
        # host work for one call.
        return _failed(ctx, f"write-zeroes of {length} bytes exceeds {limit}")
    try:
        permit = stream.check_write()
        if length > permit:
            return _over_permit(ctx, length, permit)
        done = 0
        while done < length:
            n = min(len(_ZEROES), length - done)
            stream.write(_ZEROES[:n])
            done += n
        return _OK
    except _STREAM_ERRORS as exc:
        return _stream_error(ctx, exc)


def _blocking_write_zeroes_and_flush(
    ctx: GuestContext, stream: OutputStream, length: int
) -> Ok | Err:
    limit = _policy(ctx).max_read
    if length > limit:
        # Writing 2**64-1 zeroes would keep the host busy forever; the WIT caps this call at
        # 4096 bytes, the policy's max_read is a more generous bound.
        return _failed(ctx, f"blocking-write-zeroes-and-flush of {length} bytes exceeds {limit}")
    try:
        _write_all(ctx, stream, length, _zeroes, len(_ZEROES))
        return _OK
    except _STREAM_ERRORS as exc:
        return _stream_error(ctx, exc)


def _splice(ctx: GuestContext, dst: OutputStream, src: InputStream, length: int) -> Ok | Err:
    try:
        permit = dst.check_write()
        data = _read_bounded(ctx, src, min(length, permit))
        if data:
            dst.write(data)
        return Ok(len(data))
    except _STREAM_ERRORS as exc:
        return _stream_error(ctx, exc)


def _blocking_splice(
    ctx: GuestContext, dst: OutputStream, src: InputStream, length: int
) -> Ok | Err:
    try:
        while True:
            permit = dst.check_write()
            if permit <= 0 and length > 0:
                wait_any(ctx, [StreamPollable(dst)])
                continue
            data = _read_bounded(ctx, src, min(length, permit))
            if data or length == 0:
                if data:
                    dst.write(data)
                    dst.flush()
                return Ok(len(data))
            wait_any(ctx, [StreamPollable(src)])
    except _STREAM_ERRORS as exc:
        return _stream_error(ctx, exc)


def bindings() -> list[Binding]:
    """Every function of wasi:io/error, wasi:io/poll and wasi:io/streams 0.2."""
    streams = "wasi:io/streams"
    inp = "[method]input-stream."
    out = "[method]output-stream."
    return [
        Binding("wasi:io/error", "[method]error.to-debug-string", _error_to_debug_string),
        Binding("wasi:io/poll", "[method]pollable.ready", _pollable_ready),
        Binding("wasi:io/poll", "[method]pollable.block", _pollable_block),
        Binding("wasi:io/poll", "poll", _poll),
        Binding(streams, inp + "read", _read),
        Binding(streams, inp + "blocking-read", _blocking_read),
        Binding(streams, inp + "skip", _skip),
        Binding(streams, inp + "blocking-skip", _blocking_skip),
        Binding(streams, inp + "subscribe", _input_subscribe),
        Binding(streams, out + "check-write", _check_write),
        Binding(streams, out + "write", _write),
        Binding(streams, out + "blocking-write-and-flush", _blocking_write_and_flush),
        Binding(streams, out + "flush", _flush),
        Binding(streams, out + "blocking-flush", _flush),
        Binding(streams, out + "subscribe", _output_subscribe),
        Binding(streams, out + "write-zeroes", _write_zeroes),
        Binding(streams, out + "blocking-write-zeroes-and-flush", _blocking_write_zeroes_and_flush),
        Binding(streams, out + "splice", _splice),
        Binding(streams, out + "blocking-splice", _blocking_splice),
    ]
