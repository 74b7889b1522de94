"""Capture buffers for the guest's stdout and stderr.

A guest can print without end; the host keeps the first ``cap`` bytes, counts the rest, and marks
the capture truncated. A sink, when the policy names one, sees every byte as it is written
(for live logs); the cap only limits what is kept in memory.
"""

from __future__ import annotations

from collections.abc import Callable

from mighty.wasi._policy import OutputPolicy
from mighty.wasi._streams import OutputStream

__all__ = ["CaptureOutput"]

_WRITE_PERMIT = 1 << 16
"""What check-write grants: the capture never fills up, this only bounds one write's size."""


class CaptureOutput(OutputStream):
    """An output stream kept in memory up to ``cap`` bytes; everything is counted."""

    def __init__(self, cap: int, sink: Callable[[bytes], None] | None = None) -> None:
        if cap < 0:
            raise ValueError(f"capture cap must be >= 0, got {cap}")
        self.cap = cap
        self.sink = sink
        self.total = 0
        """Bytes written, kept or not."""
        self._kept = 0
        self._chunks: list[bytes] = []

    @classmethod
    def from_policy(cls, policy: OutputPolicy) -> CaptureOutput:
        """A capture following one stream's policy."""
        return cls(policy.cap, policy.sink)

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
        return _WRITE_PERMIT

    # The guest dropping its handle must not lose what it wrote: the host reads the capture after
    # the call, so close() keeps everything (and later get-stdout calls share this object).
    def close(self) -> None:
        """Nothing to release: the capture outlives the guest's handle."""

    @property
    def truncated(self) -> bool:
        """Whether bytes were written beyond ``cap`` (counted in ``total``, not kept)."""
        return self.total > self._kept

    def getvalue(self) -> bytes:
        """The kept bytes (at most ``cap``)."""
        if len(self._chunks) > 1:
            self._chunks = [b"".join(self._chunks)]
        return self._chunks[0] if self._chunks else b""
