"""Layered memory states: a capture taken after an earlier one of the same memory copies only
the pages that changed since, and whatever chain of layers results holds, byte for byte, what
the memory held at each capture (instantiated, restored, or read back page by page)."""

from __future__ import annotations

import array
import ctypes
import errno
import os
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mighty import Closed, Component, Instance
from mighty.engine import MemoryState, _memory, _state
from tests.engine.test_rewind import _HOST_PAGE, _PATHS, _SIZE, _WAT, Pokes, _fnv, _model, _poke


@pytest.fixture(scope="module")
def component(wat: Callable[[str], bytes]) -> Component:
    """test_rewind's component: a memory to poke, peek, grow and hash."""
    return Component.load(wat(_WAT), use_cache=False)


_PLACES = [0, 8, 4096, 4100, 8191, 65536, 131072, 131075, _SIZE - 1]
"""Few places, in the image, past it and on page edges, so that steps write the same bytes
again (a page changed, then written back to what an earlier state or the image holds)."""
_pokes = st.lists(
    st.tuples(st.one_of(st.sampled_from(_PLACES), st.integers(0, _SIZE - 1)), st.integers(0, 255)),
    max_size=12,
)


def _read_back(state: MemoryState) -> bytearray:
    """The memory a state describes, from the image model and its mapped pages."""
    memory = _model()
    for offset, data in state.pages():
        memory[offset : offset + len(data)] = data
    return memory


@pytest.mark.parametrize("path", _PATHS)
@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    steps=st.lists(
        st.tuples(_pokes, st.sampled_from([0, _HOST_PAGE, 8 * _HOST_PAGE]), st.booleans()),
        max_size=8,
    )
)
def test_every_state_of_a_chain_holds_what_the_memory_held(
    component: Component,
    monkeypatch: pytest.MonkeyPatch,
    path: str,
    steps: list[tuple[Pokes, int, bool]],
) -> None:
    """Writes and captures in any order, any gap, compiled compare or pure Python, places
    written back to the image's bytes between captures: each state is a layer over the one
    before (or that one, when nothing changed) and holds exactly the memory at its capture,
    read back or instantiated."""
    monkeypatch.setenv("MIGHTY_PURE_PYTHON", "1" if path == "pure" else "0")
    model = _model()
    image = _model()
    taken: list[tuple[MemoryState, bytes]] = []
    with Instance(component) as instance:
        for pokes, gap, back in steps:
            _poke(instance, model, pokes)
            if back:
                _poke(instance, model, [(at, image[at]) for at in _PLACES])
            state = instance.capture_memory(gap=gap)
            if taken:
                previous = taken[-1][0]
                assert state is previous or state.base is previous
                if state is previous:
                    assert bytes(model) == taken[-1][1]
            else:
                assert state.depth == 0
            taken.append((state, bytes(model)))
    for state, held in taken:
        assert bytes(_read_back(state)) == held
        with Instance(component, memory=state) as copy:
            assert copy.call("hash", _SIZE) == _fnv(held)


def _base_and_layer(
    component: Component, model: bytearray, first: Pokes, second: Pokes
) -> tuple[MemoryState, MemoryState]:
    """Two captures of one memory, ``first`` poked before the base and ``second`` before the
    layer over it (``model`` follows the pokes)."""
    with Instance(component) as instance:
        _poke(instance, model, first)
        base = instance.capture_memory()
        _poke(instance, model, second)
        return base, instance.capture_memory()


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(first=_pokes, second=_pokes, written=_pokes)
def test_a_memory_holding_the_base_maps_only_the_layer(
    component: Component,
    monkeypatch: pytest.MonkeyPatch,
    first: Pokes,
    second: Pokes,
    written: Pokes,
) -> None:
    """Restoring a layer into a memory that holds its base and wrote nothing since maps only
    the layer's pages; one that wrote since is mapped whole; both then hold the layer."""
    model = _model()
    base, layer = _base_and_layer(component, model, first, second)
    wholes: list[MemoryState] = []
    mapped = _memory._map_state
    monkeypatch.setattr(
        _memory, "_map_state", lambda at, state: wholes.append(state) or mapped(at, state)
    )
    with Instance(component, memory=base) as spare:
        wholes.clear()
        if written:
            _poke(spare, bytearray(_SIZE), written)
        spare.restore_memory(layer)
        assert spare.call("hash", _SIZE) == _fnv(model)
        fast = layer is not base and layer.base is base and not written
        assert (wholes == []) == fast or layer is base
        # Written after the restore: the next capture is a layer over what it restored. (A
        # byte other than the one there: one written back to what the layer holds leaves
        # nothing changed, and the capture is the layer itself.)
        value = (model[0] + 1) % 256
        spare.call("poke", 0, value)
        after = spare.capture_memory()
        assert after.base is layer
        model[0] = value
        assert bytes(_read_back(after)) == bytes(model)


def test_a_chain_is_bounded_and_then_frozen_whole(component: Component) -> None:
    """Past MAX_DEPTH layers the next capture is frozen whole, and the chain starts again."""
    states = []
    with Instance(component) as instance:
        for round_ in range(_state.MAX_DEPTH + 3):
            instance.call("poke", round_ * 97 % _SIZE, round_ % 251 + 1)
            states.append(instance.capture_memory())  # held: a layer needs its base alive
    depths = [state.depth for state in states]
    assert max(depths) == _state.MAX_DEPTH
    assert depths[: _state.MAX_DEPTH + 1] == list(range(_state.MAX_DEPTH + 1))
    assert depths[_state.MAX_DEPTH + 1] == 0


def test_a_grown_memory_and_an_exact_capture_are_frozen_whole(component: Component) -> None:
    """After a grow the sizes differ, and a snapshot's exact capture never layers: both whole."""
    with Instance(component) as instance:
        instance.call("poke", 10, 1)
        first = instance.capture_memory()
        instance.call("poke", 20, 2)
        assert instance.capture_memory(exact=True).depth == 0
        assert instance.call("grow", 1) >= 0
        instance.call("poke", 30, 3)
        grown = instance.capture_memory()
    assert grown.depth == 0 and grown.size > first.size
    with Instance(component, memory=grown) as copy:
        assert [copy.call("peek", at) for at in (10, 20, 30)] == [1, 2, 3]


def test_a_dropped_previous_state_is_not_layered_on(component: Component) -> None:
    """A layer keeps its base alive; with the previous state gone, the next is frozen whole."""
    with Instance(component) as instance:
        instance.call("poke", 10, 1)
        instance.capture_memory()  # dropped at once
        instance.call("poke", 20, 2)
        state = instance.capture_memory()
    assert state.depth == 0


_PAGES = _SIZE // _HOST_PAGE


@st.composite
def _ranges(draw: st.DrawFn, fd: int) -> list[tuple[int, int, int, int]]:
    """Sorted, disjoint page ranges of a small memory, with offsets into ``fd``."""
    marks = draw(st.lists(st.booleans(), min_size=_PAGES, max_size=_PAGES))
    cuts = draw(st.lists(st.booleans(), min_size=_PAGES, max_size=_PAGES))
    out: list[tuple[int, int, int, int]] = []
    at = 0
    for page, (mark, cut) in enumerate(zip(marks, cuts, strict=True)):
        if not mark:
            continue
        last = out[-1] if out else None
        if last is not None and last[0] + last[1] == page * _HOST_PAGE and not cut:
            out[-1] = (last[0], last[1] + _HOST_PAGE, fd, last[3])
        else:
            out.append((page * _HOST_PAGE, _HOST_PAGE, fd, at))
        at += _HOST_PAGE
    return out


@given(below=_ranges(3), above=_ranges(4))
def test_an_overlay_gives_each_page_its_top_layer(
    below: list[tuple[int, int, int, int]], above: list[tuple[int, int, int, int]]
) -> None:
    """Page by page, the flattened mapping names the upper range's bytes where there is one,
    else the lower's (at the same place in its memfd), else nothing; sorted and disjoint."""

    def owners(ranges: tuple[tuple[int, int, int, int], ...] | list) -> dict[int, tuple[int, int]]:
        return {
            offset + i: (fd, at + i)
            for offset, length, fd, at in ranges
            for i in range(0, length, _HOST_PAGE)
        }

    merged = _state._overlay(below, above)
    assert owners(merged) == {**owners(below), **owners(above)}
    ends = [offset + length for offset, length, _fd, _at in merged]
    assert all(end <= start for end, (start, *_rest) in zip(ends, merged[1:], strict=False))


def test_the_page_map_is_reopened_in_a_forked_child(monkeypatch: pytest.MonkeyPatch) -> None:
    """The page map's descriptor names the process that opened it: another pid reopens it."""
    first = _memory._pagemap_fd()
    assert first >= 0 and _memory._pagemap_fd() == first
    real = os.getpid()
    monkeypatch.setattr(_memory.os, "getpid", lambda: real + 1)
    second = _memory._pagemap_fd()
    try:
        assert second >= 0 and second != first
    finally:
        monkeypatch.undo()
        os.close(second)
        _memory._PAGEMAP[:] = [real, first]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    first=_pokes,
    second=_pokes,
    ranges=st.lists(st.tuples(st.integers(-_HOST_PAGE, _SIZE), st.integers(0, 3 * _SIZE))),
)
def test_populating_a_memory_changes_no_byte_and_keeps_the_layer_fast_path(
    component: Component,
    monkeypatch: pytest.MonkeyPatch,
    first: Pokes,
    second: Pokes,
    ranges: list[tuple[int, int]],
) -> None:
    """Populating any ranges (clipped to the memory, even past it or before it) leaves every
    byte as it was; a memory populated after a restore and called nothing since still takes
    only the next layer's pages, one that ran a call since is mapped whole."""
    model = _model()
    base, layer = _base_and_layer(component, model, first, second)
    base_bytes = bytes(_read_back(base))
    wholes: list[MemoryState] = []
    mapped = _memory._map_state
    monkeypatch.setattr(
        _memory, "_map_state", lambda at, state: wholes.append(state) or mapped(at, state)
    )
    with Instance(component) as spare, Instance(component) as called:
        for instance in (spare, called):
            instance.restore_memory(base)
            instance.populate_memory(ranges)
        assert spare.call("hash", _SIZE) == _fnv(base_bytes)  # a call: mapped whole next
        spare.restore_memory(base)
        spare.populate_memory([(0, _SIZE)])
        wholes.clear()
        spare.restore_memory(layer)
        assert wholes == [] or layer is base
        assert spare.call("hash", _SIZE) == _fnv(model)
        assert called.call("peek", 0) == base_bytes[0]
        called.restore_memory(layer)
        assert called.call("hash", _SIZE) == _fnv(model)
    with pytest.raises(Closed):
        spare.populate_memory([(0, _HOST_PAGE)])


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    first=_pokes,
    pages=st.lists(st.tuples(st.integers(0, _PAGES - 1), st.binary(min_size=1, max_size=64))),
    order=st.randoms(use_true_random=False),
    fail=st.booleans(),
)
def test_a_layer_is_read_into_a_memory_holding_its_base_from_anywhere_in_its_memfd(
    component: Component,
    first: Pokes,
    pages: list[tuple[int, bytes]],
    order: Any,
    fail: bool,
) -> None:
    """A layer whose pages lie in its memfd in any order (not one after another) is read into
    a memory that holds its base, page for page; when the memfd cannot be read, the state is
    mapped whole instead, with the same bytes."""
    model = _model()
    with Instance(component) as instance:
        _poke(instance, model, first)
        base = instance.capture_memory()
    written = dict(pages)  # the last bytes drawn for each page
    ranges = sorted(written)
    slots = list(range(len(ranges)))
    order.shuffle(slots)
    fd = os.memfd_create("layer-test", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, len(ranges) * _HOST_PAGE)
        placed = []
        for page, slot in zip(ranges, slots, strict=True):
            content = bytearray(model[page * _HOST_PAGE : (page + 1) * _HOST_PAGE])
            content[: len(written[page])] = written[page]
            os.pwrite(fd, bytes(content), slot * _HOST_PAGE)
            model[page * _HOST_PAGE : (page + 1) * _HOST_PAGE] = content
            placed.append((page * _HOST_PAGE, _HOST_PAGE, slot * _HOST_PAGE))
        layer = MemoryState(base.size, base.image, os.dup(fd), tuple(placed), base)
    finally:
        os.close(fd)
    wholes: list[MemoryState] = []
    mapped = _memory._map_state

    def unreadable(fd: int, views: list[memoryview], at: int) -> None:
        raise OSError(5, "Input/output error")

    with pytest.MonkeyPatch.context() as patch:  # per example (hypothesis runs many per test)
        patch.setattr(
            _memory, "_map_state", lambda at, state: wholes.append(state) or mapped(at, state)
        )
        if fail:
            patch.setattr(_memory, "_preadv_all", unreadable)
        with Instance(component, memory=base) as spare:
            wholes.clear()
            spare.restore_memory(layer)
            assert (wholes == [layer]) == (fail and bool(placed))
            assert spare.call("hash", _SIZE) == _fnv(model)
            assert bytes(_read_back(layer)) == bytes(model)


@settings(max_examples=50, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 5000), min_size=1, max_size=12),
    at=st.integers(0, 100),
    short=st.integers(0, 3),
    iov_max=st.integers(1, 4),
)
def test_preadv_all_fills_every_view_or_says_the_file_ended(
    tmp_path_factory: pytest.TempPathFactory,
    lengths: list[int],
    at: int,
    short: int,
    iov_max: int,
) -> None:
    """``_preadv_all`` fills the views one after another from ``at``, in calls of at most
    ``_IOV_MAX`` views; a file that ends before the last view is an OSError."""
    data = os.urandom(at + sum(lengths))
    path = tmp_path_factory.mktemp("preadv") / "data"
    path.write_bytes(data[: len(data) - short])
    buffers = [bytearray(n) for n in lengths]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_memory, "_IOV_MAX", iov_max)
        fd = os.open(path, os.O_RDONLY)
        try:
            if short:
                with pytest.raises(OSError, match="ended early"):
                    _memory._preadv_all(fd, [memoryview(b) for b in buffers], at)
            else:
                _memory._preadv_all(fd, [memoryview(b) for b in buffers], at)
                assert b"".join(buffers) == data[at:]
        finally:
            os.close(fd)


@pytest.mark.parametrize("path", _PATHS)
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_mapped_ranges_show_their_memfd_bytes_either_way(path: str, data: st.DataObject) -> None:
    """``_map_ranges`` (compiled: every range with the GIL released once; pure Python: one
    foreign call per range holding it) maps each range's memfd bytes at its offset and leaves
    the rest of the region as it was; a range the kernel refuses is a False."""
    pages = _PAGES  # what ``_ranges`` draws from, offsets and memfd positions alike
    fd = os.memfd_create("ranges-test", os.MFD_CLOEXEC)
    region = _memory._libc.mmap(
        None,
        pages * _HOST_PAGE,
        _memory._PROT_READ_WRITE,
        _memory._MAP_PRIVATE | _memory._MAP_ANONYMOUS,
        -1,
        0,
    )
    assert region not in (None, _memory._MAP_FAILED)
    try:
        os.ftruncate(fd, pages * _HOST_PAGE)
        os.pwrite(fd, bytes(range(256)) * (pages * _HOST_PAGE // 256), 0)
        mapping = [(o, n, fd, at) for o, n, _fd, at in data.draw(_ranges(fd))]
        view = (ctypes.c_char * (pages * _HOST_PAGE)).from_address(region)
        view[:] = b"\xee" * (pages * _HOST_PAGE)
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("MIGHTY_PURE_PYTHON", "1" if path == "pure" else "0")
            assert _memory._map_ranges(region, mapping)
            expected = bytearray(b"\xee" * (pages * _HOST_PAGE))
            for offset, length, _fd, at in mapping:
                expected[offset : offset + length] = os.pread(fd, length, at)
            assert bytes(view) == bytes(expected)
            bad = data.draw(st.sampled_from(["negative", "fd"]))
            refused = (
                0,
                _HOST_PAGE,
                -1 if bad == "fd" else fd,
                -_HOST_PAGE if bad == "negative" else 0,
            )
            assert not _memory._map_ranges(region, [refused])
    finally:
        _memory._libc.munmap(region, pages * _HOST_PAGE)
        os.close(fd)


def test_compiled_map_ranges_refuses_malformed_input() -> None:
    """The compiled ``map_ranges`` takes whole int64 quadruples only (a ValueError, nothing
    mapped), and an impossible range is an OSError before any system call."""
    pages = _memory._pages
    if pages is None:
        pytest.fail("the compiled module is not built (python hatch_build.py)")
    with pytest.raises(ValueError, match="whole int64 quadruples"):
        pages.map_ranges(0, b"\x00" * 31, 0, 0)
    with pytest.raises(OSError, match="Invalid argument") as raised:
        pages.map_ranges(0, array.array("q", [0, 0, 0, 0]).tobytes(), 0, 0)
    assert raised.value.errno == errno.EINVAL
    assert pages.map_ranges(0, b"", 0, 0) == 0
