"""Write tracking (mighty.engine._tracking): the kernel's record of which pages were written
since a moment, as a layered capture reads it, and the fallback where there is none."""

from __future__ import annotations

import ctypes
import itertools
import os
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mighty import Component, Instance
from mighty.engine import _memory, _tracking
from tests.engine.test_rewind import _HOST_PAGE, _SIZE, _WAT, _fnv, _model, _poke

_PAGES = 64


def _kernel_allows() -> bool:
    """What the tracker needs, checked apart from its own probe: Linux 6.7 or later (for
    ``PAGEMAP_SCAN`` and asynchronous write protection) and a userfaultfd the process may
    open (no seccomp filter refusing it)."""
    release = os.uname().release.split("-")[0].split(".")
    if tuple(int(part) for part in release[:2] if part.isdigit()) < (6, 7):
        return False
    fd = int(_tracking._syscall(_tracking._SYS_USERFAULTFD, os.O_CLOEXEC | 1))
    if fd < 0:
        return False
    os.close(fd)
    return True


def test_the_tracker_is_there_exactly_where_the_kernel_allows_it() -> None:
    """Available where the kernel has what it needs; None where it does not, or when turned
    off with ``MIGHTY_WRITE_TRACKING=0`` (every caller then compares pages itself)."""
    assert (_tracking.tracker() is not None) == _kernel_allows()
    os.environ["MIGHTY_WRITE_TRACKING"] = "0"
    try:
        assert _tracking.tracker() is None
    finally:
        del os.environ["MIGHTY_WRITE_TRACKING"]


@settings(max_examples=40, deadline=None)
@given(
    rounds=st.lists(
        st.tuples(
            st.sets(st.integers(0, _PAGES - 1), max_size=12),
            st.sets(st.integers(0, _PAGES - 1), max_size=4),
        ),
        max_size=5,
    )
)
def test_the_pages_written_are_listed_exactly_and_cleared(
    rounds: list[tuple[set[int], set[int]]],
) -> None:
    """Pages written from user space and by the kernel (``read`` into them) since the range
    was protected are listed, each once, merged into ranges; reading without reset lists them
    again, with reset clears them; pages never written are never listed."""
    watcher = _tracking.tracker()
    assert watcher is not None or not _kernel_allows()
    if watcher is None:
        return  # nothing to check here: the captures' fallback is tested below
    length = _PAGES * _HOST_PAGE
    mapped = _tracking._mmap(None, length, 0x3, 0x22, -1, 0)  # private, anonymous
    assert mapped not in (None, ctypes.c_void_p(-1).value)
    base = int(mapped)
    read_end, write_end = os.pipe()
    try:
        assert watcher.register(base, length)
        assert watcher.written(base, length, reset=False) == []
        for user, kernel in rounds:
            for page in user:
                ctypes.memset(base + page * _HOST_PAGE + 17, 7, 1)
            for page in kernel:
                os.write(write_end, b"k")
                assert _tracking._read(read_end, base + page * _HOST_PAGE, 1) == 1
            pages = sorted(user | kernel)
            listed = watcher.written(base, length, reset=False)
            assert listed is not None
            assert [
                page
                for offset, size in listed
                for page in range(offset // _HOST_PAGE, (offset + size) // _HOST_PAGE)
            ] == pages
            # Merged: no two ranges touch.
            assert all(
                end < start
                for (offset, size), (start, _size) in itertools.pairwise(listed)
                for end in [offset + size]
            )
            assert watcher.written(base, length, reset=True) == listed
            assert watcher.written(base, length, reset=False) == []
    finally:
        os.close(read_end)
        os.close(write_end)
        _tracking._munmap(base, length)


def test_a_remapped_range_is_not_read_as_tracked() -> None:
    """A range mapped anew over part of a registered one is not registered: reading the whole
    says it cannot (None), not that nothing was written."""
    watcher = _tracking.tracker()
    assert watcher is not None or not _kernel_allows()
    if watcher is None:
        return
    length = 8 * _HOST_PAGE
    base = int(_tracking._mmap(None, length, 0x3, 0x22, -1, 0))
    try:
        assert watcher.register(base, length)
        again = _tracking._mmap(base + 2 * _HOST_PAGE, _HOST_PAGE, 0x3, 0x22 | 0x10, -1, 0)
        assert again == base + 2 * _HOST_PAGE
        assert watcher.written(base, length, reset=False) is None
        assert watcher.register(base, length)  # registered again as a whole
        ctypes.memset(base + 2 * _HOST_PAGE, 1, 1)
        assert watcher.written(base, length, reset=False) == [(2 * _HOST_PAGE, _HOST_PAGE)]
    finally:
        _tracking._munmap(base, length)


@pytest.fixture(scope="module")
def component(wat: Callable[[str], bytes]) -> Component:
    """test_rewind's component: a memory to poke, peek, grow and hash."""
    return Component.load(wat(_WAT), use_cache=False)


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    steps=st.lists(
        st.lists(st.tuples(st.integers(0, _SIZE - 1), st.integers(0, 255)), max_size=10),
        min_size=2,
        max_size=6,
    ),
)
def test_a_tracked_capture_compares_only_the_pages_written(
    component: Component,
    monkeypatch: pytest.MonkeyPatch,
    steps: list[list[tuple[int, int]]],
) -> None:
    """After a tracked capture the next one reads the kernel's record, not the page map, and
    compares only the pages written since; a restore ends the record (the memory is mapped
    anew) and the capture after it reads the page map again. Every state holds the memory."""
    reads: list[int] = []
    real = _memory._read_pagemap
    monkeypatch.setattr(
        _memory, "_read_pagemap", lambda base, pages: reads.append(pages) or real(base, pages)
    )
    tracked = _tracking.tracker() is not None
    model = _model()
    with Instance(component) as instance:
        states = []
        for index, pokes in enumerate(steps):
            _poke(instance, model, pokes)
            reads.clear()
            state = instance.capture_memory(track=True)
            states.append((state, bytes(model)))
            if index:
                assert (reads == []) == tracked
        instance.restore_memory(states[0][0])
        model = bytearray(states[0][1])
        _poke(instance, model, [(0, (model[0] + 1) % 256)])
        reads.clear()
        after = instance.capture_memory(track=True)
        assert reads != []  # the record ended with the restore
        states.append((after, bytes(model)))
    for state, held in states:
        with Instance(component, memory=state) as copy:
            assert copy.call("hash", _SIZE) == _fnv(held)
