"""Which pages of a linear memory the guest wrote since a moment: the kernel keeps count.

A session that forks after each run freezes a layer of the pages that changed since its last
freeze (``_memory.capture_memory``). Without help, which pages may have changed is every page
of the memory's own (written at any time since it was mapped: ~700 for a small session, of
which one run writes ~240 and ~130 then differ), each compared with the last state. With
userfaultfd's *asynchronous* write protection (``UFFD_FEATURE_WP_ASYNC``, Linux 6.7), a range
is write-protected once; the first write to each page clears its protection in the kernel's
fault path (no handler thread, no signal: the guest never sees it), and ``PAGEMAP_SCAN`` on
``/proc/self/pagemap`` lists the pages written since and protects them again in one call. So
a freeze compares only the pages the last run wrote.

What it costs: one minor fault on the first write to each page after a freeze (~240 for a
small run), paid by the next run, and only by memories that asked for it (a session's forks,
``capture_memory(track=True)``); nothing else is registered.

Where it is not available (an older kernel, a seccomp filter that refuses ``userfaultfd``, or
``MIGHTY_WRITE_TRACKING=0``), every function here says so (False or None) and the caller
compares every own page, as before: slower, never wrong. The first use in a process checks the
whole path on a probe mapping (a write must show, a scan must clear it) before trusting it.

Only user-mode faults are asked for (``UFFD_USER_MODE_ONLY``), which needs no privilege; the
asynchronous mode resolves a write from the kernel (a ``read()`` into guest memory) the same way
without ever waking a handler, and the probe checks that too.

Rejected: soft-dirty bits (``/proc/self/clear_refs`` clears them for the whole process: every
other session's record and the host's own heap would fault again); synchronous write protection
with a handler thread (a context switch per first write); remapping the memory onto each frozen
state (its next run takes a copy-on-write fault per page it writes, and copies it: the work
moves onto the run instead of going away).
"""

from __future__ import annotations

import ctypes
import os
import threading

__all__: list[str] = []

_HOST_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

_SYS_USERFAULTFD = {"x86_64": 323, "aarch64": 282}.get(os.uname().machine, -1)
_UFFD_USER_MODE_ONLY = 1
_UFFD_API = 0xAA
_FEATURE_WP_HUGETLBFS_SHMEM = 1 << 12
_FEATURE_WP_UNPOPULATED = 1 << 13
_FEATURE_WP_ASYNC = 1 << 15
_FEATURES = _FEATURE_WP_HUGETLBFS_SHMEM | _FEATURE_WP_UNPOPULATED | _FEATURE_WP_ASYNC
_REGISTER_MODE_WP = 1 << 1
_WRITEPROTECT_MODE_WP = 1 << 0
_PM_SCAN_WP_MATCHING = 1 << 0
_PM_SCAN_CHECK_WPASYNC = 1 << 1
_PAGE_IS_WRITTEN = 1 << 1


def _iowr(kind: int, number: int, size: int) -> int:
    return (3 << 30) | (size << 16) | (kind << 8) | number


def _u64s(*names: str) -> list[tuple[str, type[ctypes.c_uint64]]]:
    return [(name, ctypes.c_uint64) for name in names]


class _Api(ctypes.Structure):
    _fields_ = _u64s("api", "features", "ioctls")


class _Register(ctypes.Structure):
    _fields_ = _u64s("start", "len", "mode", "ioctls")


class _WriteProtect(ctypes.Structure):
    _fields_ = _u64s("start", "len", "mode")


class _ScanArg(ctypes.Structure):
    """``struct pm_scan_arg`` (linux/fs.h)."""

    _fields_ = _u64s(
        "size",
        "flags",
        "start",
        "end",
        "walk_end",
        "vec",
        "vec_len",
        "max_pages",
        "category_inverted",
        "category_mask",
        "category_anyof_mask",
        "return_mask",
    )


class _Region(ctypes.Structure):
    _fields_ = _u64s("start", "end", "categories")


_UFFDIO_API = _iowr(_UFFD_API, 0x3F, ctypes.sizeof(_Api))
_UFFDIO_REGISTER = _iowr(_UFFD_API, 0x00, ctypes.sizeof(_Register))
_UFFDIO_WRITEPROTECT = _iowr(_UFFD_API, 0x06, ctypes.sizeof(_WriteProtect))
_PAGEMAP_SCAN = _iowr(ord("f"), 16, ctypes.sizeof(_ScanArg))
_VEC_LEN = 512
"""Regions a scan returns per call (a run of a small session writes ~200); more take more calls."""

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_ioctl = _libc.ioctl
_ioctl.restype = ctypes.c_int
_ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
_mmap = _libc.mmap
_mmap.restype = ctypes.c_void_p
_mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_munmap = _libc.munmap
_munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_read = _libc.read
_read.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
_read.restype = ctypes.c_ssize_t


class _Tracker:
    """This process's userfaultfd (one for every registered range) and its page map."""

    __slots__ = ("fd", "pagemap", "pid")

    def __init__(self, fd: int, pagemap: int) -> None:
        self.fd = fd
        self.pagemap = pagemap
        self.pid = os.getpid()

    def register(self, base: int, length: int) -> bool:
        """Watch ``[base, base + length)`` from now on, every page protected (idempotent)."""
        register = _Register(base, length, _REGISTER_MODE_WP, 0)
        if _ioctl(self.fd, _UFFDIO_REGISTER, ctypes.byref(register)) != 0:
            return False
        protect = _WriteProtect(base, length, _WRITEPROTECT_MODE_WP)
        return bool(_ioctl(self.fd, _UFFDIO_WRITEPROTECT, ctypes.byref(protect)) == 0)

    def written(self, base: int, length: int, *, reset: bool) -> list[tuple[int, int]] | None:
        """The ranges ``(offset from base, length)`` written since the range was last
        protected, protecting them again with ``reset``; None if it cannot be read (some of the
        range is not registered: remapped since, say)."""
        vec = (_Region * _VEC_LEN)()
        flags = _PM_SCAN_CHECK_WPASYNC | (_PM_SCAN_WP_MATCHING if reset else 0)
        out: list[tuple[int, int]] = []
        start, end = base, base + length
        while start < end:
            arg = _ScanArg(
                ctypes.sizeof(_ScanArg),
                flags,
                start,
                end,
                0,
                ctypes.addressof(vec),
                _VEC_LEN,
                0,
                0,
                _PAGE_IS_WRITTEN,
                0,
                _PAGE_IS_WRITTEN,
            )
            found = _ioctl(self.pagemap, _PAGEMAP_SCAN, ctypes.byref(arg))
            if found < 0 or arg.walk_end <= start:
                return None
            for region in vec[:found]:
                out.append((region.start - base, region.end - region.start))
            start = arg.walk_end
        return out


_TRACKER: list[_Tracker | None] = []
"""``[tracker or None]`` once this process has checked (a child made by ``os.fork`` checks
again: its mappings are not registered with its parent's descriptor)."""
_TRACKER_LOCK = threading.Lock()


def enabled() -> bool:
    """Whether write tracking may be used now (``MIGHTY_WRITE_TRACKING=0`` turns it off)."""
    return os.environ.get("MIGHTY_WRITE_TRACKING", "") != "0"


def tracker() -> _Tracker | None:
    """This process's tracker, or None where the kernel cannot track writes (or it is off)."""
    if not enabled():
        return None
    with _TRACKER_LOCK:
        if _TRACKER and (_TRACKER[0] is None or _TRACKER[0].pid == os.getpid()):
            return _TRACKER[0]
        made = _open()
        _TRACKER[:] = [made]
        return made


def _open() -> _Tracker | None:
    if _SYS_USERFAULTFD < 0:
        return None
    fd = int(_syscall(_SYS_USERFAULTFD, os.O_CLOEXEC | os.O_NONBLOCK | _UFFD_USER_MODE_ONLY))
    if fd < 0:
        return None
    try:
        pagemap = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        os.close(fd)
        return None
    api = _Api(_UFFD_API, _FEATURES, 0)
    made = _Tracker(fd, pagemap)
    if (
        _ioctl(fd, _UFFDIO_API, ctypes.byref(api)) != 0
        or api.features & _FEATURES != _FEATURES
        or not _probe(made)
    ):
        os.close(fd)
        os.close(pagemap)
        return None
    return made


def _probe(made: _Tracker) -> bool:
    """Check the whole path on a private mapping: registered and protected, nothing shows;
    a write from user space and one from the kernel (``read`` from a pipe) show, exactly; a
    scan with reset clears them."""
    pages = 8
    length = pages * _HOST_PAGE
    mapped = _mmap(None, length, 0x1 | 0x2, 0x02 | 0x20, -1, 0)  # private anonymous
    if mapped is None or mapped == ctypes.c_void_p(-1).value:
        return False
    base = int(mapped)
    read_end, write_end = os.pipe()
    try:
        ctypes.memset(base, 1, length)  # populated: the kernel write below finds a page
        if not made.register(base, length) or made.written(base, length, reset=False) != []:
            return False
        ctypes.memset(base + _HOST_PAGE, 2, 1)
        os.write(write_end, b"k")
        if _read(read_end, base + 5 * _HOST_PAGE, 1) != 1:
            return False
        expected = [(_HOST_PAGE, _HOST_PAGE), (5 * _HOST_PAGE, _HOST_PAGE)]
        return (
            made.written(base, length, reset=True) == expected
            and made.written(base, length, reset=False) == []
        )
    finally:
        os.close(read_end)
        os.close(write_end)
        _munmap(base, length)
