"""Frozen memory states: one linear memory's contents at a moment, for snapshots and forks.

A :class:`MemoryState` is the component's memory image (:mod:`mighty.engine._image`) where the
memory still holds the image's bytes, plus the pages that differ, copied once into a sealed
memfd. A new memory made from a state (``instantiating_into(..., states=...)``) maps the image
and those pages ``MAP_PRIVATE``: nothing is copied, every memory made from one state shares its
pages until it writes them, and no memory can change the state (the memfd is sealed).

Which pages differ is read from ``/proc/self/pagemap`` (private pages of the image mapping,
present pages past it, and the pages a memory made from a state started with); when that is not
readable every page is copied, which is slower and just as correct. Pages between two changed
ranges are copied too when the gap is small, so that a state maps in few ``mmap`` calls.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from mighty._errors import BadInput
from mighty.engine._image import MemoryImage

__all__ = ["MAX_GAP", "MemoryState", "state_from_pages"]

_HOST_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_WASM_PAGE = 65536
MAX_GAP = 8 * _HOST_PAGE
"""By default, copy clean pages between two changed ranges when the gap is at most this: a
state then maps in fewer ``mmap`` calls (each ~4 us; ~65 instead of ~180 for a small
session), for ~2x the bytes copied once."""


@dataclass(frozen=True, eq=False)
class MemoryState:
    """One linear memory's contents, frozen: ``size`` bytes, equal to ``image`` (zeros past it,
    or everywhere when ``image`` is None) except for ``ranges``, whose bytes are in ``fd``.

    ``ranges`` are ``(memory offset, length, offset in fd)``, page-aligned, sorted and disjoint.
    """

    size: int
    image: MemoryImage | None
    fd: int
    ranges: tuple[tuple[int, int, int], ...]

    @property
    def changed_bytes(self) -> int:
        """Bytes held in the state's own memfd (the rest is the image's or zeros)."""
        return sum(length for _offset, length, _at in self.ranges)

    def pages(self) -> Iterator[tuple[int, bytes]]:
        """``(memory offset, bytes)`` of each changed range, read from the memfd."""
        for offset, length, at in self.ranges:
            yield offset, _pread_all(self.fd, length, at)


def check_ranges(size: int, ranges: Sequence[tuple[int, int]]) -> None:
    """Raise ValueError unless ``ranges`` are page-aligned, sorted, disjoint and inside ``size``."""
    if size < 0 or size % _WASM_PAGE:
        raise BadInput(f"a memory size must be a whole number of wasm pages, got {size}")
    end = 0
    for offset, length in ranges:
        if offset % _HOST_PAGE or length % _HOST_PAGE or length <= 0:
            raise BadInput("memory ranges must be whole, non-empty host pages")
        if offset < end:
            raise BadInput("memory ranges must be sorted and must not overlap")
        end = offset + length
        if end > size:
            raise BadInput(f"a memory range ends at {end}, past the memory's {size} bytes")


def freeze(
    address: int,
    size: int,
    image: MemoryImage | None,
    ranges: Sequence[tuple[int, int]],
    *,
    gap: int = MAX_GAP,
) -> MemoryState:
    """Copy ``ranges`` of the live memory at ``address`` into a sealed memfd (the caller makes
    sure the memory does not change meanwhile: no call is running in its store). Ranges at
    most ``gap`` bytes apart are copied as one, gap included (fewer mappings, more bytes)."""
    merged = _merge(ranges, gap)
    check_ranges(size, merged)
    fd = _memfd(sum(length for _offset, length in merged))
    placed: list[tuple[int, int, int]] = []
    try:
        at = 0
        for offset, length in merged:
            view = memoryview((ctypes.c_char * length).from_address(address + offset)).cast("B")
            _pwrite_all(fd, view, at)
            placed.append((offset, length, at))
            at += length
        _seal(fd)
    except BaseException:
        os.close(fd)
        raise
    return _state(size, image, fd, tuple(placed))


def state_from_pages(
    size: int,
    image: MemoryImage | None,
    ranges: Sequence[tuple[int, int]],
    data: bytes | bytearray | memoryview,
) -> MemoryState:
    """A state from its changed pages: ``data`` is the ranges' bytes one after another."""
    check_ranges(size, ranges)
    if image is not None and image.minimum > size:
        raise BadInput(f"the memory must be at least {image.minimum} bytes, got {size}")
    total = sum(length for _offset, length in ranges)
    if len(data) != total:
        raise BadInput(f"{len(data)} bytes of page data for ranges of {total} bytes")
    fd = _memfd(total)
    placed: list[tuple[int, int, int]] = []
    try:
        view = memoryview(data).cast("B")
        _pwrite_all(fd, view, 0)
        at = 0
        for offset, length in ranges:
            placed.append((offset, length, at))
            at += length
        _seal(fd)
    except BaseException:
        os.close(fd)
        raise
    return _state(size, image, fd, tuple(placed))


def _state(
    size: int, image: MemoryImage | None, fd: int, ranges: tuple[tuple[int, int, int], ...]
) -> MemoryState:
    state = MemoryState(size, image, fd, ranges)
    weakref.finalize(state, _close, fd)
    return state


def _merge(ranges: Sequence[tuple[int, int]], gap: int) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for offset, length in sorted(ranges):
        if out and offset - (out[-1][0] + out[-1][1]) <= gap:
            start = out[-1][0]
            out[-1] = (start, max(out[-1][0] + out[-1][1], offset + length) - start)
        else:
            out.append((offset, length))
    return out


def _memfd(length: int) -> int:
    fd = os.memfd_create("mighty-state", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, length)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _seal(fd: int) -> None:
    fcntl.fcntl(
        fd,
        fcntl.F_ADD_SEALS,
        fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE,
    )


def _pwrite_all(fd: int, view: memoryview, at: int) -> None:
    written = 0
    while written < len(view):
        written += os.pwrite(fd, view[written:], at + written)


def _pread_all(fd: int, length: int, at: int) -> bytes:
    parts: list[bytes] = []
    done = 0
    while done < length:
        chunk = os.pread(fd, length - done, at + done)
        if not chunk:
            raise OSError(f"memory state memfd ended at {at + done}")
        parts.append(chunk)
        done += len(chunk)
    return b"".join(parts)


def _close(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)
