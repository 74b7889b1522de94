"""Frozen memory states: one linear memory's contents at a moment, for snapshots and forks.

A :class:`MemoryState` is the component's memory image (:mod:`mighty.engine._image`) where the
memory still holds the image's bytes, plus the pages that differ, copied once into a sealed
memfd. A new memory made from a state (``instantiating_into(..., states=...)``) maps the image
and those pages ``MAP_PRIVATE``: nothing is copied, every memory made from one state shares its
pages until it writes them, and no memory can change the state (the memfd is sealed).

A state may be a *layer* over an earlier state of the same memory (``base``): its memfd then
holds only the pages that changed since that state was frozen, and the rest comes from the
base (``mapping`` is the flattened result: each range with the memfd that holds it). A session
forked after each of its runs copies what each run changed (~0.6 MB for a small run) instead
of everything that differs from the image again (~3.5 MB). A chain is bounded
(``MAX_DEPTH`` layers, and the bytes its memfds hold at most twice what the top state maps
plus ``MAX_SUPERSEDED``): past that the next state is frozen whole, so a long-lived session
does not keep every run's pages. Rejected: tracking the pages written since the last freeze
with the kernel's soft-dirty bits (clearing them is process-wide, see ``_memory``); tracking
them with userfaultfd's asynchronous write protection read by ``PAGEMAP_SCAN`` (Linux 6.7;
built and measured, commit 603461f: a fork after a run compares the ~240 pages the run wrote
instead of the ~700 the session ever wrote, 1 ms faster, but the session's next run takes a
write-protect fault on its first write to each of them, 0.6 ms slower: interleaved, run plus
fork 5.1-5.8 ms against 5.6-5.9 untracked, not worth a kernel-dependent path); and remapping
the session's memory onto each state it freezes (its next run would take a copy-on-write fault
for every page it writes: the copy moves onto the run, it does not go).

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
from dataclasses import dataclass, field

from mighty._errors import BadInput
from mighty.engine._image import MemoryImage

__all__ = [
    "MAX_DEPTH",
    "MAX_GAP",
    "MAX_MAPPINGS",
    "MAX_SUPERSEDED",
    "MemoryState",
    "layerable",
    "state_from_pages",
]

_HOST_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_WASM_PAGE = 65536
MAX_GAP = 8 * _HOST_PAGE
"""By default, copy clean pages between two changed ranges when the gap is at most this: a
state then maps in fewer ``mmap`` calls (each ~4 us; ~65 instead of ~180 for a small
session), for ~2x the bytes copied once."""
MAX_DEPTH = 16
"""The most layers a state may stand on (see the module docstring); the next is frozen whole."""
MAX_MAPPINGS = 512
"""The most ranges a layered state may map; past that the next is frozen whole."""
MAX_SUPERSEDED = 16 << 20
"""Bytes a chain's memfds may hold beyond twice what its top state maps."""


@dataclass(frozen=True, eq=False)
class MemoryState:
    """One linear memory's contents, frozen: ``size`` bytes, equal to ``image`` (zeros past it,
    or everywhere when ``image`` is None) except for ``ranges``, whose bytes are in ``fd``.

    ``ranges`` are ``(memory offset, length, offset in fd)``, page-aligned, sorted and disjoint.
    With ``base`` (a layer), the state equals ``base`` outside ``ranges``; ``mapping`` is then
    every range that is not the image's or zeros, as ``(memory offset, length, fd, offset in
    fd)``, sorted and disjoint, whichever memfd of the chain holds it.
    """

    size: int
    image: MemoryImage | None
    fd: int
    ranges: tuple[tuple[int, int, int], ...]
    base: MemoryState | None = None
    mapping: tuple[tuple[int, int, int, int], ...] = field(init=False)
    depth: int = field(init=False)
    """How many layers it stands on (0: frozen whole)."""
    held: int = field(init=False)
    """Bytes the memfds of its chain hold (its own and its bases')."""

    def __post_init__(self) -> None:
        own = tuple((offset, length, self.fd, at) for offset, length, at in self.ranges)
        own_bytes = sum(length for _offset, length, _at in self.ranges)
        base = self.base
        if base is None:
            mapping, depth, held = own, 0, own_bytes
        else:
            mapping = _overlay(base.mapping, own)
            depth, held = base.depth + 1, base.held + own_bytes
        object.__setattr__(self, "mapping", mapping)
        object.__setattr__(self, "depth", depth)
        object.__setattr__(self, "held", held)

    @property
    def changed_bytes(self) -> int:
        """Bytes that are not the image's or zeros (held in the memfds of its chain)."""
        return sum(length for _offset, length, _fd, _at in self.mapping)

    def pages(self) -> Iterator[tuple[int, bytes]]:
        """``(memory offset, bytes)`` of each range of ``mapping``, read from its memfd."""
        for offset, length, fd, at in self.mapping:
            yield offset, _pread_all(fd, length, at)


def layerable(state: MemoryState) -> bool:
    """Whether a new state may be a layer over ``state`` (else it is frozen whole)."""
    return (
        state.depth < MAX_DEPTH
        and len(state.mapping) < MAX_MAPPINGS
        and state.held <= 2 * state.changed_bytes + MAX_SUPERSEDED
    )


def _overlay(
    below: Sequence[tuple[int, int, int, int]], above: Sequence[tuple[int, int, int, int]]
) -> tuple[tuple[int, int, int, int], ...]:
    """``below``'s ranges with ``above``'s over them (both sorted and disjoint): what is left
    of each lower range outside the upper ones, and the upper ones, sorted."""
    out: list[tuple[int, int, int, int]] = []
    upper = 0
    for offset, length, fd, at in below:
        start, end = offset, offset + length
        # Upper ranges that end before this piece cannot cut it (nor any later piece).
        while upper < len(above) and above[upper][0] + above[upper][1] <= start:
            upper += 1
        index = upper
        while start < end and index < len(above) and above[index][0] < end:
            cut, cut_end = above[index][0], above[index][0] + above[index][1]
            if cut > start:
                out.append((start, cut - start, fd, at + (start - offset)))
            start = max(start, cut_end)
            index += 1
        if start < end:
            out.append((start, end - start, fd, at + (start - offset)))
    out.extend(above)
    out.sort()
    return tuple(out)


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
    base: MemoryState | None = None,
) -> MemoryState:
    """Copy ``ranges`` of the live memory at ``address`` into a sealed memfd (the caller makes
    sure the memory does not change meanwhile: no call is running in its store). Ranges at
    most ``gap`` bytes apart are copied as one, gap included (fewer mappings, more bytes).
    With ``base``, the state is a layer over it: ``ranges`` must then cover every page where
    the memory differs from ``base`` (the caller's to find, see ``_memory.capture_memory``)."""
    merged = _merge(ranges, gap)
    check_ranges(size, merged)
    fd = _memfd(sum(length for _offset, length in merged))
    placed: list[tuple[int, int, int]] = []
    try:
        at = 0
        views: list[memoryview] = []
        # One view of the memory, sliced per range (a ctypes array type per range cost ~7 us
        # each: ~0.6 ms of a fork's freeze).
        whole = memoryview((ctypes.c_char * size).from_address(address)).cast("B")
        for offset, length in merged:
            views.append(whole[offset : offset + length])
            placed.append((offset, length, at))
            at += length
        _pwritev_all(fd, views)
        _seal(fd)
    except BaseException:
        os.close(fd)
        raise
    return _state(size, image, fd, tuple(placed), base)


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
    size: int,
    image: MemoryImage | None,
    fd: int,
    ranges: tuple[tuple[int, int, int], ...],
    base: MemoryState | None = None,
) -> MemoryState:
    if base is not None and (base.size != size or base.image is not image):
        os.close(fd)
        raise BadInput("a layer must have its base's size and image")
    state = MemoryState(size, image, fd, ranges, base)
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


def _pwritev_all(fd: int, views: list[memoryview]) -> None:
    """``views`` one after another from offset 0, in as few ``pwritev`` calls as the kernel
    takes (one per ``_IOV_MAX`` ranges; ~90 ``pwrite`` calls a fork before)."""
    at = 0
    for start in range(0, len(views), _IOV_MAX):
        chunk = views[start : start + _IOV_MAX]
        total = sum(len(view) for view in chunk)
        written = os.pwritev(fd, chunk, at)
        if written < total:  # a short write: the rest one view at a time
            done = 0
            for view in chunk:
                if done + len(view) > written:
                    skip = max(0, written - done)
                    _pwrite_all(fd, view[skip:], at + done + skip)
                done += len(view)
        at += total


_IOV_MAX = 1024


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
