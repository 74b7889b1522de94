"""The trace file: a header, then records appended and flushed one frame at a time.

Design note
-----------
A crash must lose at most the record being written, and a torn tail must be told apart from a
damaged file, so every record is its own checksummed frame, written with one ``write`` and
flushed at once (``fsync`` only on close: per-record fsync costs milliseconds and a process crash
does not need it). Rejected: one CBOR sequence with no framing (a torn tail decodes as garbage or
as a shorter valid item); a length-only prefix (a flipped length bit reads as "truncated here"
and silently drops the rest); a per-frame magic for resynchronising after damage (a damaged
trace is not replayable anyway, so the reader stops at the first bad frame); gzip/zstd streams
(a torn compressed tail loses more than one record); cbor2's decoder (it turns about thirty
semantic tags into datetimes, regexes, MIME messages, sets and cyclic shared lists before any
hook runs, and cannot be told not to; see ``_cbor.py``).

Layout (all integers big-endian)::

    file   = "MTYTRACE" u16:version  header-frame  frame*
    frame  = u32:length  u32:crc32(payload)  u32:crc32(the 8 bytes before)  payload
    payload = one CBOR item (the closed subset of ``_cbor.py``), a map with a text key "k"

The prefix checksum makes a damaged length field a ``TraceCorrupt``, not a fake truncation. A
length above ``MAX_FRAME`` is refused before anything is read. A frame that runs past the end of
the file, or a tail of zero bytes (what some file systems leave after a power cut), is a
truncated tail: the reader stops there and says so.

Frame kinds ("k"): ``header`` (first frame only; its other keys are the header), ``blob``
(``{"k": "blob", "sha256": hex, "data": bytes}``, written before the first record that refers to
it) and anything else, which is a record. Byte strings of ``BLOB_MIN`` bytes or more anywhere in
a record are stored once as a blob and referred to by tag 27009 (the sha256); the reader puts
the bytes back, so callers only ever see whole records. Blobs are resolved lazily: the reader
keeps each blob's frame offset, and reads a blob's data the first time a record refers to it.

Bounds on hostile files (issue 11): one frame decodes to at most ``MAX_ITEMS`` CBOR items and
``MAX_BLOB_REFS`` blob references (``_cbor.py``, ``_values.py`` bound the rest: depth, big
ints, hash containers). A resolved blob is kept for the reader's life and every reference gets
that same ``bytes`` object, never a copy: an evicting cache (64 MiB, once) let 100 references
alternating between two 40 MB blobs decode into 100 copies (4.1 GB from an 84 MB file). So the
blob bytes a reader holds are at most the blob frames of the file, each once, and the Python
objects of a frame at most ``MAX_ITEMS``. Rejected: a cache that hands out weak references
(``bytes`` cannot be weakly referenced, and callers want ``bytes``).

Each record passes through ``encode_value`` whole, so every field round-trips exactly, values
and plain fields alike (see ``_values.py`` for the tag table).

Record schema (written by the recorder; this layer only requires "k")::

    {"k": "instance", "i": id, "component": sha256, "policy": dict, "budget": dict}
    {"k": "import", "i": id, "s": step, "if": interface, "fn": function, "args": [value],
     "res": value, "out": "ok" | "exit" | "violation" | "host_error", "fuel": int}
    {"k": "export", "i": id, "s": step, "fn": str, "args": [value], "budget": dict,
     "res": value, "ok": bool, "error": {"kind": str, "message": str} | None, "fuel": int,
     "memory_peak": int}
    {"k": "close", "i": id, "stdout": bytes, "stderr": bytes, "digest": hex}

Reading: frames come from a 1 MiB read-ahead (``pread``); an import record in the recorder's
layout whose call was seen before is read by template (``_template.py``: the same record the
closed decoder gives, or none), everything else by the closed decoder.

The reader checks framing and encoding only. A record whose content changed but whose checksums
were fixed up, or frames in another order, read fine: catching those is the replayer's job.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as _dt
import functools
import hashlib
import os
import stat
import struct
import sys
import threading
import time
import weakref
import zlib
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, Literal

import cbor2

from mighty.trace._cbor import CBORInvalid, TagHook, decode
from mighty.trace._emit import BlobSink, Refused, emit, emit_into
from mighty.trace._errors import (
    TraceCorrupt,
    TraceError,
    TraceTruncated,
    TraceVersionError,
)
from mighty.trace._native import native, use_native
from mighty.trace._schema import check_record
from mighty.trace._template import ImportTemplates
from mighty.trace._values import MAX_DEPTH, TAG_BLOB, encode_with, value_from_tag

__all__ = [
    "BLOB_MIN",
    "BUFFER_BYTES",
    "FILE_MAGIC",
    "FLUSH_INTERVAL",
    "FLUSH_MODES",
    "FORMAT_VERSION",
    "MAX_BLOB_REFS",
    "MAX_FRAME",
    "MAX_ITEMS",
    "FlushMode",
    "ImportRecords",
    "Trace",
    "TraceReader",
    "TraceWriter",
    "read_trace",
]

FILE_MAGIC = b"MTYTRACE"
FORMAT_VERSION = 1
MAX_FRAME = 64 * 1024 * 1024
"""Largest payload of one frame, in bytes; checked on write and on read, before reading."""
BLOB_MIN = 4096
"""Byte strings at least this long are stored once, as a blob frame."""
MAX_ITEMS = 1 << 21
"""Most CBOR items (strings, numbers, containers, tags) one frame may decode to."""
MAX_BLOB_REFS = 1 << 16
"""Most blob references one frame may hold."""

_FILE_HEAD = struct.Struct(">8sH")
_PREFIX = struct.Struct(">III")
_DIGEST = 32
_RESERVED_KINDS = frozenset({"header", "blob"})
_READ_AHEAD = 1 << 20
_WRITEV_MAX = 64
"""Most pieces a drain writes with one ``writev`` (more are joined first)."""


_PACK_II = struct.Struct(">II").pack
_PACK_I = struct.Struct(">I").pack
_crc32 = zlib.crc32
_monotonic = time.monotonic


def _frame(payload: bytes) -> bytes:
    head = _PACK_II(len(payload), _crc32(payload))
    return head + _PACK_I(_crc32(head)) + payload


@functools.cache  # read from the installed metadata (a parse of a file each time: ~0.2 ms)
def _package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "unknown"


FlushMode = Literal["record", "call", "os"]
"""When appended records reach the operating system (see :class:`TraceWriter`)."""
FLUSH_MODES: tuple[FlushMode, ...] = ("record", "call", "os")
BUFFER_BYTES = 1 << 20
"""Default bound of the write-behind buffer: at this many bytes it is written out."""
FLUSH_INTERVAL = 1.0
"""Default age, in seconds, after which buffered records are written out."""


@dataclass(frozen=True, slots=True)
class ImportRecords:
    """A :class:`TraceWriter`'s ways in for import records its recorder has encoded itself
    (``TraceWriter.import_records``): the one seam between the two, so that the recorder reads
    nothing of the writer's own and the writer's choice between writing and queueing is made
    here once. Every payload must hold no byte string of ``blob_min`` bytes or more (those
    are blob records, which only ``append_parts`` and ``TraceWriter.append`` make)."""

    blob_min: int
    """Byte strings this long or longer go to blob records (not encoded in place)."""
    queued: bool
    """Whether records wait in a buffer (``flush`` is not ``"record"``)."""
    append: Callable[[bytes], None]
    """One payload, written now or buffered, under the writer's lock."""
    queue: Callable[[bytes], None]
    """One payload of at most ``MAX_ITEMS`` bytes: when ``queued``, queued without the
    writer's lock (``TraceWriter._queue``), else as ``append``."""
    append_parts: Callable[[bytes, list[Any], bytes, Any, bytes], None]
    """The record ``prefix args middle result suffix`` (args and result encoded here, blobs
    and gate handles included); raises :class:`Refused` (nothing written) for values the
    fast encoder does not take."""
    native_queue: native.Queue | None
    """The compiled queue the compiled taps frame records into, when the writer has one."""


class TraceWriter:
    """Writes one trace file: the header at once, then each ``append``-ed record.

    One writer per file; ``append`` takes a lock, so several threads may share a writer, but
    records land in the order the lock is taken. The file is created (``overwrite=False``
    refuses an existing one) and synced to disk on ``close``. After a failed write the writer
    refuses further records: the file ends at the last whole frame written.

    ``flush`` says when appended records reach the operating system (from where a crash of
    this process cannot lose them; only ``close`` syncs them to the disk):

    - ``"record"`` (the default here): every ``append`` is written before it returns.
    - ``"call"``: records wait in a buffer until ``boundary()`` (the recorder calls it when
      an export call begins and ends), until the buffer holds ``buffer_bytes``, or until the
      oldest waiting record is ``flush_interval`` seconds old when another is appended.
    - ``"os"``: as ``"call"`` but ``boundary()`` does not write: only size and age do, and a
      background thread writes out records older than ``flush_interval`` when no append comes.

    The header gets ``format``, ``mighty``, ``wasmtime`` and ``created`` filled in unless the
    caller gives them; ``engine`` (dict) and ``components`` (list of ``{"sha256", "path",
    "size"}``) default to empty; any other keys are kept as given.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        header: Mapping[str, Any],
        *,
        overwrite: bool = False,
        blob_min: int = BLOB_MIN,
        flush: FlushMode = "record",
        buffer_bytes: int = BUFFER_BYTES,
        flush_interval: float = FLUSH_INTERVAL,
    ) -> None:
        if flush not in FLUSH_MODES:
            raise TraceError(f"flush must be one of {', '.join(FLUSH_MODES)}, not {flush!r}")
        if type(buffer_bytes) is not int or buffer_bytes < 0:
            raise TraceError(f"buffer_bytes must be an int >= 0, not {buffer_bytes!r}")
        if not 0 < flush_interval < float("inf"):
            raise TraceError(f"flush_interval must be a positive number, not {flush_interval!r}")
        full = self._header(header)
        payload = self._encode(full, None)
        self._path = Path(path)
        self._blob_min = blob_min
        self._blobs: set[bytes] = set()
        self._lock = threading.Lock()
        self._failed: str | None = None
        self._records = 0
        self._mode: FlushMode = flush
        self._buffer: list[bytes] = []
        self._buffered = 0
        # Import records queued without the lock (``_queue``), framed when the buffer is next
        # touched under it: a deque, whose append and popleft are atomic, so a record queued
        # while another thread frames the queue is taken then or left for the next time.
        self._queued: deque[bytes] | native.Queue = deque()
        self._queued_bytes = 0
        self._queued_at = 0.0
        self._buffer_max = buffer_bytes
        self._interval = flush_interval
        # The compiled form of that queue (_speedups.c), when there is one: the recorder's
        # compiled taps frame their records straight into it. With flush="record" it drains
        # after every record (limit 0), as _append_payload writes each at once.
        self._cq: native.Queue | None = None
        if use_native():
            self._queued = self._cq = native.Queue(
                self._drain_queued,
                0 if flush == "record" else min(buffer_bytes, sys.maxsize),
                flush_interval,
                max(0, min(blob_min, sys.maxsize)),
                MAX_ITEMS,
            )
        self._oldest = 0.0
        try:
            self._file: BinaryIO | None = open(self._path, "wb" if overwrite else "xb", buffering=0)  # noqa: SIM115 - closed by close()
        except OSError as exc:
            raise TraceError(f"cannot create trace {self._path}: {exc}") from exc
        self._write(_FILE_HEAD.pack(FILE_MAGIC, FORMAT_VERSION) + _frame(payload))
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        if flush != "record":
            # A writer never closed still writes out what waits when the interpreter exits
            # normally (a crash is what the durability setting is about).
            _BUFFERED.add(self)
        if flush == "os":
            self._flusher = threading.Thread(
                target=self._flush_by_age, name=f"trace-flush {self._path.name}", daemon=True
            )
            self._flusher.start()

    @staticmethod
    def _header(given: Mapping[str, Any]) -> dict[str, Any]:
        if "k" in given:
            raise TraceError('a trace header must not have a "k" key; the format sets it')
        if given.get("format", FORMAT_VERSION) != FORMAT_VERSION:
            raise TraceError(f"this writer writes format {FORMAT_VERSION}, not {given['format']}")
        full: dict[str, Any] = {
            "k": "header",
            "format": FORMAT_VERSION,
            "mighty": _package_version("mighty-host"),
            "wasmtime": _package_version("wasmtime"),
            "engine": {},
            "components": [],
            "created": _dt.datetime.now(_dt.UTC).isoformat(),
        }
        full.update(given)
        components = full["components"]
        if type(components) is not list or not all(
            type(c) is dict
            and type(c.get("sha256")) is str
            and type(c.get("path")) is str
            and type(c.get("size")) is int
            for c in components
        ):
            raise TraceError(
                'header "components" must be a list of {"sha256": str, "path": str, "size": int}'
            )
        if type(full["engine"]) is not dict:
            raise TraceError('header "engine" must be a dict')
        return full

    @property
    def path(self) -> Path:
        """Where the trace is written."""
        return self._path

    @property
    def flush_mode(self) -> FlushMode:
        """When appended records reach the operating system."""
        return self._mode

    @property
    def records_written(self) -> int:
        """How many records ``append`` has taken (written, or waiting in the buffer)."""
        return self._records + len(self._queued)

    def append(self, record: Mapping[str, Any]) -> None:
        """Encode ``record`` and append it (after any new blob it holds).

        Raises ``TraceError`` for a value a trace cannot hold (naming where it is), a record
        without a text ``"k"`` or with a reserved one, a frame over ``MAX_FRAME``, and after
        ``close`` or a failed write. Nothing is written for a record that is refused.
        """
        if type(record) is not dict:
            raise TraceError(f"a record must be a dict, got {type(record).__name__}")
        kind = record.get("k")
        if type(kind) is not str:
            raise TraceError('a record needs a "k" (kind) key holding a str')
        if kind in _RESERVED_KINDS:
            raise TraceError(f'record kind "{kind}" is reserved for the format')
        with self._lock:
            self._check_open()
            sink = BlobSink(self._blob_min, self._blobs)
            try:
                payload = self._checked(emit(record, sink))
            except Refused:
                # The reference encoder says why (or, should the two ever disagree, writes it).
                sink, payload = self._encode_reference(record)
            self._push(sink, payload)

    def import_records(self) -> ImportRecords:
        """The paths the recorder (``mighty.trace._recorder``) appends its import records by,
        each encoded whole by the recorder (see :class:`ImportRecords`)."""
        return ImportRecords(
            blob_min=self._blob_min,
            queued=self._mode != "record",
            append=self._append_payload,
            queue=self._append_payload if self._mode == "record" else self._queue,
            append_parts=self._append_parts,
            native_queue=self._cq,
        )

    def _append_parts(
        self, prefix: bytes, args: list[Any], middle: bytes, result: Any, suffix: bytes
    ) -> None:
        """Append the record ``prefix args middle result suffix``: the recorder's import
        records, whose fixed parts are made once per import (``args`` and ``result`` may hold
        gate Handles); :class:`Refused` (nothing written) for values the fast encoder does not
        take."""
        with self._lock:
            if self._failed is not None or self._file is None:
                self._check_open()
            sink = BlobSink(self._blob_min, self._blobs)
            out = [prefix]
            emit_into(args, 1, sink, True, out)
            out.append(middle)
            emit_into(result, 1, sink, True, out)
            out.append(suffix)
            payload = b"".join(out)
            if len(payload) > MAX_ITEMS:  # MAX_ITEMS < MAX_FRAME: shorter ones pass both
                self._checked(payload)
            if sink.pending:
                self._push(sink, payload)
                return
            self._emit(_frame(payload))

    def _emit(self, data: bytes) -> None:
        """Write one framed record now (``flush="record"``) or buffer it, draining the buffer
        when it is full or its oldest record is older than the interval (under the lock)."""
        if self._mode == "record":
            self._write(data)
        else:
            if self._queued:
                self._frame_queued()
            buffer = self._buffer
            if not buffer:
                self._oldest = time.monotonic()
            buffer.append(data)
            self._buffered += len(data)
            if (
                self._buffered >= self._buffer_max
                or time.monotonic() - self._oldest >= self._interval
            ):
                self._drain()
        self._records += 1

    def _append_payload(self, payload: bytes) -> None:
        """Append one record already encoded whole, holding no blob-sized byte string (the
        recorder's fast path for import records; ``_append_parts`` is the general one)."""
        with self._lock:
            if self._failed is not None or self._file is None:
                self._check_open()
            if len(payload) > MAX_ITEMS:  # MAX_ITEMS < MAX_FRAME: shorter ones pass both
                self._checked(payload)
            self._emit(_frame(payload))

    def _queue(self, payload: bytes) -> None:
        """Append one import record already encoded whole, holding no blob-sized byte string
        and at most ``MAX_ITEMS`` bytes, without taking the lock (``flush`` not ``"record"``):
        framed here and queued, it is moved into the buffer by the next records that touch it,
        or when the queue holds ``buffer_bytes`` or its oldest record is ``flush_interval``
        old, and goes out with the buffer as any other record does. Only the recorder's import
        records come this way: one ``deque.append`` instead of a lock and a buffer check on the
        guest's path. With the compiled queue (``_speedups.Queue``) the framing and the checks
        are its ``push``, and the recorder's compiled taps queue there without Python."""
        if self._failed is not None or self._file is None:
            self._check_open()
        if self._cq is not None:
            self._cq.push(payload)  # framed there; calls _drain_queued when due
            return
        head = _PACK_II(len(payload), _crc32(payload))
        frame = head + _PACK_I(_crc32(head)) + payload
        queued = self._queued
        assert type(queued) is deque
        now = _monotonic()
        if not queued:
            self._queued_at = now
        queued.append(frame)
        self._queued_bytes += len(frame)
        if self._queued_bytes >= self._buffer_max or now - self._queued_at >= self._interval:
            self._drain_queued()

    def _drain_queued(self) -> None:
        """The queue is full or old enough: write it out (takes the lock)."""
        with self._lock:
            self._check_open()
            self._frame_queued()
            self._drain()

    def _frame_queued(self) -> None:
        """Move the queued frames into the buffer, in order (under the lock)."""
        buffer = self._buffer
        cq = self._cq
        if cq is not None:
            if cq:
                if not buffer:
                    self._oldest = cq.oldest
                data, taken = cq.take()
                buffer.append(data)
                self._buffered += len(data)
                self._records += taken
            return
        queued = self._queued
        assert type(queued) is deque
        if not buffer:
            self._oldest = self._queued_at
        taken = len(buffer)
        append, popleft = buffer.append, queued.popleft
        while queued:
            append(popleft())
        taken = len(buffer) - taken
        # A frame queued meanwhile by another thread may be counted here or the next time.
        self._buffered += self._queued_bytes
        self._queued_bytes = 0
        self._records += taken

    def _encode_reference(self, record: Mapping[str, Any]) -> tuple[BlobSink, bytes]:
        sink = BlobSink(self._blob_min, self._blobs)

        def blob(data: bytes, depth: int) -> Any:
            if len(data) < self._blob_min or depth >= MAX_DEPTH:
                return data
            sink.ref(data)
            return cbor2.CBORTag(TAG_BLOB, hashlib.sha256(data).digest())

        return sink, self._encode(record, blob)

    def _push(self, sink: BlobSink, payload: bytes) -> None:
        frames = [
            _frame(self._encode({"k": "blob", "sha256": d.hex(), "data": data}, None))
            for d, data in sink.pending.items()
        ]
        frames.append(_frame(payload))
        data = b"".join(frames) if len(frames) > 1 else frames[0]
        if self._mode == "record":
            self._write(data)
        else:
            if self._queued:
                self._frame_queued()
            if not self._buffer:
                self._oldest = time.monotonic()
            self._buffer.append(data)
            self._buffered += len(data)
            if (
                self._buffered >= self._buffer_max
                or time.monotonic() - self._oldest >= self._interval
            ):
                self._drain()
        self._blobs.update(sink.pending)
        self._records += 1

    @staticmethod
    def _encode(value: Any, hook: Any) -> bytes:
        data = encode_with(value, hook)
        try:
            payload = cbor2.dumps(data)
        except (ValueError, TypeError, cbor2.CBOREncodeError) as exc:
            # e.g. a str holding a lone surrogate, which UTF-8 cannot carry.
            raise TraceError(f"cannot record this value: {exc}") from exc
        return TraceWriter._checked(payload)

    @staticmethod
    def _checked(payload: bytes) -> bytes:
        if len(payload) > MAX_FRAME:
            raise TraceError(f"a frame of {len(payload)} bytes is over the {MAX_FRAME} limit")
        if len(payload) > MAX_ITEMS:
            # Every item takes a byte at least, so only a payload this long can hold too many.
            try:
                decode(payload, _count_only, MAX_DEPTH + 1, MAX_ITEMS)
            except CBORInvalid as exc:
                raise TraceError(f"cannot record this value: {exc.reason}") from None
        return payload

    def _check_open(self) -> None:
        if self._failed is not None:
            raise TraceError(f"trace {self._path} is unusable: {self._failed}")
        if self._file is None:
            raise TraceError(f"trace {self._path} is closed")

    def _write(self, data: bytes) -> None:
        assert self._file is not None
        try:
            view = memoryview(data)
            while view:
                written = self._file.write(view)
                if written is None:  # only for non-blocking files, which this is not
                    raise OSError("the write would block")
                view = view[written:]
        except OSError as exc:
            self._failed = f"a write failed ({exc})"
            if self._cq is not None:
                self._cq.close()  # the compiled taps go the general way, which raises
            raise TraceError(f"cannot write trace {self._path}: {exc}") from exc

    def _drain(self) -> None:
        """Write out the buffer (under the lock)."""
        if self._queued:
            self._frame_queued()
        buffer = self._buffer
        if not buffer:
            return
        self._buffered = 0
        if 1 < len(buffer) <= _WRITEV_MAX and self._cq is not None:
            # A queue's frames arrive as one large bytes object with a few records around
            # it: written as they are, not copied into one first.
            pieces = buffer[:]
            buffer.clear()
            self._write_pieces(pieces)
            return
        data = b"".join(buffer)
        buffer.clear()
        self._write(data)

    def _write_pieces(self, pieces: list[bytes]) -> None:
        """``_write(b"".join(pieces))`` with one ``writev``."""
        assert self._file is not None
        try:
            written = os.writev(self._file.fileno(), pieces)
        except OSError as exc:
            self._failed = f"a write failed ({exc})"
            if self._cq is not None:
                self._cq.close()
            raise TraceError(f"cannot write trace {self._path}: {exc}") from exc
        if written < sum(len(piece) for piece in pieces):  # a short write: the rest as _write
            self._write(b"".join(pieces)[written:])

    def _flush_by_age(self) -> None:
        while not self._stop.wait(self._interval / 2):
            with self._lock:
                if self._buffer:
                    oldest = self._oldest
                else:
                    oldest = self._cq.oldest if self._cq is not None else self._queued_at
                if (
                    self._file is not None
                    and self._failed is None
                    and (self._buffer or self._queued)
                    and time.monotonic() - oldest >= self._interval
                ):
                    try:
                        self._drain()
                    except TraceError:
                        return  # _failed is set: the next append says so

    def boundary(self) -> None:
        """An export call began or ended: with ``flush="call"``, write out what waits."""
        if self._mode != "call":
            return
        with self._lock:
            self._check_open()
            self._drain()

    def flush(self) -> None:
        """Hand every record appended so far to the operating system, whatever the mode."""
        with self._lock:
            self._check_open()
            self._drain()

    def close(self, *, sync: bool = True) -> None:
        """Write out, sync to disk (unless ``sync`` is false: a file about to be deleted) and
        close; closing twice is a no-op."""
        self._stop.set()
        flusher = self._flusher
        if flusher is not None and flusher is not threading.current_thread():
            flusher.join()
        with self._lock:
            f = self._file
            if f is None:
                return
            try:
                if self._failed is None:
                    self._drain()
                if sync:
                    os.fsync(f.fileno())
            except OSError as exc:
                raise TraceError(f"cannot sync trace {self._path}: {exc}") from exc
            finally:
                self._file = None
                if self._cq is not None:
                    self._cq.close()
                f.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading if it is a regular file: a FIFO (which would block the open
    or the first read forever) or a device (``/dev/zero``: endless) is a TraceError at once."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise TraceError(f"cannot open trace {path}: {exc}") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise TraceError(f"trace {path} is not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


class TraceReader:
    """Reads a trace file: ``header`` at once, ``records()`` lazily, one frame at a time.

    A file that ends inside a frame (a crash mid-write) is not an error by default: iteration
    stops, ``truncated`` becomes true and ``readable_records``/``readable_bytes`` say how much
    was whole; with ``strict=True`` it raises ``TraceTruncated`` instead. A file that ends
    inside its header always raises ``TraceTruncated``: there is nothing to read. Any damage
    raises ``TraceCorrupt`` with the byte offset. Not thread-safe.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, strict: bool = False, max_frame: int = MAX_FRAME
    ) -> None:
        self._path = Path(path)
        self._strict = strict
        self._max_frame = max_frame
        self._blob_at: dict[bytes, int] = {}
        self._cache: dict[bytes, bytes] = {}
        self._resolved = 0
        self._frame_refs = 0
        self.truncated = False
        """True once ``records()`` has met a cut-off frame."""
        self.readable_records = 0
        """Records read by the last ``records()`` pass (all there are, once it ends)."""
        self.record_offset = -1
        """Byte offset of the frame of the record ``records()`` yielded last."""
        self.record_canonical: bytes | None = None
        """The canonical CBOR of the record ``records()`` yielded last (what the replayer
        digests), when it was read by template (``_template.py``); else None."""
        self._templates = ImportTemplates()
        # Frames are read from one read-ahead buffer (a pread of up to _READ_AHEAD bytes),
        # not with a seek and a read each: ``_ahead`` holds the file's bytes from ``_ahead_at``.
        self._ahead = b""
        self._ahead_at = 0
        self._file: BinaryIO | None = _open_regular(self._path)
        try:
            self._header, self._body = self._read_header()
        except BaseException:
            self.close()
            raise
        self.readable_bytes = self._body
        """Bytes of the file that hold whole frames (header included), as far as read."""

    @property
    def header(self) -> dict[str, Any]:
        """The header the writer was given, with what it filled in."""
        return dict(self._header)

    @property
    def path(self) -> Path:
        """The file being read."""
        return self._path

    def _size(self) -> int:
        assert self._file is not None
        return os.fstat(self._file.fileno()).st_size

    def _read_at(self, pos: int, n: int, ahead: bool = False) -> bytes:
        """Up to ``n`` bytes of the file at ``pos`` (fewer at its end), as read now or by the
        read-ahead of this ``records()`` pass; ``ahead`` (the pass's own reads) reads ahead
        when the buffer does not hold them (a blob's frame, elsewhere, is read on its own)."""
        if self._file is None:
            raise TraceError(f"trace {self._path} is closed")
        at = pos - self._ahead_at
        buffer = self._ahead
        if at >= 0 and at + n <= len(buffer):
            return buffer[at : at + n]
        if not ahead or n >= _READ_AHEAD:
            return os.pread(self._file.fileno(), n, pos)
        self._ahead = buffer = os.pread(self._file.fileno(), _READ_AHEAD, pos)
        self._ahead_at = pos
        return buffer[:n]

    def _read_header(self) -> tuple[dict[str, Any], int]:
        size = self._size()
        head = self._read_at(0, _FILE_HEAD.size)
        if len(head) < _FILE_HEAD.size:
            if FILE_MAGIC.startswith(head[: len(FILE_MAGIC)]):
                raise TraceTruncated(
                    f"{self._path} ends inside the file header ({len(head)} bytes)",
                    readable_records=0,
                    readable_bytes=0,
                )
            raise TraceCorrupt(f"{self._path} is not a mighty trace (bad magic)", offset=0)
        magic, version = _FILE_HEAD.unpack(head)
        if magic != FILE_MAGIC:
            raise TraceCorrupt(f"{self._path} is not a mighty trace (bad magic)", offset=0)
        if version != FORMAT_VERSION:
            raise TraceVersionError(
                f"{self._path} is trace format {version}; this mighty reads {FORMAT_VERSION}",
                offset=len(FILE_MAGIC),
                version=version,
            )
        pos = _FILE_HEAD.size
        frame = self._frame_at(pos, size)
        if frame is None:
            raise TraceTruncated(
                f"{self._path} ends inside its header frame",
                readable_records=0,
                readable_bytes=pos,
            )
        payload, end = frame
        header = self._decode(payload, pos, _no_blobs)
        if header.get("k") != "header":
            raise TraceCorrupt(
                f"the first frame is {header.get('k')!r}, not the header", offset=pos
            )
        if header.get("format") != FORMAT_VERSION:
            raise TraceCorrupt(
                f"header says format {header.get('format')!r}, the file {FORMAT_VERSION}",
                offset=pos,
            )
        del header["k"]
        return header, end

    def _frame_at(self, pos: int, size: int, ahead: bool = False) -> tuple[bytes, int] | None:
        """The payload of the frame at ``pos`` and where the next starts; None if cut off.
        ``ahead``: read through the read-ahead buffer (see ``_read_at``)."""
        left = size - pos
        if left < _PREFIX.size:
            return None
        prefix = self._read_at(pos, _PREFIX.size, ahead)
        if len(prefix) < _PREFIX.size:
            return None
        length, crc, prefix_crc = _PREFIX.unpack(prefix)
        if zlib.crc32(prefix[:8]) != prefix_crc:
            if self._zero_tail(pos, size):
                return None
            raise TraceCorrupt(
                f"frame at byte {pos}: its length/checksum prefix is damaged", offset=pos
            )
        if length > self._max_frame:
            raise TraceCorrupt(
                f"frame at byte {pos} claims {length} bytes, over the {self._max_frame} limit",
                offset=pos,
            )
        if length > left - _PREFIX.size:
            return None
        payload = self._read_at(pos + _PREFIX.size, length, ahead)
        if len(payload) < length:
            return None
        if zlib.crc32(payload) != crc:
            raise TraceCorrupt(f"frame at byte {pos}: payload checksum mismatch", offset=pos)
        return payload, pos + _PREFIX.size + length

    def _next_frame(self, pos: int, size: int) -> tuple[bytes, int] | None:
        """``_frame_at(pos, size, True)``: a whole, well-formed frame the read-ahead holds is
        taken here; anything else (a refill, a cut-off or damaged frame) by ``_frame_at``,
        which says what is wrong."""
        at = pos - self._ahead_at
        buffer = self._ahead
        if at >= 0 and at + _PREFIX.size <= len(buffer) and size - pos >= _PREFIX.size:
            length, crc, prefix_crc = _PREFIX.unpack_from(buffer, at)
            stop = at + _PREFIX.size + length
            if (
                length <= self._max_frame
                and stop <= len(buffer)
                and pos + _PREFIX.size + length <= size
                and _crc32(buffer[at : at + 8]) == prefix_crc
            ):
                payload = buffer[at + _PREFIX.size : stop]
                if _crc32(payload) == crc:
                    return payload, pos + _PREFIX.size + length
        return self._frame_at(pos, size, True)

    def _zero_tail(self, pos: int, size: int) -> bool:
        chunk = 1 << 20
        while pos < size:
            data = self._read_at(pos, min(chunk, size - pos))
            if not data or data.count(0) != len(data):
                return not data
            pos += len(data)
        return True

    def _decode(self, payload: bytes, pos: int, hook: TagHook) -> dict[str, Any]:
        self._frame_refs = 0
        try:
            value = decode(payload, hook, MAX_DEPTH, MAX_ITEMS)
        except CBORInvalid as exc:
            raise TraceCorrupt(f"frame at byte {pos}: {exc}", offset=pos) from None
        except RecursionError:
            raise TraceCorrupt(f"frame at byte {pos}: nested too deeply", offset=pos) from None
        if type(value) is not dict or type(value.get("k")) is not str:
            raise TraceCorrupt(f'frame at byte {pos} is not a map with a text "k"', offset=pos)
        return value

    def _blob_hook(self, tag: int, content: Any) -> Any:
        if tag != TAG_BLOB:
            return value_from_tag(tag, content)
        if type(content) is not bytes or len(content) != _DIGEST:
            raise ValueError("a blob reference must be a 32-byte sha256")
        self._resolved += 1
        self._frame_refs += 1
        if self._frame_refs > MAX_BLOB_REFS:
            raise ValueError(f"more than {MAX_BLOB_REFS} blob references in one frame")
        data = self._cache.get(content)
        if data is not None:
            return data
        at = self._blob_at.get(content)
        if at is None:
            raise ValueError(f"refers to blob {content.hex()}, which no earlier frame holds")
        frame = self._frame_at(at, self._size())
        if frame is None:
            raise ValueError(f"blob {content.hex()} at byte {at} is no longer readable")
        refs = self._frame_refs
        data = self._check_blob(self._decode(frame[0], at, _no_blobs), at)
        self._frame_refs = refs
        self._cache[content] = data
        return data

    def _check_blob(self, blob: dict[str, Any], pos: int) -> bytes:
        data, digest = blob.get("data"), blob.get("sha256")
        if (
            set(blob) != {"k", "sha256", "data"}
            or type(data) is not bytes
            or type(digest) is not str
        ):
            raise TraceCorrupt(f"blob frame at byte {pos} is malformed", offset=pos)
        if hashlib.sha256(data).hexdigest() != digest:
            raise TraceCorrupt(
                f"blob frame at byte {pos}: data does not match its sha256", offset=pos
            )
        return data

    def records(self, *, schema: bool = False, canonical: bool = False) -> Iterator[dict[str, Any]]:
        """Every record after the header, in file order, blobs put back in place.

        Reads up to the file's size when iteration starts; starting again reads from the top.
        With ``schema``, a record of a kind the recorder writes that breaks its schema is a
        ``TraceInvalid`` at its frame's offset (``_schema.py``); ``record_offset`` is where the
        record last yielded starts. With ``canonical``, ``record_canonical`` is the canonical
        CBOR of the record last yielded when it was read by template (else None).
        """
        size = self._size()
        pos = self._body
        self.truncated = False
        self.readable_records = 0
        self.readable_bytes = pos
        self._ahead = b""  # read afresh: the file may have changed since the last pass
        templates = self._templates
        while pos < size:
            frame = self._next_frame(pos, size)
            if frame is None:
                self.truncated = True
                if self._strict:
                    raise TraceTruncated(
                        f"{self._path} ends inside the frame at byte {pos}",
                        readable_records=self.readable_records,
                        readable_bytes=pos,
                    )
                return
            payload, end = frame
            resolved = self._resolved
            known = templates.get(payload, canonical)
            checked = False
            if known is not None:
                record, self.record_canonical, checked = known
            else:
                record = self._decode(payload, pos, self._blob_hook)
                self.record_canonical = None
                if record["k"] == "import" and self._resolved == resolved:
                    learnt = templates.learn(payload, record, MAX_ITEMS)
                    self.record_canonical = learnt if canonical else None
            kind = record["k"]
            if kind == "blob":
                if self._resolved != resolved:
                    raise TraceCorrupt(f"blob frame at byte {pos} refers to a blob", offset=pos)
                self._check_blob(record, pos)
                # Only the offset is kept; the data is read again when a record refers to it.
                self._blob_at.setdefault(bytes.fromhex(record["sha256"]), pos)
            elif kind == "header":
                raise TraceCorrupt(f"a second header frame at byte {pos}", offset=pos)
            elif schema and not checked:
                check_record(record, pos)
            self.record_offset = pos
            pos = end
            self.readable_bytes = pos
            if kind != "blob":
                self.readable_records += 1
                yield record

    def close(self) -> None:
        """Close the file; closing twice is a no-op."""
        f, self._file = self._file, None
        if f is not None:
            f.close()

    def __enter__(self) -> TraceReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


_BUFFERED: weakref.WeakSet[TraceWriter] = weakref.WeakSet()


@atexit.register
def _drain_at_exit() -> None:
    for writer in list(_BUFFERED):
        with writer._lock:
            if writer._file is not None and writer._failed is None:
                with contextlib.suppress(TraceError):
                    writer._drain()


def _count_only(_tag: int, _content: Any) -> Any:
    return None


def _no_blobs(tag: int, content: Any) -> Any:
    if tag == TAG_BLOB:
        raise ValueError("a blob reference is not allowed here")
    return value_from_tag(tag, content)


@dataclass(frozen=True, slots=True)
class Trace:
    """A whole trace read into memory (``read_trace``).

    ``records()`` is a method, as on ``TraceReader``, so code can take either.
    """

    path: Path
    header: dict[str, Any]
    all_records: tuple[dict[str, Any], ...]
    truncated: bool
    """The file ended inside a frame; the records are the whole ones before it."""
    readable_bytes: int
    """Bytes of the file that hold whole frames."""

    def records(self) -> Iterator[dict[str, Any]]:
        """Every record, in file order (``all_records`` holds them as a tuple)."""
        return iter(self.all_records)

    @property
    def readable_records(self) -> int:
        """How many records were whole."""
        return len(self.all_records)


def read_trace(
    path: str | os.PathLike[str], *, strict: bool = False, schema: bool = False
) -> Trace:
    """Read a whole trace; see ``TraceReader`` for what is raised and what truncation means.

    ``schema`` checks every record of a kind the recorder writes (``TraceInvalid``)."""
    with TraceReader(path, strict=strict) as reader:
        records = tuple(reader.records(schema=schema))
        return Trace(
            path=reader.path,
            header=reader.header,
            all_records=records,
            truncated=reader.truncated,
            readable_bytes=reader.readable_bytes,
        )
