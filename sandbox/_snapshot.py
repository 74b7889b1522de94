"""The session snapshot format: a session's interpreter state as bytes, checked before use.

What a snapshot holds, and why that is the interpreter's whole state, is in docs/sandbox.md
("Snapshots and forks"): the linear memory (only the pages that differ from the interpreter's
memory image, zlib-compressed), its size, and what must match for the memory to be valid in a
new instance: the interpreter build (component SHA-256), the tools the session was given, and
the host resources the guest holds (its stdout and stderr streams).

Layout (integers little-endian)::

    magic "MTYSNAP\\0" | version u16 | flags u16 (0) | component sha256 (32) | tools sha256 (32)
    | memory size u64 | image length u64 | holdings u32, each (name length u16, name, rep u32)
    | ranges u32, each (offset u64, length u64) | payload length u64 | zlib payload
    | sha256 of everything before (32)

Everything is validated before anything is built from it: the total size against a bound
given by the restoring sandbox's memory limit, the checksum, the version, the stamps, every
count and range, and the payload is inflated with a bounded output (no zlib bomb), to exactly
the ranges' length. A bad snapshot is a :class:`SnapshotError` (one line), never a traceback.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

from mighty._errors import BadInput

__all__ = [
    "FORMAT_VERSION",
    "SnapshotCorrupt",
    "SnapshotError",
    "SnapshotMismatch",
    "SnapshotTooLarge",
    "decode_snapshot",
    "encode_snapshot",
    "max_snapshot_bytes",
]

MAGIC = b"MTYSNAP\x00"
FORMAT_VERSION = 1
_HEAD = struct.Struct("<8sHH32s32sQQ")
_PAGE = 4096
_WASM_PAGE = 65536
_MAX_HOLDINGS = 64
_MAX_NAME = 256
_DIGEST = 32


class SnapshotError(BadInput):
    """A session snapshot cannot be taken or restored; the message says why."""


class SnapshotCorrupt(SnapshotError):
    """The bytes are not an intact snapshot: truncated, altered, or not a snapshot at all."""


class SnapshotMismatch(SnapshotError):
    """The snapshot is intact but belongs elsewhere: another format version, interpreter build,
    tool set, or host resources."""


class SnapshotTooLarge(SnapshotError):
    """The snapshot (or the memory it holds) is over what the restoring sandbox allows."""


@dataclass(frozen=True)
class Snapshot:
    """A decoded snapshot: the memory's size, its changed ranges and their bytes, and the
    stamps that must match."""

    component: str
    tools: str
    memory_size: int
    image_length: int
    holdings: frozenset[tuple[str, int]]
    ranges: tuple[tuple[int, int], ...]
    data: bytes


def max_snapshot_bytes(memory_limit: int) -> int:
    """The largest snapshot a sandbox with this memory limit accepts: its memory, allowing for
    zlib's worst case on incompressible pages, plus the header."""
    return memory_limit + memory_limit // 256 + (1 << 20)


def encode_snapshot(
    *,
    component: str,
    tools: str,
    memory_size: int,
    image_length: int,
    holdings: Iterable[tuple[str, int]],
    pages: Iterable[tuple[int, bytes]],
) -> bytes:
    """The snapshot bytes (see the module docstring for the layout)."""
    held = sorted(holdings)
    out = bytearray(
        _HEAD.pack(
            MAGIC,
            FORMAT_VERSION,
            0,
            bytes.fromhex(component),
            bytes.fromhex(tools),
            memory_size,
            image_length,
        )
    )
    out += struct.pack("<I", len(held))
    for name, rep in held:
        raw = name.encode()
        out += struct.pack("<H", len(raw)) + raw + struct.pack("<I", rep)
    squeeze = zlib.compressobj(1)
    chunks: list[bytes] = []
    ranges: list[tuple[int, int]] = []
    for offset, data in pages:
        ranges.append((offset, len(data)))
        chunks.append(squeeze.compress(data))
    chunks.append(squeeze.flush())
    out += struct.pack("<I", len(ranges))
    for offset, length in ranges:
        out += struct.pack("<QQ", offset, length)
    payload = b"".join(chunks)
    out += struct.pack("<Q", len(payload))
    out += payload
    out += hashlib.sha256(out).digest()
    return bytes(out)


def decode_snapshot(
    data: bytes | bytearray | memoryview, *, component: str, tools: str, memory_limit: int
) -> Snapshot:
    """Check ``data`` and decode it; :class:`SnapshotError` (a subclass) if anything is off."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise SnapshotCorrupt(f"a snapshot is bytes, got {type(data).__name__}")
    try:
        # A strided or multi-dimensional view cannot be read as bytes in place (cast refuses
        # it): that is a bad snapshot like any other, not a TypeError from inside.
        view = memoryview(data).cast("B")
    except (TypeError, ValueError) as exc:
        raise SnapshotCorrupt(f"a snapshot is a contiguous buffer of bytes: {exc}") from None
    bound = max_snapshot_bytes(memory_limit)
    if len(view) > bound:
        raise SnapshotTooLarge(
            f"the snapshot is {len(view)} bytes; a sandbox with a {memory_limit}-byte memory "
            f"limit accepts at most {bound}"
        )
    if len(view) < len(MAGIC) or bytes(view[: len(MAGIC)]) != MAGIC:
        raise SnapshotCorrupt("not a mighty session snapshot (bad magic)")
    if len(view) < _HEAD.size + _DIGEST:
        raise SnapshotCorrupt(f"the snapshot is truncated ({len(view)} bytes)")
    body, digest = view[:-_DIGEST], bytes(view[-_DIGEST:])
    if hashlib.sha256(body).digest() != digest:
        raise SnapshotCorrupt("the snapshot is truncated or corrupted (checksum mismatch)")
    magic, version, flags, comp, tool_digest, size, image_length = _HEAD.unpack_from(body)
    del magic
    if version != FORMAT_VERSION or flags != 0:
        raise SnapshotMismatch(
            f"snapshot format version {version} (flags {flags}); this mighty reads version "
            f"{FORMAT_VERSION}"
        )
    if comp.hex() != component:
        raise SnapshotMismatch(
            f"the snapshot was taken with interpreter build {comp.hex()[:16]}..., this sandbox "
            f"runs {component[:16]}...: restore it with the same interpreter (and packages)"
        )
    if tool_digest.hex() != tools:
        raise SnapshotMismatch(
            "the snapshot was taken in a sandbox with other tools: restore it into a sandbox "
            "with the same tools (names, signatures and docs)"
        )
    if size > memory_limit:
        raise SnapshotTooLarge(
            f"the snapshot's memory is {size} bytes, over this sandbox's {memory_limit}-byte limit"
        )
    if size % _WASM_PAGE or size == 0 or image_length > size or image_length % _PAGE:
        raise SnapshotCorrupt(f"the snapshot's memory size {size} is not valid")
    reader = _Reader(body, _HEAD.size)
    holdings = _read_holdings(reader)
    ranges = _read_ranges(reader, size)
    payload_length = reader.u64()
    payload = reader.take(payload_length)
    if reader.pos != len(body):
        raise SnapshotCorrupt("the snapshot has bytes after its payload")
    total = sum(length for _offset, length in ranges)
    pages = _inflate(payload, total)
    return Snapshot(
        component=component,
        tools=tools,
        memory_size=size,
        image_length=image_length,
        holdings=holdings,
        ranges=ranges,
        data=pages,
    )


def _read_holdings(reader: _Reader) -> frozenset[tuple[str, int]]:
    count = reader.u32()
    if count > _MAX_HOLDINGS:
        raise SnapshotCorrupt(f"the snapshot lists {count} host resources")
    holdings: set[tuple[str, int]] = set()
    for _ in range(count):
        length = reader.u16()
        if length > _MAX_NAME:
            raise SnapshotCorrupt("a resource name in the snapshot is too long")
        try:
            name = bytes(reader.take(length)).decode()
        except UnicodeDecodeError:
            raise SnapshotCorrupt("a resource name in the snapshot is not UTF-8") from None
        holdings.add((name, reader.u32()))
    return frozenset(holdings)


def _read_ranges(reader: _Reader, size: int) -> tuple[tuple[int, int], ...]:
    count = reader.u32()
    if count > size // _PAGE:
        raise SnapshotCorrupt(f"the snapshot lists {count} memory ranges")
    ranges: list[tuple[int, int]] = []
    end = 0
    for _ in range(count):
        offset, length = reader.u64(), reader.u64()
        if offset % _PAGE or length % _PAGE or length == 0 or offset < end:
            raise SnapshotCorrupt("the snapshot's memory ranges are not valid")
        end = offset + length
        if end > size:
            raise SnapshotCorrupt("a memory range in the snapshot is past its memory size")
        ranges.append((offset, length))
    return tuple(ranges)


def _inflate(payload: memoryview, total: int) -> bytes:
    """Exactly ``total`` bytes from ``payload``, never more (the output is bounded)."""
    inflate = zlib.decompressobj()
    try:
        out = inflate.decompress(payload, total + 1)
        if len(out) == total and not inflate.eof:
            out += inflate.decompress(inflate.unconsumed_tail, 1)
    except zlib.error as exc:
        raise SnapshotCorrupt(f"the snapshot's pages do not inflate: {exc}") from None
    if len(out) != total or not inflate.eof or inflate.unused_data:
        raise SnapshotCorrupt("the snapshot's pages are not the length its ranges say")
    return out


class _Reader:
    __slots__ = ("pos", "view")

    def __init__(self, view: memoryview, pos: int) -> None:
        self.view = view
        self.pos = pos

    def take(self, n: int) -> memoryview:
        if n > len(self.view) - self.pos:
            raise SnapshotCorrupt("the snapshot is truncated")
        out = self.view[self.pos : self.pos + n]
        self.pos += n
        return out

    def u16(self) -> int:
        return int(struct.unpack("<H", self.take(2))[0])

    def u32(self) -> int:
        return int(struct.unpack("<I", self.take(4))[0])

    def u64(self) -> int:
        return int(struct.unpack("<Q", self.take(8))[0])
