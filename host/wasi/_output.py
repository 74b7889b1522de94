"""Capture buffers for the guest's stdout and stderr.

A guest can print without end; the host keeps the first ``cap`` bytes, counts the rest, and marks
the capture truncated. A sink, when the policy names one, sees every byte as it is written
(for live logs, and the sandbox's output limit); the cap only limits what is kept in memory.

Why ``check-write`` grants :data:`WRITE_PERMIT` (2 GiB - 1) and not a few KiB: the guests we run
are CPython under componentize-py, whose stdio is unbuffered, so ``sys.stdout`` is a
``TextIOWrapper`` straight over a raw ``FileIO``. wasi-libc's ``write()`` asks ``check-write``,
writes ``min(permit, n)`` bytes and returns that count, as POSIX allows; but CPython's text layer
(``_textiowrapper_writeflush``) ignores the count a raw stream returns, so everything past the
permit of one ``print`` was lost without an error. The host cannot make the guest loop, so it
must take every write whole: the permit is larger than any write a guest under our memory
budgets can make. The bytes of a write are already copied out of guest memory when the host
sees them, so a large permit costs the host nothing the guest's memory ceiling does not already
bound; what is kept stays bounded by ``cap``.

Writes past what wasmtime can hand the host in one call: wasmtime charges 48 bytes of "hostcall
fuel" per ``list<u8>`` element it lifts, out of 128 MiB per call (a store setting wasmtime-py does
not expose), so one write of more than :data:`LIFT_LIMIT` bytes traps in wasmtime before the host
sees it ("too much data is being copied between the host and the guest"). The permit stays above
that on purpose: a guest that writes more in one go fails loudly instead of losing the tail, which
is what a smaller permit would do to CPython.

A sink that ends the run past a limit (the sandbox's output limit) is a :class:`LimitedSink`: the
capture then grants at most ``room() + 1``, so a write that passes the limit always reaches the
sink with at least one byte too many, and the run ends with the limit's error instead of a tail
cut by the guest or a lifting trap.

Rejected: a permit of ``2**64 - 1``. Guests cast it to ``usize`` (the Rust wasi adapter does
``permit as usize``), and on wasm32 anything from ``2**32`` up truncates, to 0 at ``2**32``, which
reads as "no room" forever. 2 GiB - 1 survives a cast to ``u32`` and to ``i32``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from mighty._errors import BadInput
from mighty.wasi._streams import OutputStream

__all__ = ["LIFT_LIMIT", "WRITE_PERMIT", "CaptureOutput", "LimitedSink"]

WRITE_PERMIT = (1 << 31) - 1
"""What check-write grants a capture: the capture never fills up (see the module note)."""
LIFT_LIMIT = (128 << 20) // 48
"""The longest ``list<u8>`` wasmtime (49, default hostcall fuel) lifts into one host call."""


@runtime_checkable
class LimitedSink(Protocol):
    """A sink that stops the run once more than some number of bytes reached it."""

    def __call__(self, chunk: bytes, /) -> None: ...

    def room(self) -> int:
        """Bytes it still takes before the next one stops the run (0 when at the limit)."""
        ...


class CaptureOutput(OutputStream):
    """An output stream kept in memory up to ``cap`` bytes; everything is counted.

    ``permit`` is what ``check-write`` grants; only tests make it smaller, to drive the
    chunking of ``blocking-write-and-flush``.
    """

    def __init__(
        self,
        cap: int,
        sink: Callable[[bytes], None] | None = None,
        *,
        permit: int = WRITE_PERMIT,
    ) -> None:
        if cap < 0:
            raise BadInput(f"capture cap must be >= 0, got {cap}")
        if permit <= 0:
            raise BadInput(f"write permit must be positive, got {permit}")
        self.cap = cap
        self.sink = sink
        # Asked once here, not at every check-write: isinstance against a runtime-checkable
        # Protocol walks its members each time (a third of the print path's cost).
        self._room = sink.room if isinstance(sink, LimitedSink) else None
        self.permit = permit
        self.total = 0
        """Bytes written, kept or not."""
        self._kept = 0
        self._chunks: list[bytes] = []

    def write(self, data: bytes) -> None:
        data = bytes(data)
        self.total += len(data)
        room = self.cap - self._kept
        if room > 0 and data:
            piece = data[:room]
            self._chunks.append(piece)
            self._kept += len(piece)
        if self.sink is not None and data:
            self.sink(data)

    def check_write(self) -> int:
        if self._room is not None:
            room = self._room()
            # One byte past the room: the write that passes the limit reaches the sink whole
            # enough to trip it, and nothing under the limit is ever cut short.
            return min(self.permit, max(0, int(room)) + 1)
        return self.permit

    # The guest dropping its handle must not lose what it wrote: the host reads the capture after
    # the call, so close() keeps everything (and later get-stdout calls share this object).
    def close(self) -> None:
        """Nothing to release: the capture outlives the guest's handle."""

    def clear(self) -> None:
        """Forget what was written (kept and counted): for an instance rewound to serve anew."""
        self.total = 0
        self._kept = 0
        self._chunks = []

    @property
    def kept(self) -> int:
        """Bytes kept in memory (at most ``cap``)."""
        return self._kept

    @property
    def truncated(self) -> bool:
        """Whether bytes were written beyond ``cap`` (counted in ``total``, not kept)."""
        return self.total > self._kept

    def getvalue(self) -> bytes:
        """The kept bytes (at most ``cap``)."""
        if len(self._chunks) > 1:
            self._chunks = [b"".join(self._chunks)]
        return self._chunks[0] if self._chunks else b""
