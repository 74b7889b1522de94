"""Exact linear-memory accounting: mighty allocates every guest linear memory itself.

wasmtime's C API offers a store limiter with fixed numbers and no callback, so with the default
allocator the host can neither see how large a guest's memories are nor tell that a guest hit the
ceiling (``memory.grow`` just returns -1 and the guest does what it likes with that). Both are
required: usage reports peak memory, and running out must be a typed ``OutOfMemory``.

So the engine is configured with a host memory creator (``wasmtime_config_host_memory_creator_set``)
implemented here: each linear memory is an anonymous mapping reserved PROT_NONE and made
read-write as it grows. Every memory is charged to a :class:`MemoryAccount` (one per store); a
grow that would take the account past its ceiling records the request and fails, which wasmtime
turns into a trap that the budget layer reports as ``OutOfMemory``.

Rejected:
- the default allocator plus ``/proc/self/maps`` scanning: not attributable to a store, racy
  across threads, and ~100 us a read;
- the store limiter alone: silent ``-1`` to the guest, no usage figures.

Cost: copy-on-write memory images need wasmtime's own allocator, so instantiation copies the data
segments (~13 MB for a componentize-py guest, about 5 ms with the pages pre-faulted by
``MAP_POPULATE``); docs/architecture.md records the measurements and the rejected huge pages.
"""

from __future__ import annotations

import array
import collections
import ctypes
import errno
import itertools
import os
import re
import struct
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mighty._errors import BadInput
from mighty._wasmtime import ffi
from mighty.engine._image import MemoryImage
from mighty.engine._native import immortal
from mighty.engine._state import MAX_GAP, MemoryState, freeze, layerable

try:
    from mighty.engine import _pages  # the rewind's copy and the capture's compare (_pages.c)
except ImportError:  # not built: the pure-Python paths
    _pages = None  # type: ignore[assignment]


def _compiled() -> bool:
    """Whether to use ``_pages`` now: built, and ``MIGHTY_PURE_PYTHON`` not set (to anything
    but ``0``), as for mighty.abi and mighty.trace's compiled paths."""
    return _pages is not None and os.environ.get("MIGHTY_PURE_PYTHON", "") in ("", "0")


__all__ = [
    "MemoryAccount",
    "capture_memory",
    "install_memory_creator",
    "instantiating_into",
    "learn_hot_pages",
    "live_memories",
    "populate_memory",
    "restore_memory",
    "rewind_memory",
]

_WASM32_MAX = 1 << 32

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.mprotect.restype = ctypes.c_int
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.memcmp.restype = ctypes.c_int
_libc.memcmp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
# Called once per run of pages by ``rewind_memory`` (hundreds per rewind): without releasing
# the GIL (``PyDLL``), as each copy is a few microseconds; through ``CDLL`` every call let a
# running guest's thread take the GIL and back (~2x the rewind's time with a run beside it).
_memmove_holding_gil = ctypes.PyDLL(None).memmove
_memmove_holding_gil.restype = ctypes.c_void_p
_memmove_holding_gil.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
_libc.madvise.restype = ctypes.c_int
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
# Called once per range by ``_map_ranges``'s pure-Python path (~300 for a layered state; the
# compiled path releases the GIL once for all of them): without releasing the GIL either, for the
# same reason, and worse: with another thread running Python (not a guest), every call waited for
# that thread's switch interval to get the GIL back (5 ms): mapping a state of 284 ranges took
# 1.3 s beside a busy Python thread, 2.3 ms beside an idle one.
_mmap_holding_gil = ctypes.PyDLL(None, use_errno=True).mmap
_mmap_holding_gil.restype = ctypes.c_void_p
_mmap_holding_gil.argtypes = _libc.mmap.argtypes
_mprotect_holding_gil = ctypes.PyDLL(None, use_errno=True).mprotect
_mprotect_holding_gil.restype = ctypes.c_int
_mprotect_holding_gil.argtypes = _libc.mprotect.argtypes

_PROT_NONE = 0
_PROT_READ = 0x1
_MAP_SHARED = 0x01
_PROT_READ_WRITE = 0x1 | 0x2
_MAP_PRIVATE = 0x02
_MAP_ANONYMOUS = 0x20
_MAP_NORESERVE = 0x4000
_MAP_FIXED = 0x10
_MAP_POPULATE = 0x8000
_MAP_FAILED = ctypes.c_void_p(-1).value


@dataclass(eq=False)
class MemoryAccount:
    """The linear memory of one store: what it holds now, its peak, and its ceiling.

    ``limit`` may be lowered or raised between calls; memories never shrink, so ``current`` is
    also the peak since the store was created. ``peak`` is reset by the budget layer at the start
    of each call. ``denied`` holds the first grow refused since the last reset, as
    ``(requested_total_bytes, limit)``.
    """

    limit: int
    current: int = 0
    peak: int = 0
    denied: tuple[int, int] | None = None
    calls: int = 0
    """Calls begun (every guest call begins with ``start_call``, and nothing else writes the
    memory but a call and this module): a memory mapped when this was N, and N still, holds
    what it was mapped with (``restore_memory``)."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def start_call(self, limit: int) -> None:
        """Begin a call: apply its ceiling and start a new peak measurement."""
        with self._lock:
            self.calls += 1
            self.limit = limit
            self.peak = self.current
            self.denied = None

    def _charge(self, delta: int) -> bool:
        with self._lock:
            wanted = self.current + delta
            if wanted > self.limit:
                if self.denied is None:
                    self.denied = (wanted, self.limit)
                return False
            self.current = wanted
            self.peak = max(self.peak, wanted)
            return True

    def _release(self, amount: int) -> None:
        with self._lock:
            self.current -= amount


@dataclass(eq=False)
class _Memory:
    base: int
    size: int
    reserved: int
    mapped: int
    maximum: int
    account: MemoryAccount
    image: MemoryImage | None = None
    state: MemoryState | None = None
    """The frozen state the memory was made from: its pages differ from the image even
    where the guest has not written them since."""
    mapped_at: int = -1
    """``account.calls`` when ``restore_memory`` last mapped ``state`` whole or as a layer
    (-1: not since made, or written by this module since: ``rewind_memory``)."""
    frozen: list[weakref.ref[MemoryState]] = field(default_factory=list)
    """States the memory held whole since it was last mapped (made or restored from them, or
    captured from them), newest last, at most ``_FROZEN``, held weakly: every page where the
    memory differs from one of them is one of the memory's own (written since it was mapped),
    so a capture can be a layer over the newest that still lives (``capture_memory``; a state
    captured only to be dropped, say for its size, would otherwise end the chain)."""


_MEMORIES: dict[int, _Memory] = {}
_MEMORIES_LOCK = threading.RLock()
"""Reentrant: a garbage collection that runs while a thread holds it (any allocation can start
one) may delete a wasmtime store, whose memories' ``_free_memory`` then takes it again on the
same thread (a plain lock deadlocked there: CI's stress run hung in ``_new_memory``). Inside
it, readers copy the table (``list(...)``, no Python code runs while it copies) before they
walk it, so a free made by such a collection cannot change it under them."""
_NEXT_ID = itertools.count(1)
_LOCAL = threading.local()
# Memories created while no account is installed (wasmtime-internal or foreign use of the engine)
# are tracked but never limited beyond the wasm32 maximum.
_UNBOUNDED = MemoryAccount(limit=1 << 62)


class instantiating_into:  # noqa: N801 - used as a context manager, reads like a `with` clause
    """Charge every memory created on this thread inside the block to ``account``.

    ``images`` are the component's memory images (:mod:`mighty.engine._image`), in the order its
    defined memories are created: the memories get them copy-on-write instead of zeroed pages.
    A component whose segments were moved into images must be instantiated with them.
    ``states`` (frozen states of earlier memories of the same component, see
    :mod:`mighty.engine._state`), in the same order, make the memories start from those contents
    and sizes instead of the images'.
    """

    def __init__(
        self,
        account: MemoryAccount,
        images: Sequence[MemoryImage] = (),
        *,
        prefault: bool = False,
        states: Sequence[MemoryState] = (),
    ) -> None:
        self._account = account
        self._images = images
        self._prefault = prefault
        self._states = states
        self._saved: tuple[Any, Any, Any, Any] = (None, None, False, None)

    def __enter__(self) -> MemoryAccount:
        self._saved = (
            getattr(_LOCAL, "account", None),
            getattr(_LOCAL, "images", None),
            getattr(_LOCAL, "prefault", False),
            getattr(_LOCAL, "states", None),
        )
        _LOCAL.account = self._account
        _LOCAL.images = list(self._images)
        _LOCAL.prefault = self._prefault
        _LOCAL.states = list(self._states)
        return self._account

    def __exit__(self, *exc: object) -> None:
        _LOCAL.account, _LOCAL.images, _LOCAL.prefault, _LOCAL.states = self._saved


def _error(message: str) -> int:
    # wasmtime takes ownership of the returned error and turns it into a trap or failed call.
    ptr = ffi.wasmtime_error_new(message.encode())
    value = ctypes.cast(ptr, ctypes.c_void_p).value
    return int(value or 0)


def _get_memory(env: int | None, byte_size: Any, byte_max: Any) -> int:
    memory = _MEMORIES[env or 0]
    byte_size[0] = memory.size
    byte_max[0] = memory.maximum
    return memory.base


def _grow_memory(env: int | None, new_size: int) -> int:
    try:
        memory = _MEMORIES[env or 0]
        if new_size <= memory.size:
            return 0
        if new_size > memory.reserved:
            return _error("mighty: linear memory grown past its reservation")
        if not memory.account._charge(new_size - memory.size):
            return _error("mighty: memory limit exceeded")
        if _libc.mprotect(memory.base, new_size, _PROT_READ_WRITE) != 0:
            memory.account._release(new_size - memory.size)
            return _error(f"mighty: mprotect failed: {os.strerror(ctypes.get_errno())}")
        memory.size = new_size
        return 0
    except BaseException as exc:  # noqa: BLE001 - a ctypes callback must never raise
        return _error(f"mighty: memory grow failed: {exc!r}")


def _free_memory(env: int | None) -> None:
    with _MEMORIES_LOCK:
        memory = _MEMORIES.pop(env or 0, None)
        try:
            kept = memory is not None and _keep_for_reuse(memory)
        except Exception:  # noqa: BLE001 - a callback of wasmtime's: unmapped, as before
            kept = False
    if memory is not None:
        memory.account._release(memory.size)
        if not kept:
            _libc.munmap(memory.base, memory.mapped)


# -- recycled memories ------------------------------------------------------------------------
#
# A memory made from a state (a pool's warmed interpreter, an agent type's warmed state) or
# fresh from an image is, when its store is freed, kept mapped for the next memory made from
# that same state or image: that one takes the mapping and has the bytes copied back over the
# pages the last guest wrote (the page map says which; every other page still holds the state
# or image, see rewind_memory), instead of a new mapping. Its pages stay private, so its first
# calls take none of the copy-on-write faults a fresh mapping takes (~530-690 for the
# interpreter, ~1.3 ms of a ~3.7 ms instance here), and no munmap or mmap is made. The instance
# is new (tables, globals, handles): only the linear memory is reused, and it holds the state or
# image byte for byte (tests/engine/test_rewind.py).
#
# Bounds: at most _REUSE_PER_STATE mappings per state or image and _REUSE_MAX in all, each with
# at most _REUSE_MAX_OWN pages of its own (a guest that touched more gives its memory back to
# the kernel: what a kept mapping holds is resident) and _REUSE_MAX_TOTAL in all (past either
# total the mapping kept longest ago is unmapped, so unused sources make room); a source's
# mappings are unmapped when it is freed. A memory that grew is kept with what it grew into
# reserved again (its pages dropped); one made with neither (wasmtime copied its data in) is
# unmapped as before. MIGHTY_NO_MEMORY_REUSE=1 turns it off (for comparisons).

_REUSE_PER_STATE = 4
_REUSE_MAX = 32
_REUSE_MAX_OWN = 4096  # pages: 16 MiB
_REUSE_MAX_TOTAL = 16384  # pages: 64 MiB resident in all kept mappings
_Kept = tuple[int, int, int, int, bytes]
_REUSED: dict[int, list[_Kept]] = {}
"""id(state or image) -> the kept mappings made from it: ``(base, mapped, reserved, own pages,
page map)`` (the page map read when it was freed: nothing writes a kept mapping, so it still
holds), under ``_MEMORIES_LOCK``. An entry exists only while its source lives
(``_watch_reuse``)."""
_REUSE_WATCHED: set[int] = set()
_REUSE_ORDER: collections.deque[tuple[int, _Kept]] = collections.deque()
"""Every kept mapping as ``(id(source), entry)``, oldest first: past a global bound the oldest
is unmapped, so mappings of states or images no longer used make room for those in use."""
_reuse_count = 0
_reuse_pages = 0
_reuse_enabled = os.environ.get("MIGHTY_NO_MEMORY_REUSE", "") in ("", "0")


_Source = MemoryState | MemoryImage
"""What a memory was made from, for reuse: a state, or (made fresh) its image."""


def _source_size(source: _Source) -> int:
    return source.size if isinstance(source, MemoryState) else source.minimum


def _watch_reuse(source: _Source) -> None:
    """Make ``source`` able to have mappings kept for it: when it is freed, they are unmapped."""
    key = id(source)
    _pagemap_fd()  # open now: a free reads it without its lock (see _keep_for_reuse)
    with _MEMORIES_LOCK:
        if key in _REUSE_WATCHED:
            return
        _REUSE_WATCHED.add(key)
        _REUSED[key] = []
    weakref.finalize(source, _drop_reused, key).atexit = False


def _drop_reused(key: int) -> None:
    global _reuse_count, _reuse_pages  # noqa: PLW0603 - the module's counts of kept mappings
    with _MEMORIES_LOCK:
        _REUSE_WATCHED.discard(key)
        kept = _REUSED.pop(key, [])
        _reuse_count -= len(kept)
        _reuse_pages -= sum(entry[3] for entry in kept)
        for entry in kept:
            _REUSE_ORDER.remove((key, entry))
    for entry in kept:
        _libc.munmap(entry[0], entry[1])


def _keep_for_reuse(memory: _Memory) -> bool:
    """(Under the lock, from ``_free_memory``) keep ``memory``'s mapping for the next memory
    made from what it holds besides its own pages (its state, else its image), if it may be:
    no Python allocation that could start a collection before the decision is made (the lists
    exist, see ``_watch_reuse``)."""
    global _reuse_count, _reuse_pages  # noqa: PLW0603
    source: _Source | None = memory.state if memory.state is not None else memory.image
    if not _reuse_enabled or source is None:
        return False
    size = _source_size(source)
    kept = _REUSED.get(id(source))
    if kept is None or len(kept) >= _REUSE_PER_STATE:
        return False
    if memory.size < size:
        return False
    if memory.size > size:
        # The guest grew it: what it grew into becomes reserved again, its pages dropped.
        start, extra = memory.base + size, memory.size - size
        flags = _MAP_PRIVATE | _MAP_ANONYMOUS | _MAP_FIXED | _MAP_NORESERVE
        if _libc.mmap(start, extra, _PROT_NONE, flags, -1, 0) != start:
            return False
    # The page map's descriptor as it is (no lock: this may run inside a collection that
    # started while _pagemap_fd held its lock); not opened yet in this process: not kept.
    pid, fd = _PAGEMAP
    if pid != os.getpid() or fd < 0:
        return False
    pages = size // _HOST_PAGE
    try:
        raw = os.pread(fd, pages * 8, memory.base // _HOST_PAGE * 8)
    except OSError:
        return False
    own = _own_pages(raw) if len(raw) == pages * 8 else _REUSE_MAX_OWN + 1
    if own > _REUSE_MAX_OWN:
        return False
    # Room first (the mappings kept longest ago go), then this one: if anything here fails,
    # nothing of this memory is recorded yet and the caller unmaps it.
    while (_reuse_count >= _REUSE_MAX or _reuse_pages + own > _REUSE_MAX_TOTAL) and _REUSE_ORDER:
        key, oldest = _REUSE_ORDER.popleft()
        _REUSED[key].remove(oldest)
        _reuse_count -= 1
        _reuse_pages -= oldest[3]
        _libc.munmap(oldest[0], oldest[1])
    if _reuse_count >= _REUSE_MAX or _reuse_pages + own > _REUSE_MAX_TOTAL:
        return False
    entry = (memory.base, memory.mapped, memory.reserved, own, raw)
    order = (id(source), entry)
    kept.append(entry)
    _REUSE_ORDER.append(order)
    _reuse_count += 1
    _reuse_pages += own
    return True


def _own_pages(raw: bytes) -> int:
    """How many pages a page map's entries show as the memory's own."""
    return len(raw) // 8 - raw[7::8].translate(_OWN).count(0)


def _reuse(source: _Source, mapped: int, reserved: int) -> int | None:
    """A kept mapping made from ``source`` with this layout, made to hold it byte for byte
    again; None when there is none (or it cannot be made exact: then it is unmapped)."""
    global _reuse_count, _reuse_pages  # noqa: PLW0603
    with _MEMORIES_LOCK:
        kept = _REUSED.get(id(source))
        found = None
        for index, entry in enumerate(kept or ()):
            if entry[1] == mapped and entry[2] == reserved:
                found = entry
                del kept[index]  # type: ignore[union-attr]
                _REUSE_ORDER.remove((id(source), entry))
                _reuse_count -= 1
                _reuse_pages -= entry[3]
                break
    if found is None:
        return None
    base, raw = found[0], found[4]
    reference = (
        _state_view(source) if isinstance(source, MemoryState) else _image_whole_view(source)
    )
    if not reference:
        _libc.munmap(base, mapped)
        return None
    _copy_back(base, reference, raw, bytes(len(raw) // 8))
    return base


def _image_whole_view(image: MemoryImage) -> int:
    """A read-only mapping of a memory fresh from ``image``: the image, then zeros up to its
    minimum size (kept while the image lives); 0 if it cannot be mapped."""
    with _IMAGE_VIEWS_LOCK:
        address = _WHOLE_VIEWS.get(id(image))
        if address is not None:
            return address
        address = _read_only_view(image.minimum, lambda at: _map_image(at, image.minimum, image))
        if not address:
            return 0
        _WHOLE_VIEWS[id(image)] = address
        unmap = weakref.finalize(image, _unmap_whole_view, id(image), address, image.minimum)
        unmap.atexit = False  # as for the image's own view: a daemon thread may still read it
        return address


_WHOLE_VIEWS: dict[int, int] = {}


def _unmap_whole_view(key: int, address: int, length: int) -> None:
    with _IMAGE_VIEWS_LOCK:
        _WHOLE_VIEWS.pop(key, None)
    _libc.munmap(address, length)


def _new_memory(
    _env: int | None,
    _memory_type: Any,
    minimum: int,
    maximum: int,
    reserved: int,
    guard: int,
    out: Any,
) -> int:
    try:
        account: MemoryAccount = getattr(_LOCAL, "account", None) or _UNBOUNDED
        images: list[MemoryImage] | None = getattr(_LOCAL, "images", None)
        image = images.pop(0) if images else None
        states: list[MemoryState] | None = getattr(_LOCAL, "states", None)
        state = states.pop(0) if states else None
        if image is not None and (
            image.minimum != minimum or (image.maximum is not None and image.maximum != maximum)
        ):
            # The component's memories are not created in the order the images were cut in:
            # never guess which contents a memory should start with.
            return _error(
                f"mighty: memory image of {image.minimum} bytes offered to a memory of {minimum}"
            )
        if state is not None and (
            state.image is not image or not minimum <= state.size <= min(maximum, _WASM32_MAX)
        ):
            return _error("mighty: a memory state of another memory was offered to this one")
        size = minimum if state is None else state.size
        # A static reservation lets the memory grow in place: wasmtime never has to move it.
        reservation = reserved or min(maximum, _WASM32_MAX)
        reservation = max(reservation, size)
        mapped = reservation + guard
        reused = None
        source: _Source | None = state if state is not None else image
        if source is not None and _reuse_enabled:
            try:
                _watch_reuse(source)
                reused = _reuse(source, mapped, reservation)
            except Exception:  # noqa: BLE001 - never seen; a new mapping then, as before
                reused = None
        base = (
            reused
            if reused is not None
            else _libc.mmap(
                None, mapped, _PROT_NONE, _MAP_PRIVATE | _MAP_ANONYMOUS | _MAP_NORESERVE, -1, 0
            )
        )
        if base is None or base == _MAP_FAILED:
            return _error(
                f"mighty: cannot reserve linear memory: {os.strerror(ctypes.get_errno())}"
            )
        if not account._charge(size):
            _libc.munmap(base, mapped)
            return _error("mighty: memory limit exceeded")
        if reused is not None:
            mapped_ok = True  # it holds its state or image already (_reuse)
        elif state is not None:
            mapped_ok = _map_state(base, state)
        elif image is not None:
            mapped_ok = _map_image(base, minimum, image)
            if mapped_ok and image.hot and getattr(_LOCAL, "prefault", False):
                _prefault(base, image)
        else:
            mapped_ok = _map_zeroed(base, minimum)
        if not mapped_ok:
            err = ctypes.get_errno() or errno.ENOMEM
            account._release(size)
            _libc.munmap(base, mapped)
            return _error(f"mighty: cannot map linear memory: {os.strerror(err)}")
        key = next(_NEXT_ID)
        made = _Memory(  # made outside the lock: an allocation may start a collection
            base=base,
            size=size,
            reserved=reservation,
            mapped=mapped,
            maximum=min(maximum, reservation),
            account=account,
            image=image,
            state=state,
            frozen=[weakref.ref(state)] if state is not None else [],
        )
        with _MEMORIES_LOCK:
            _MEMORIES[key] = made
        result = out[0]
        result.env = key
        result.get_memory = _C_GET_MEMORY
        result.grow_memory = _C_GROW_MEMORY
        result.finalizer = _C_FREE_MEMORY
        return 0
    except BaseException as exc:  # noqa: BLE001 - a ctypes callback must never raise
        return _error(f"mighty: cannot create linear memory: {exc!r}")


def _map_image(base: int, minimum: int, image: MemoryImage) -> bool:
    """The image copy-on-write over its first pages, zero pages after it: nothing is copied and
    nothing is faulted in until the guest touches it."""
    if image.length and (
        _mmap_holding_gil(
            base, image.length, _PROT_READ_WRITE, _MAP_PRIVATE | _MAP_FIXED, image.fd, 0
        )
        != base
    ):
        return False
    rest = minimum - image.length
    return rest <= 0 or _mprotect_holding_gil(base + image.length, rest, _PROT_READ_WRITE) == 0


def _map_state(base: int, state: MemoryState) -> bool:
    """The state's image and changed pages copy-on-write, zero pages elsewhere up to its size:
    as for an image, nothing is copied until the guest writes."""
    if state.image is not None:
        if not _map_image(base, state.size, state.image):
            return False
    elif state.size and _mprotect_holding_gil(base, state.size, _PROT_READ_WRITE) != 0:
        return False
    return _map_ranges(base, state.mapping)


def _map_ranges(base: int, mapping: Sequence[tuple[int, int, int, int]]) -> bool:
    """``(memory offset, length, fd, offset in fd)`` ranges copy-on-write at ``base``."""
    flags = _MAP_PRIVATE | _MAP_FIXED
    if _compiled():  # every range with the GIL released once
        packed = array.array("q", [part for one in mapping for part in one]).tobytes()
        try:
            _pages.map_ranges(base, packed, _PROT_READ_WRITE, flags)
        except OSError as exc:
            ctypes.set_errno(exc.errno or errno.EINVAL)
            return False
        return True
    # The pure-Python path (and the compiled one's oracle): holding the GIL throughout.
    for offset, length, fd, at in mapping:
        where = base + offset
        if _mmap_holding_gil(where, length, _PROT_READ_WRITE, flags, fd, at) != where:
            return False
    return True


_MADV_POPULATE_WRITE = 23  # Linux 5.14+
_PAGEMAP_PRESENT = 1 << 63
_PAGEMAP_FILE_OR_SHARED = 1 << 61
_HOST_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_populate_works = True


def _prefault(base: int, image: MemoryImage) -> None:
    """Take private copies of the image's hot pages now: one call per range instead of one
    copy-on-write fault per page during the guest's first run (a fault costs ~2.7 us on this
    VM). The contents do not change (it is as if each page were written with what it holds);
    only the time the copies are made does."""
    global _populate_works  # noqa: PLW0603 - learned once: the kernel has it or not
    if not _populate_works:
        return
    for offset, length in image.hot:
        if _libc.madvise(base + offset, length, _MADV_POPULATE_WRITE) != 0:
            _populate_works = False  # an older kernel: the faults happen as they would anyway
            return


def learn_hot_pages(account: MemoryAccount, *, max_ranges: int = 4096) -> int:
    """Remember which image pages the memories charged to ``account`` have written (their
    private copies), on their images, for later instances made with ``prefault``. Learned once
    per image; returns how many pages it found (0 when already known or not readable)."""
    with _MEMORIES_LOCK:
        table = list(_MEMORIES.values())
    memories = [m for m in table if m.account is account and m.image is not None]
    found = 0
    for memory in memories:
        image = memory.image
        assert image is not None
        if image.hot:
            continue
        pages = memory.size // _HOST_PAGE
        try:
            with open("/proc/self/pagemap", "rb") as pagemap:
                pagemap.seek(memory.base // _HOST_PAGE * 8)
                raw = pagemap.read(pages * 8)
        except OSError:
            return 0
        ranges: list[tuple[int, int]] = []
        start = -1
        for index, (entry,) in enumerate(struct.iter_unpack("<Q", raw)):
            private = entry & _PAGEMAP_PRESENT and not entry & _PAGEMAP_FILE_OR_SHARED
            if private:
                found += 1
                if start < 0:
                    start = index
            elif start >= 0:
                ranges.append((start * _HOST_PAGE, (index - start) * _HOST_PAGE))
                start = -1
        if start >= 0:
            ranges.append((start * _HOST_PAGE, (pages - start) * _HOST_PAGE))
        image.hot[:] = ranges[:max_ranges]  # one step: a concurrent reader sees none or all
    return found


def capture_memory(
    account: MemoryAccount, *, gap: int = MAX_GAP, layered: bool = True
) -> MemoryState:
    """Freeze the one linear memory charged to ``account`` (a store's): its image, and a sealed
    copy of the pages that differ from it (ranges at most ``gap`` bytes apart copied as one;
    0 for exactly the changed pages). The store must not be running a call.

    With ``layered``, when the memory last held a state whole that still lives (it was made,
    restored or captured from it since it was last mapped: ``_Memory.frozen``; the newest of
    them that lives) and that state may take another layer
    (``_state.layerable``), the new state is a layer over it: only the memory's own pages that
    differ from it are copied. Which pages can differ: only the memory's own (written since it
    was mapped; the page map says which), since every other page still holds what the mapping
    gave it, which is what that state held there. ``layered=False`` (a snapshot's exact pages)
    always freezes whole.
    """
    memory = _only_memory(account)
    previous = _newest(memory.frozen) if layered else None
    state = None
    if (
        previous is not None
        and previous.size == memory.size
        and previous.image is memory.image
        and layerable(previous)
    ):
        changed = _changed_since(memory, previous)
        if changed is not None:
            if not changed:
                return previous  # nothing written differs: the memory holds it still
            layer_gap = min(gap, _LAYER_GAP)
            state = freeze(
                memory.base, memory.size, memory.image, changed, gap=layer_gap, base=previous
            )
    if state is None:
        state = freeze(memory.base, memory.size, memory.image, _changed_ranges(memory), gap=gap)
    memory.frozen = [ref for ref in memory.frozen if ref() is not None][-_FROZEN + 1 :]
    memory.frozen.append(weakref.ref(state))
    return state


def _only_memory(account: MemoryAccount) -> _Memory:
    """The one linear memory charged to ``account`` (a store's); BadInput if not exactly one."""
    with _MEMORIES_LOCK:
        table = list(_MEMORIES.values())
    memories = [m for m in table if m.account is account]
    if len(memories) != 1:
        raise BadInput(f"expected one linear memory in the store, found {len(memories)}")
    return memories[0]


_FROZEN = 4
_LAYER_GAP = 2 * _HOST_PAGE
"""Clean pages copied between a layer's changed ranges (at most; ``MAX_GAP`` for a whole
state): a layer's pages are few and scattered, and every range it adds is cut out of its
base's when mapped, so a chain's mappings grow with each layer. Measured on forks after small
runs: 2 pages copied ~0.6 MB a layer where 8 copied ~1.3 MB, for ~250 mappings at depth 4
instead of ~190 (0: ~310, no faster)."""


def _newest(states: list[weakref.ref[MemoryState]]) -> MemoryState | None:
    """The newest of ``states`` that still lives."""
    for ref in reversed(states):
        state = ref()
        if state is not None:
            return state
    return None


def _changed_since(memory: _Memory, previous: MemoryState) -> list[tuple[int, int]] | None:
    """Page ranges where ``memory`` differs from ``previous`` (the state it last held whole,
    see ``capture_memory``): its own pages, each compared with ``previous``; None when the
    page map or a view of ``previous`` cannot be had."""
    pages = memory.size // _HOST_PAGE
    raw = _read_pagemap(memory.base, pages)
    pieces = _pieces(previous)
    image = previous.image
    reference = _image_address(image) if image is not None else 0
    if raw is None or pieces is None or (image is not None and not reference):
        return None
    image_pages = image.length // _HOST_PAGE if image is not None else 0
    changed = bytearray(raw[7::8].translate(_OWN))
    if _compiled():
        _pages.drop_same_at(memory.base, reference, changed, _HOST_PAGE, image_pages, pieces)
    else:
        _drop_same_at(memory.base, reference, changed, image_pages, pieces)
    return [
        (match.start() * _HOST_PAGE, (match.end() - match.start()) * _HOST_PAGE)
        for match in re.finditer(rb"\x01+", changed)
    ]


def _pieces(state: MemoryState) -> bytes | None:
    """Where ``state`` holds the bytes of each range it maps: native 64-bit triples (first
    page, pages, address) into a read-only view of the memfd of the layer that holds it, in
    ``mapping``'s order (other pages are the image's or zeros); None when a view cannot be
    mapped. The views stay mapped while their state lives, so a page compared once is not
    faulted in again for the next layer (a view made per state, ``_state_view``, faulted in
    every page compared: ~0.8 ms a fork)."""
    views: dict[int, int] = {}
    layer: MemoryState | None = state
    while layer is not None:
        if layer.ranges:
            address = _layer_view(layer)
            if not address:
                return None
            views[layer.fd] = address
        layer = layer.base
    triples: list[int] = []
    for offset, length, fd, at in state.mapping:
        triples += (offset // _HOST_PAGE, length // _HOST_PAGE, views[fd] + at)
    return array.array("Q", triples).tobytes()


_LAYER_VIEWS: dict[int, int] = {}


def _layer_view(state: MemoryState) -> int:
    """A read-only view of ``state``'s own memfd (whole, populated), kept while the state
    lives; 0 if it cannot be mapped."""
    with _VIEWS_LOCK:
        address = _LAYER_VIEWS.get(id(state))
        if address is not None:
            return address
        length = sum(size for _offset, size, _at in state.ranges)
        mapped = _libc.mmap(None, length, _PROT_READ, _MAP_SHARED | _MAP_POPULATE, state.fd, 0)
        if mapped is None or mapped == _MAP_FAILED:
            return 0
        address = int(mapped)
        _LAYER_VIEWS[id(state)] = address
        unmap = weakref.finalize(state, _unmap_layer_view, id(state), address, length)
        unmap.atexit = False  # as for image views
        return address


def _unmap_layer_view(key: int, address: int, length: int) -> None:
    with _VIEWS_LOCK:
        _LAYER_VIEWS.pop(key, None)
    _libc.munmap(address, length)


def _drop_same_at(
    base: int, reference: int, changed: bytearray, image_pages: int, pieces: bytes
) -> None:
    """Unmark the pages that hold the previous state's bytes (see ``_pieces``): the
    pure-Python path of ``_pages.drop_same_at`` and its oracle."""
    source = [0] * len(changed)  # 0: the image's (below image_pages) or zeros
    triples = array.array("Q", pieces)
    for first, count, address in zip(triples[0::3], triples[1::3], triples[2::3], strict=True):
        source[first : first + count] = range(address, address + count * _HOST_PAGE, _HOST_PAGE)
    for match in re.finditer(rb"\x01+", changed):
        for index in range(match.start(), match.end()):
            at = index * _HOST_PAGE
            if source[index]:
                same = not _libc.memcmp(base + at, source[index], _HOST_PAGE)
            elif index < image_pages:
                same = bool(reference) and not _libc.memcmp(base + at, reference + at, _HOST_PAGE)
            else:
                same = not _libc.memcmp(base + at, _ZERO_PAGE_ADDRESS, _HOST_PAGE)
            if same:
                changed[index] = 0


def _read_pagemap(base: int, pages: int) -> bytes | None:
    """The page map's 8-byte entries of ``pages`` pages from ``base``, or None."""
    fd = _pagemap_fd()
    if fd < 0:
        return None
    try:
        raw = os.pread(fd, pages * 8, base // _HOST_PAGE * 8)
    except OSError:
        return None
    return raw if len(raw) == pages * 8 else None


_PAGEMAP: list[int] = [-1, -1]
"""``[pid, fd]`` of this process's open page map (opening it took ~0.1-0.5 ms a capture)."""
_PAGEMAP_LOCK = threading.Lock()


def _pagemap_fd() -> int:
    """This process's ``/proc/self/pagemap``, opened once per process (a child made by
    ``os.fork`` opens its own: the parent's descriptor names the parent's map); -1 if it
    cannot be opened."""
    pid = os.getpid()
    with _PAGEMAP_LOCK:
        if _PAGEMAP[0] != pid:
            try:
                fd = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return -1
            # The parent's descriptor, inherited by a forked child, is the parent's to close.
            _PAGEMAP[:] = [pid, fd]
        return _PAGEMAP[1]


def restore_memory(account: MemoryAccount, state: MemoryState) -> None:
    """Make the one linear memory charged to ``account`` hold ``state`` (copy-on-write), in
    place. Its size must already be the state's: wasmtime's view of the size cannot change
    from here. The store must not be running a call."""
    memory = _only_memory(account)
    if memory.size != state.size or memory.image is not state.image:
        raise BadInput(
            f"a memory state of {state.size} bytes cannot replace a memory of {memory.size}"
        )
    if (
        state.base is not None
        and state.base is memory.state
        and (memory.mapped_at == account.calls or _none_own(memory))
        and _read_layer(memory.base, memory.size, state)
    ):
        # The memory holds ``state``'s base (mapped, and no call since, or nothing written
        # since: its pages copied in by ``populate_memory`` are its own but hold the same
        # bytes): the layer's own pages are read into it, in place (a spare mapped ahead
        # for the previous state of a session). Its other pages hold the base's bytes, which
        # are the state's there.
        memory.state = state
        memory.frozen = [weakref.ref(state)]
        memory.mapped_at = account.calls
        return
    image_length = state.image.length if state.image is not None else 0
    rest = state.size - image_length
    flags = _MAP_PRIVATE | _MAP_ANONYMOUS | _MAP_FIXED | _MAP_NORESERVE
    # Fresh zero pages past the image, then the image and the changed pages over them.
    if rest > 0 and (
        _mmap_holding_gil(memory.base + image_length, rest, _PROT_READ_WRITE, flags, -1, 0)
        != memory.base + image_length
    ):
        raise OSError(ctypes.get_errno(), "mighty: cannot remap linear memory")
    memory.frozen = []  # until the whole state is mapped
    memory.mapped_at = -1
    if not _map_state(memory.base, state):
        raise OSError(ctypes.get_errno(), "mighty: cannot remap linear memory")
    memory.state = state
    memory.frozen = [weakref.ref(state)]
    memory.mapped_at = account.calls


def populate_memory(account: MemoryAccount, ranges: Sequence[tuple[int, int]]) -> None:
    """Take the private copies of ``(offset, length)`` ranges of the one linear memory charged
    to ``account`` now, on this thread (``MADV_POPULATE_WRITE``), instead of one copy-on-write
    fault per page when the guest next writes them: for a memory readied ahead of its use (a
    sandbox's spare, after ``restore_memory``). The contents do not change. Measured on a
    session's fork whose spare was mapped ahead: its first run 2.6 ms with the state's pages
    populated against 7.1 ms without (~700 pages written, a fault with its copy ~5 us on this
    VM). The pages are then the memory's own: resident, and what ``rewind_memory`` and a later
    layered ``restore_memory`` count as written. Ranges are clipped to the memory; where the
    kernel cannot (before Linux 5.14) the faults happen as they would have. Between calls."""
    global _populate_works  # noqa: PLW0603 - learned once: the kernel has it or not
    memory = _only_memory(account)
    for offset, length in ranges:
        start = max(0, offset) // _HOST_PAGE * _HOST_PAGE
        end = min(memory.size, offset + length)
        if not _populate_works:
            return
        if end > start and _libc.madvise(memory.base + start, end - start, _MADV_POPULATE_WRITE):
            _populate_works = ctypes.get_errno() != errno.EINVAL


def _read_layer(base: int, size: int, state: MemoryState) -> bool:
    """Copy ``state``'s own ranges (a layer's pages) from its memfd into the memory at
    ``base``: the bytes mapping them would give, as the memory's own pages. False (the memory
    then partly written: the caller maps the whole state) if the memfd cannot be read.

    Rejected: mapping them (``MAP_FIXED`` per range, as before): over a spare whose pages were
    populated ahead, each ``mmap`` frees private pages and flushes the other CPU's TLB; ~85
    ranges took 3.2-4.2 ms on the 2-core VM (~40 us each) where reading them takes ~0.2 ms,
    and the pages are then the memory's own, with no copy-on-write fault in the next run."""
    if not state.ranges:
        return True
    whole = memoryview((ctypes.c_char * size).from_address(base)).cast("B")
    try:
        group: list[memoryview] = []
        start = expected = -1
        for offset, length, at in state.ranges:
            if at != expected and group:
                _preadv_all(state.fd, group, start)
                group = []
            if not group:
                start = at
            group.append(whole[offset : offset + length])
            expected = at + length
        _preadv_all(state.fd, group, start)
    except OSError:
        return False
    finally:
        whole.release()
    return True


def _preadv_all(fd: int, views: list[memoryview], at: int) -> None:
    """Fill ``views``, one after another, from ``fd`` at ``at`` (``_IOV_MAX`` views a call);
    OSError at the end of the file."""
    for first in range(0, len(views), _IOV_MAX):
        chunk = views[first : first + _IOV_MAX]
        total = sum(len(view) for view in chunk)
        done = os.preadv(fd, chunk, at)
        while done < total:  # a short read: the rest one view at a time
            skip = done
            for view in chunk:
                if skip >= len(view):
                    skip -= len(view)
                    continue
                got = os.preadv(fd, [view[skip:]], at + done)
                if got <= 0:
                    raise OSError(errno.EIO, "mighty: a memory state's memfd ended early")
                done += got
                break
        at += total


_IOV_MAX = 1024


def _none_own(memory: _Memory) -> bool:
    """Whether the page map shows no page of ``memory``'s own (nothing written since it was
    mapped); False when it cannot be read."""
    raw = _read_pagemap(memory.base, memory.size // _HOST_PAGE)
    return raw is not None and not raw[7::8].translate(_OWN).strip(b"\x00")


def rewind_memory(account: MemoryAccount, target: MemoryState) -> bool:
    """Make the one linear memory charged to ``account`` hold ``target`` again by copying
    ``target``'s bytes over every page the memory may have changed, in place: its private pages
    stay private (no copy-on-write fault when the guest writes them again, unlike
    :func:`restore_memory`, which maps the state anew). The memory must have been made from a
    state (``states=``) of the same image and size as ``target`` (``target`` is typically that
    state after one constant call, captured from another memory made from it). Returns False,
    changing nothing, when it cannot: another size (the guest grew its memory), another image,
    a memory not made from a state, or no readable page map. The store must not be running.

    Which pages are copied: every page the page map shows as the memory's own (present and not
    the file's, or swapped out): whatever the guest wrote is among them; and every page where
    ``target`` differs from the state the memory was made from (the others hold that state's
    bytes, read from its file, so they hold ``target``'s too). Nothing else can differ.
    """
    try:
        memory = _only_memory(account)
    except BadInput:
        return False
    made_from = memory.state
    if (
        made_from is None
        or memory.size != target.size
        or made_from.size != target.size
        or made_from.image is not target.image
    ):
        return False
    reference = _state_view(target)
    differing = _differing_pages(made_from, target)
    if not reference or differing is None:
        return False
    pages = memory.size // _HOST_PAGE
    raw = _read_pagemap(memory.base, pages)
    if raw is None:
        return False
    memory.frozen = []  # it holds ``target`` now, but only the pool rewinds: not needed
    memory.mapped_at = -1  # nor ``memory.state``
    _copy_back(memory.base, reference, raw, differing)
    return True


def _copy_back(base: int, reference: int, raw: bytes, differing: bytes) -> None:
    """Copy ``reference``'s bytes over every page the page map ``raw`` shows as the memory's
    own and every page marked in ``differing`` (one byte per page)."""
    if _compiled():
        _pages.copy_back(base, reference, raw, differing, _HOST_PAGE)
        return
    # The pure-Python path (and the compiled one's oracle): one copy per run of pages.
    pages = len(differing)
    own = raw[7::8].translate(_OWN)
    copy = (int.from_bytes(own, "big") | int.from_bytes(differing, "big")).to_bytes(pages, "big")
    for run in re.finditer(rb"\x01+", copy):
        offset = run.start() * _HOST_PAGE
        _memmove_holding_gil(
            base + offset, reference + offset, (run.end() - run.start()) * _HOST_PAGE
        )


_OWN = bytes(1 if (b & 0x80 and not b & 0x20) or b & 0x40 else 0 for b in range(256))
"""A page-map entry's top byte -> 1 for a page of the memory's own: present (bit 63) and not a
file page (bit 61), or swapped out (bit 62)."""
_STATE_VIEWS: dict[int, int] = {}
_DIFFERING: dict[tuple[int, int], bytes] = {}
_VIEWS_LOCK = threading.Lock()


def _read_only_view(size: int, lay_out: Callable[[int], bool]) -> int:
    """A new read-only mapping of ``size`` bytes whose contents ``lay_out(address)`` maps (as a
    memory made from them would hold); 0 if it cannot be made."""
    mapped = _libc.mmap(
        None, size, _PROT_NONE, _MAP_PRIVATE | _MAP_ANONYMOUS | _MAP_NORESERVE, -1, 0
    )
    if mapped is None or mapped == _MAP_FAILED:
        return 0
    address = int(mapped)
    if not lay_out(address) or _libc.mprotect(address, size, _PROT_READ):
        _libc.munmap(address, size)
        return 0
    return address


def _state_view(state: MemoryState) -> int:
    """A read-only mapping of ``state``'s whole memory (image, zeros, its pages), kept while
    the state lives, to copy pages from; 0 if it cannot be mapped."""
    with _VIEWS_LOCK:
        address = _STATE_VIEWS.get(id(state))
        if address is not None:
            return address
        address = _read_only_view(state.size, lambda at: _map_state(at, state))
        if not address:
            return 0
        _STATE_VIEWS[id(state)] = address
        unmap = weakref.finalize(state, _unmap_state_view, id(state), address, state.size)
        unmap.atexit = False  # as for image views: a daemon thread may still read it at exit
        return address


def _unmap_state_view(key: int, address: int, length: int) -> None:
    with _VIEWS_LOCK:
        _STATE_VIEWS.pop(key, None)
        for pair in [pair for pair in _DIFFERING if key in pair]:
            del _DIFFERING[pair]
    _libc.munmap(address, length)


def _differing_pages(first: MemoryState, second: MemoryState) -> bytes | None:
    """One byte per page, 1 where two states of one image and size differ (compared once per
    pair, then kept while both live); None if either cannot be mapped. Outside both states'
    ranges both hold the image or zeros, so only those are compared."""
    key = (id(first), id(second))
    with _VIEWS_LOCK:
        known = _DIFFERING.get(key)
    if known is not None:
        return known
    one, two = _state_view(first), _state_view(second)
    if not one or not two:
        return None
    candidates = bytearray(first.size // _HOST_PAGE)
    for offset, length, _fd, _at in (*first.mapping, *second.mapping):
        candidates[offset // _HOST_PAGE : (offset + length) // _HOST_PAGE] = b"\x01" * (
            length // _HOST_PAGE
        )
    mask = bytearray(len(candidates))
    for index in (i for i, flag in enumerate(candidates) if flag):
        at = index * _HOST_PAGE
        if _libc.memcmp(one + at, two + at, _HOST_PAGE):
            mask[index] = 1
    differing = bytes(mask)
    with _VIEWS_LOCK:
        # Forgotten with either state (its view's finalizer drops the pairs it is in).
        if id(first) in _STATE_VIEWS and id(second) in _STATE_VIEWS:
            _DIFFERING[key] = differing
    return differing


def _changed_ranges(memory: _Memory) -> list[tuple[int, int]]:
    """Page ranges that may differ from the image (or from zeros past it): the memory's own
    pages (written since mapped) and the ranges of the state the memory started from. All of
    it when the page map cannot be read."""
    pages = memory.size // _HOST_PAGE
    raw = _read_pagemap(memory.base, pages)
    if raw is None:
        return [(0, memory.size)] if memory.size else []
    image_pages = memory.image.length // _HOST_PAGE if memory.image is not None else 0
    # The memory's own pages (written since mapped, swapped out or not): see ``_OWN``.
    changed = bytearray(raw[7::8].translate(_OWN))
    if memory.state is not None:
        for offset, length, _fd, _at in memory.state.mapping:
            changed[offset // _HOST_PAGE : (offset + length) // _HOST_PAGE] = b"\x01" * (
                length // _HOST_PAGE
            )
    # A private page may still hold what the image does (pages copied up front by
    # ``prefault``, or written back unchanged): compare, and keep only pages that differ.
    reference = _image_address(memory.image) if memory.image is not None else 0
    if _compiled():
        _pages.drop_same(memory.base, reference, changed, _HOST_PAGE, image_pages)
    else:
        _drop_same(memory.base, reference, changed, image_pages)
    return [
        (match.start() * _HOST_PAGE, (match.end() - match.start()) * _HOST_PAGE)
        for match in re.finditer(rb"\x01+", changed)
    ]


def _drop_same(base: int, reference: int, changed: bytearray, image_pages: int) -> None:
    """Unmark the pages that hold the image's bytes (or zeros past it): the pure-Python path
    of ``_pages.drop_same`` and its oracle (tests/engine/test_rewind.py)."""
    for match in re.finditer(rb"\x01+", changed):
        for index in range(match.start(), match.end()):
            offset = index * _HOST_PAGE
            if index < image_pages:
                same = reference and not _libc.memcmp(base + offset, reference + offset, _HOST_PAGE)
            else:
                same = not _libc.memcmp(base + offset, _ZERO_PAGE_ADDRESS, _HOST_PAGE)
            if same:
                changed[index] = 0


_ZERO_PAGE = ctypes.create_string_buffer(_HOST_PAGE)
_ZERO_PAGE_ADDRESS = ctypes.addressof(_ZERO_PAGE)
_IMAGE_VIEWS: dict[int, int] = {}
_IMAGE_VIEWS_LOCK = threading.Lock()


def _image_address(image: MemoryImage) -> int:
    """A read-only mapping of ``image`` (kept for the process: images live as long as their
    component, and there are few), to compare pages with; 0 if it cannot be mapped."""
    with _IMAGE_VIEWS_LOCK:
        address = _IMAGE_VIEWS.get(id(image))
        if address is None:
            mapped = _libc.mmap(None, image.length, _PROT_READ, _MAP_SHARED, image.fd, 0)
            address = 0 if mapped is None or mapped == _MAP_FAILED else int(mapped)
            if address:
                _IMAGE_VIEWS[id(image)] = address
                unmap = weakref.finalize(image, _unmap_view, id(image), address, image.length)
                # Not at exit: a daemon thread still comparing pages with the view (a sandbox
                # pool's filler) would read unmapped memory (a SIGSEGV of `mty sandbox serve`
                # at its exit, 1 in 3 here); the process's own end unmaps it.
                unmap.atexit = False
        return address


def _unmap_view(key: int, address: int, length: int) -> None:
    with _IMAGE_VIEWS_LOCK:
        _IMAGE_VIEWS.pop(key, None)
    _libc.munmap(address, length)


def _map_zeroed(base: int, minimum: int) -> bool:
    """Zeroed pages for a memory whose data segments wasmtime copies in itself.

    The pages are about to be written, so MAP_POPULATE faults them in one kernel call instead of
    one trap per 4 KiB page. Rejected: MADV_HUGEPAGE (2x faster for one instance, but with
    defrag=madvise the kernel compacts memory on faults, and instantiation slowed to 100+ ms once
    dozens of instances were alive).
    """
    if not minimum:
        return True
    flags = _MAP_PRIVATE | _MAP_ANONYMOUS | _MAP_FIXED | _MAP_POPULATE
    return bool(_libc.mmap(base, minimum, _PROT_READ_WRITE, flags, -1, 0) == base)


def _creator_finalizer(_env: int | None) -> None:
    return None


# The C function pointers must live as long as the process: wasmtime keeps calling them.
_FINALIZER_T = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_C_GET_MEMORY = immortal(ffi.wasmtime_memory_get_callback_t(_get_memory))
_C_GROW_MEMORY = immortal(ffi.wasmtime_memory_grow_callback_t(_grow_memory))
_C_FREE_MEMORY = immortal(_FINALIZER_T(_free_memory))
_C_NEW_MEMORY = immortal(ffi.wasmtime_new_memory_callback_t(_new_memory))
_C_CREATOR_FINALIZER = immortal(_FINALIZER_T(_creator_finalizer))
_CREATOR: Any = ffi.wasmtime_memory_creator_t()
_CREATOR.env = None
_CREATOR.new_memory = _C_NEW_MEMORY
_CREATOR.finalizer = _C_CREATOR_FINALIZER


def install_memory_creator(config_ptr: Any) -> None:
    """Make every linear memory of engines built from this config go through this module."""
    # Copy-on-write images only work with wasmtime's own mmap allocator (it panics otherwise).
    ffi.wasmtime_config_memory_init_cow_set(config_ptr, False)
    ffi.wasmtime_config_host_memory_creator_set(config_ptr, ctypes.byref(_CREATOR))


def live_memories() -> int:
    """How many guest linear memories exist right now (for leak tests)."""
    with _MEMORIES_LOCK:
        return len(_MEMORIES)
