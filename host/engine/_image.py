"""Memory images: a component's initial linear memory, shared copy-on-write by all its instances.

A componentize-py component carries the pre-initialised CPython heap as ~13 MB of active data
segments of its one memory-defining core module. With mighty's memory creator (needed for an
exact ceiling and peak, see ``_memory``), wasmtime copies those segments into every new memory:
5-6 ms and 13 MB of private pages per instance, and as long again to unmap them.

Instead, when a component is loaded, :func:`split_images` moves the bytes of those segments into
an image (one per defined memory) and returns a copy of the component whose segments are empty
(same count, same indices, same offsets: ``memory.init``/``data.drop`` and bounds checks see the
same module). The memory creator maps the image ``MAP_PRIVATE`` from a sealed memfd: pages the
guest never writes stay the page cache's, shared by every instance in the process; pages it writes
become private copies. What the guest observes is unchanged: the same bytes at the same addresses
before its first instruction, and the same memory sizes, so the ceiling and the peak stay exact.

The rewrite is deliberately narrow; anything outside it leaves the component as it is (wasmtime
then copies the segments, as before), so a surprise costs speed, never correctness:
- exactly one core module defines memories, it is instantiated exactly once, and no nested
  component or alias brings in other modules: the memory creator then knows which memory each
  image belongs to (it checks the size too, and refuses to guess);
- every active segment of a defined memory has an ``i32.const`` offset and lies inside the
  memory's initial size (an out-of-bounds segment must still trap at instantiation);
- no memory64, shared memories or custom page sizes.

Rejected:
- wasmtime's own copy-on-write images with its default allocator: the C API then gives no way to
  read a store's memory sizes or to turn a refused grow into a trap (the limiter is a fixed number
  and a refused ``memory.grow`` just returns -1), so the exact ceiling and peak would be lost;
- the pooling allocator with ``linear_memory_keep_resident``: the same blindness, and a
  process-wide fixed pool of slots sized for the largest guest;
- mapping the compiled-cache file itself: a ``MAP_PRIVATE`` mapping of a file that someone else
  modifies may show the change in pages not yet copied; a sealed memfd cannot change.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import time
import weakref
from dataclasses import dataclass, field

__all__ = ["MemoryImage", "split_images"]

_log = logging.getLogger(__name__)

_PAGE = 65536
_HOST_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class _Unsupported(Exception):
    """The component is outside what the rewrite handles: keep it as it is."""


@dataclass(frozen=True, eq=False)
class MemoryImage:
    """The initial contents of one defined linear memory, in a sealed memfd.

    ``minimum`` and ``maximum`` are the memory's limits in bytes (``maximum`` None when the
    module gives none); ``length`` is how many bytes the image covers from address 0 (a multiple
    of the host page size, at most ``minimum``); past it the memory starts zeroed.
    """

    fd: int
    length: int
    minimum: int
    maximum: int | None
    data_bytes: int
    """Bytes of segment data moved into the image (what wasmtime no longer copies)."""
    hot: list[tuple[int, int]] = field(default_factory=list, compare=False, repr=False)
    """Byte ranges ``(offset, length)`` that instances are known to write (learned once, from
    a warmed instance, by :func:`mighty.engine.learn_hot_pages`): an instance made with
    ``prefault`` gets its private copies of them in one call instead of one fault per page."""


def split_images(data: bytes) -> tuple[bytes, tuple[MemoryImage, ...]] | None:
    """``(component bytes with the moved segments emptied, their images)``, or None when the
    component is outside what the rewrite handles (or the platform has no sealed memfd)."""
    if not hasattr(os, "memfd_create") or not hasattr(fcntl, "F_ADD_SEALS"):
        return None
    try:
        plan = _plan(memoryview(data))
    except (_Unsupported, IndexError, ValueError):
        return None
    if plan is None:
        return None
    start, end, module, memories = plan
    try:
        rewritten, contents, moved = _rewrite_module(module, memories)
    except (_Unsupported, IndexError, ValueError):
        return None
    if not moved:
        return None
    try:
        images = tuple(_seal(content, mem) for content, mem in zip(contents, memories, strict=True))
    except OSError as exc:
        # No memfd to be had (refused seals, out of descriptors or memory): the image is only
        # a saving, so wasmtime copies the segments as it would without one (the images made
        # so far close their files when dropped).
        _log.warning("memory image not made (%s); the data segments will be copied", exc)
        return None
    # ``start`` is the module section's id byte: replace id, size and payload.
    out = b"".join((data[:start], b"\x01", _uleb(len(rewritten)), rewritten, data[end:]))
    return out, images


# -- reading ------------------------------------------------------------------------------------


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: memoryview, pos: int = 0) -> None:
        self.data = data
        self.pos = pos

    def byte(self) -> int:
        value = self.data[self.pos]
        self.pos += 1
        return value

    def uleb(self) -> int:
        result = shift = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7
            if shift > 63:
                raise _Unsupported("LEB128 too long")

    def sleb32(self) -> int:
        result = shift = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                if b & 0x40 and shift < 64:
                    result -= 1 << shift
                break
            if shift > 35:
                raise _Unsupported("LEB128 too long")
        if not -(1 << 31) <= result < (1 << 32):
            raise _Unsupported("i32 constant out of range")
        return result & 0xFFFFFFFF

    def sleb(self) -> None:
        """Skip a signed LEB128 of any width up to 64 bits."""
        for _ in range(10):
            if not self.byte() & 0x80:
                return
        raise _Unsupported("LEB128 too long")

    def skip(self, n: int) -> None:
        if self.pos + n > len(self.data):
            raise _Unsupported("truncated")
        self.pos += n

    def name(self) -> None:
        self.skip(self.uleb())

    def since(self, start: int) -> bytes:
        """The bytes read from ``start`` to here."""
        return bytes(self.data[start : self.pos])


@dataclass(eq=False)
class _Memory:
    index: int
    minimum: int
    maximum: int | None


def _sections(data: memoryview, pos: int) -> list[tuple[int, int, int, int]]:
    """(id, start of the id byte, payload start, payload end) of every section from ``pos``."""
    out = []
    reader = _Reader(data, pos)
    while reader.pos < len(data):
        start = reader.pos
        section = reader.byte()
        size = reader.uleb()
        body = reader.pos
        reader.skip(size)
        out.append((section, start, body, body + size))
    return out


def _module_memories(module: memoryview) -> list[_Memory]:
    """The memories a core module defines (not imports), with their index and limits."""
    if bytes(module[:8]) != b"\x00asm\x01\x00\x00\x00":
        raise _Unsupported("not a core module")
    imported = 0
    defined: list[tuple[int, int | None]] = []
    for section, _start, body, _end in _sections(module, 8):
        if section == 2:
            reader = _Reader(module, body)
            for _ in range(reader.uleb()):
                reader.name()
                reader.name()
                kind = reader.byte()
                if kind in {0x00, 0x04}:  # func or tag: a type index (tag: attr first)
                    if kind == 0x04:
                        reader.byte()
                    reader.uleb()
                elif kind == 0x01:  # table: reftype + limits
                    if reader.byte() not in (0x70, 0x6F):
                        raise _Unsupported("table of an unknown reference type")
                    _limits(reader)
                elif kind == 0x02:
                    _limits(reader)
                    imported += 1
                elif kind == 0x03:
                    if reader.byte() not in (0x7F, 0x7E, 0x7D, 0x7C, 0x7B, 0x70, 0x6F):
                        raise _Unsupported("global of an unknown type")
                    reader.byte()
                else:
                    raise _Unsupported(f"import kind {kind:#x}")
        elif section == 5:
            reader = _Reader(module, body)
            defined.extend(_limits(reader) for _ in range(reader.uleb()))
    return [
        _Memory(imported + i, minimum * _PAGE, None if maximum is None else maximum * _PAGE)
        for i, (minimum, maximum) in enumerate(defined)
    ]


def _limits(reader: _Reader) -> tuple[int, int | None]:
    flags = reader.byte()
    if flags not in (0x00, 0x01):  # shared, memory64 and custom page sizes are not handled
        raise _Unsupported(f"limits flags {flags:#x}")
    minimum = reader.uleb()
    maximum = reader.uleb() if flags == 0x01 else None
    return minimum, maximum


def _plan(data: memoryview) -> tuple[int, int, memoryview, list[_Memory]] | None:
    """Find the one memory-defining module: (its section's start, end, bytes, memories)."""
    if bytes(data[:4]) != b"\x00asm" or bytes(data[6:8]) != b"\x01\x00":
        raise _Unsupported("not a component")
    modules: list[tuple[int, int, memoryview]] = []
    instantiations: dict[int, int] = {}
    for section, start, body, end in _sections(data, 8):
        if section == 1:
            modules.append((start, end, data[body:end]))
        elif section == 4:
            if _contains_modules(data[body:end]):
                raise _Unsupported("a nested component has core modules")
        elif section == 2:
            reader = _Reader(data, body)
            for _ in range(reader.uleb()):
                tag = reader.byte()
                if tag == 0x00:
                    index = reader.uleb()
                    instantiations[index] = instantiations.get(index, 0) + 1
                    for _ in range(reader.uleb()):
                        reader.name()
                        reader.byte()
                        reader.uleb()
                elif tag == 0x01:
                    for _ in range(reader.uleb()):
                        reader.name()
                        reader.byte()
                        reader.uleb()
                else:
                    raise _Unsupported(f"core instance tag {tag:#x}")
        elif section == 6:
            reader = _Reader(data, body)
            for _ in range(reader.uleb()):
                sort = reader.byte()
                if sort == 0x00 and reader.byte() == 0x11:
                    raise _Unsupported("a core module comes in through an alias")
                target = reader.byte()
                if target in {0x00, 0x01}:
                    reader.uleb()
                    reader.name()
                elif target == 0x02:
                    reader.uleb()
                    reader.uleb()
                else:
                    raise _Unsupported(f"alias target {target:#x}")
    with_memories = [
        (i, start, end, module)
        for i, (start, end, module) in enumerate(modules)
        if _module_memories(module)
    ]
    if len(with_memories) != 1:
        return None
    index, start, end, module = with_memories[0]
    if instantiations.get(index, 0) != 1:
        return None
    return start, end, module, _module_memories(module)


def _contains_modules(component: memoryview) -> bool:
    for section, _start, body, end in _sections(component, 8):
        if section == 1 or (section == 4 and _contains_modules(component[body:end])):
            return True
    return False


# -- rewriting ----------------------------------------------------------------------------------


def _uleb(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _rewrite_module(
    module: memoryview, memories: list[_Memory]
) -> tuple[bytes, list[bytearray], int]:
    """The module with the defined memories' active segments emptied, and those memories'
    initial contents (each as long as its highest segment end)."""
    by_index = {mem.index: mem for mem in memories}
    segments: list[tuple[int, int, int, int]] = []  # (memory index, offset, data start, size)
    pieces: list[bytes] = [bytes(module[:8])]
    ends = dict.fromkeys(by_index, 0)
    for section, start, body, end in _sections(module, 8):
        if section != 11:
            pieces.append(bytes(module[start:end]))
            continue
        reader = _Reader(module, body)
        count = reader.uleb()
        out = bytearray(_uleb(count))
        for _ in range(count):
            seg_start = reader.pos
            flags = reader.uleb()
            if flags == 0x01:  # passive: kept as it is
                reader.skip(reader.uleb())
                out += module[seg_start : reader.pos]
                continue
            if flags not in (0x00, 0x02):
                raise _Unsupported(f"data segment flags {flags:#x}")
            memory = reader.uleb() if flags == 0x02 else 0
            expr_start = reader.pos
            if reader.byte() != 0x41:  # i32.const
                raise _Unsupported("a data segment offset that is not i32.const")
            offset = reader.sleb32()
            if reader.byte() != 0x0B:
                raise _Unsupported("a data segment offset expression longer than one const")
            expr = module[expr_start : reader.pos]
            size = reader.uleb()
            data_start = reader.pos
            reader.skip(size)
            target = by_index.get(memory)
            if target is None:  # an imported memory: its owner's image cannot know about it
                out += module[seg_start : reader.pos]
                continue
            if offset + size > target.minimum:
                raise _Unsupported("a data segment past its memory's initial size")
            segments.append((memory, offset, data_start, size))
            ends[memory] = max(ends[memory], offset + size)
            out += module[seg_start:expr_start]
            out += expr
            out += b"\x00"  # no bytes: wasmtime has nothing to copy
        if reader.pos != end:
            raise _Unsupported("data section length mismatch")
        pieces.append(bytes([11]) + _uleb(len(out)) + bytes(out))
    contents = {index: bytearray(ends[index]) for index in by_index}
    # In order: a later segment overwrites an earlier one where they overlap, as at
    # instantiation.
    for memory, offset, data_start, size in segments:
        contents[memory][offset : offset + size] = module[data_start : data_start + size]
    moved = sum(size for _memory, _offset, _start, size in segments)
    return b"".join(pieces), [contents[mem.index] for mem in memories], moved


_SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
_SEAL_TRIES = 4


def _seal(content: bytearray, memory: _Memory) -> MemoryImage:
    data_bytes = len(content)  # up to the last segment's end, zeros between segments included
    length = -(-len(content) // _HOST_PAGE) * _HOST_PAGE
    length = min(length, memory.minimum)
    # F_SEAL_WRITE refuses (EBUSY) while a page of the file holds a reference beyond its
    # mapping, and a page just written may still sit in the per-CPU LRU batch of the CPU the
    # write ran on: the kernel drains only the sealing thread's own CPU's batch before it
    # checks. Seen here once, on a loaded 2-CPU machine, when the thread moved between the
    # write and the seal. So the thread writes and seals on one CPU, and tries again on a
    # fresh file if the seal is still refused.
    allowed = _pin_to_one_cpu()
    try:
        for attempt in range(_SEAL_TRIES):
            fd = os.memfd_create("mighty-image", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            try:
                os.ftruncate(fd, length)
                view = memoryview(content)
                written = 0
                while written < len(view):
                    written += os.pwrite(fd, view[written:], written)
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
                break
            except OSError as exc:
                os.close(fd)
                if exc.errno != errno.EBUSY or attempt == _SEAL_TRIES - 1:
                    raise
                time.sleep(0.001 * 2**attempt)
            except BaseException:
                os.close(fd)
                raise
    finally:
        if allowed is not None:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, allowed)
    image = MemoryImage(fd, length, memory.minimum, memory.maximum, data_bytes)
    weakref.finalize(image, _close, fd)
    return image


def _pin_to_one_cpu() -> set[int] | None:
    """Keep the calling thread on one of its CPUs; the CPUs it had (None: nothing changed)."""
    try:
        allowed = os.sched_getaffinity(0)
        if len(allowed) <= 1:
            return None
        os.sched_setaffinity(0, {min(allowed)})
    except OSError:  # not allowed here (a sandbox, a container's policy): write unpinned
        return None
    return allowed


def _close(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)
