"""Memory images: instances start from the same bytes as when wasmtime copies the data segments,
share the pages they never write, and keep their own copies of the pages they do."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mighty import Budget, Component, Instance, OutOfMemory
from mighty.engine import live_memories
from mighty.engine._image import split_images

_PAGE = 65536

_EXPORTS = """
    (func (export "peek") (param $a i32) (result i32) local.get $a i32.load8_u)
    (func (export "poke") (param $a i32) (param $v i32) local.get $a local.get $v i32.store8)
    (func (export "pages") (result i32) memory.size)
    (func (export "grow") (param $n i32) (result i32) local.get $n memory.grow)
    (func (export "hash") (param $len i32) (result i32)
      (local $i i32) (local $h i32)
      i32.const 0x811c9dc5 local.set $h
      (block $done (loop $l
        local.get $i local.get $len i32.ge_u br_if $done
        local.get $h local.get $i i32.load8_u i32.xor i32.const 16777619 i32.mul local.set $h
        local.get $i i32.const 1 i32.add local.set $i
        br $l))
      local.get $h)
"""

_LIFTS = """
  (func (export "peek") (param "a" u32) (result u8) (canon lift (core func $i "peek")))
  (func (export "poke") (param "a" u32) (param "v" u8) (canon lift (core func $i "poke")))
  (func (export "pages") (result u32) (canon lift (core func $i "pages")))
  (func (export "grow") (param "n" u32) (result s32) (canon lift (core func $i "grow")))
  (func (export "hash") (param "len" u32) (result u32) (canon lift (core func $i "hash")))
"""


def _bytes_wat(data: bytes) -> str:
    return "".join(f"\\{b:02x}" for b in data)


def _component(pages: int, segments: list[tuple[int | None, bytes]], extra: str = "") -> str:
    """A component whose one module has a memory of ``pages`` and these data segments
    (offset None: passive), plus an export `init` copying passive segment 0 to address 0."""
    data = "".join(
        f'(data "{_bytes_wat(payload)}")'
        if offset is None
        else f'(data (i32.const {offset}) "{_bytes_wat(payload)}")'
        for offset, payload in segments
    )
    init = ""
    if any(offset is None for offset, _ in segments):
        first = next(i for i, (offset, _) in enumerate(segments) if offset is None)
        size = len(segments[first][1])
        init = (
            f'(func (export "init") i32.const 0 i32.const 0 i32.const {size} memory.init {first})'
        )
    lift_init = '(func (export "init") (canon lift (core func $i "init")))' if init else ""
    return f"""
(component
  (core module $m
    (memory {pages})
    {_EXPORTS}
    {init}
    {data}
    {extra}
  )
  (core instance $i (instantiate $m))
  {_LIFTS}
  {lift_init}
)
"""


def _fnv(memory: bytes) -> int:
    h = 0x811C9DC5
    for b in memory:
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h


def _model(pages: int, segments: list[tuple[int | None, bytes]]) -> bytearray:
    memory = bytearray(pages * _PAGE)
    for offset, payload in segments:
        if offset is not None:
            memory[offset : offset + len(payload)] = payload
    return memory


@st.composite
def _layouts(draw: st.DrawFn) -> tuple[int, list[tuple[int | None, bytes]]]:
    pages = draw(st.integers(1, 3))
    size = pages * _PAGE
    segments: list[tuple[int | None, bytes]] = []
    for _ in range(draw(st.integers(1, 8))):
        payload = draw(st.binary(min_size=0, max_size=300))
        if draw(st.booleans()) and draw(st.booleans()):
            segments.append((None, payload))
        else:
            # Anywhere in the memory, including its very end, overlapping earlier segments.
            offset = draw(st.integers(0, size - len(payload)))
            segments.append((offset, payload))
    return pages, segments


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(layout=_layouts())
def test_an_image_gives_the_bytes_wasmtime_would_copy(
    wat: Callable[[str], bytes], layout: tuple[int, list[tuple[int | None, bytes]]]
) -> None:
    """Random segments (overlapping, passive, at the very end): same memory with and without images."""
    pages, segments = layout
    data = wat(_component(pages, segments))
    shared = Component.load(data, use_cache=False)
    copied = Component.load(data, use_cache=False, share_memory=False)
    assert copied.images == ()
    expected = _model(pages, segments)
    moved = any(offset is not None and payload for offset, payload in segments)
    assert bool(shared.images) == moved
    for component in (shared, copied):
        with Instance(component) as instance:
            assert instance.call("pages") == pages
            assert instance.call("hash", pages * _PAGE) == _fnv(expected)
            if any(offset is None for offset, _ in segments):
                # Passive segments are left where they were: memory.init still finds them.
                first = next(payload for offset, payload in segments if offset is None)
                instance.call("init")
                for k, b in enumerate(first[:16]):
                    assert instance.call("peek", k) == b


def test_writes_are_private_to_their_instance(wat: Callable[[str], bytes]) -> None:
    """A byte written in one instance is invisible in the next; unwritten pages are shared."""
    component = Component.load(wat(_component(2, [(100, b"\x07" * 5000)])), use_cache=False)
    assert component.images
    with Instance(component) as first:
        first.call("poke", 100, 9)
        first.call("poke", 70_000, 5)
        assert first.call("peek", 100) == 9
        with Instance(component) as second:
            assert second.call("peek", 100) == 7
            assert second.call("peek", 70_000) == 0
        assert first.call("peek", 101) == 7
    with Instance(component) as third:
        assert third.call("peek", 100) == 7


def test_accounting_is_exact_with_an_image(wat: Callable[[str], bytes]) -> None:
    """The ceiling and the peak count the memory's size, image or not, and grow past it."""
    component = Component.load(wat(_component(2, [(0, b"\x01" * 70_000)])), use_cache=False)
    assert component.images
    before = live_memories()
    with Instance(component, budget=Budget(memory=4 * _PAGE)) as instance:
        assert instance.instantiate_usage.memory_peak == 2 * _PAGE
        assert instance.call("grow", 1) == 2
        assert instance.last_usage is not None
        assert instance.last_usage.memory_peak == 3 * _PAGE
        assert instance.call("peek", 69_999) == 1  # the image is still there after the grow
        assert instance.call("peek", 3 * _PAGE - 1) == 0
        with pytest.raises(OutOfMemory):
            instance.call("grow", 2)
    assert live_memories() == before
    with pytest.raises(OutOfMemory):
        Instance(component, budget=Budget(memory=_PAGE))
    assert live_memories() == before


def test_shapes_outside_the_rewrite_are_left_to_wasmtime(wat: Callable[[str], bytes]) -> None:
    """A constant expression longer than i32.const: no image, and the same memory as before."""
    extended = _component(1, []).replace(
        "(memory 1)", '(memory 1) (data (offset (i32.add (i32.const 10) (i32.const 5))) "\\2a")'
    )
    component = Component.load(wat(extended), use_cache=False)
    assert component.images == ()
    with Instance(component) as instance:
        assert instance.call("peek", 15) == 42


def test_two_memory_modules_are_left_to_wasmtime(wat: Callable[[str], bytes]) -> None:
    """When two modules define memories the images could be matched wrongly: none are cut."""
    text = """
(component
  (core module $a (memory 1) (data (i32.const 0) "\\01"))
  (core module $m (memory 1) (data (i32.const 3) "\\05")
    (func (export "peek") (param $a i32) (result i32) local.get $a i32.load8_u))
  (core instance $ia (instantiate $a))
  (core instance $i (instantiate $m))
  (func (export "peek") (param "a" u32) (result u8) (canon lift (core func $i "peek")))
)
"""
    data = wat(text)
    assert split_images(data) is None
    with Instance(Component.load(data, use_cache=False)) as instance:
        assert instance.call("peek", 3) == 5


def test_data_into_an_imported_memory_stays_a_segment(wat: Callable[[str], bytes]) -> None:
    """Segments of a module that imports its memory are copied by wasmtime, after the image."""
    text = """
(component
  (core module $owner (memory (export "memory") 1) (data (i32.const 0) "\\01\\02\\03"))
  (core module $user (import "owner" "memory" (memory 1)) (data (i32.const 1) "\\09")
    (func (export "peek") (param $a i32) (result i32) local.get $a i32.load8_u))
  (core instance $o (instantiate $owner))
  (core instance $i (instantiate $user (with "owner" (instance $o))))
  (func (export "peek") (param "a" u32) (result u8) (canon lift (core func $i "peek")))
)
"""
    component = Component.load(wat(text), use_cache=False)
    assert component.images
    with Instance(component) as instance:
        assert [instance.call("peek", k) for k in range(4)] == [1, 9, 3, 0]


def test_a_segment_out_of_bounds_still_fails_instantiation(wat: Callable[[str], bytes]) -> None:
    """A segment past the memory's end is not moved into an image: instantiating still fails."""
    text = _component(1, []).replace("(memory 1)", '(memory 1) (data (i32.const 65535) "\\01\\02")')
    component = Component.load(wat(text), use_cache=False)
    assert component.images == ()
    with pytest.raises(Exception, match="out of bounds"):
        Instance(component)


def test_the_cache_never_mixes_emptied_and_whole_compilations(
    wat: Callable[[str], bytes], tmp_path: object
) -> None:
    """A compiled form of the emptied bytes is keyed apart from the whole bytes' one."""
    from pathlib import Path

    from mighty.engine import CompiledCache

    assert isinstance(tmp_path, Path)
    cache = CompiledCache(tmp_path)
    data = wat(_component(1, [(8, b"\x2a")]))
    first = Component.load(data, cache=cache, share_memory=False)
    second = Component.load(data, cache=cache)
    third = Component.load(data, cache=cache)
    assert not first.from_cache and not second.from_cache and third.from_cache
    assert second.images and not first.images
    for component in (first, second, third):
        with Instance(component) as instance:
            assert instance.call("peek", 8) == 42


def test_prefault_copies_the_learned_pages_from_the_image(wat: Callable[[str], bytes]) -> None:
    """Hot pages learned from one instance are copied up front from the image, never from it."""
    component = Component.load(wat(_component(3, [(0, b"\x05" * 150_000)])), use_cache=False)
    (image,) = component.images
    with Instance(component) as teacher:
        for address in (0, 70_000, 140_000):
            teacher.call("poke", address, 9)
        assert teacher.learn_hot_pages() >= 3
        assert teacher.learn_hot_pages() == 0  # learned once per image
    assert image.hot
    expected = _model(3, [(0, b"\x05" * 150_000)])
    with Instance(component, prefault=True) as learner:
        assert learner.call("hash", 3 * _PAGE) == _fnv(expected)
        assert learner.call("peek", 70_000) == 5
        learner.call("poke", 70_000, 1)
        with Instance(component, prefault=True) as other:
            assert other.call("peek", 70_000) == 5


def _open_fds() -> set[str]:
    """The process's open descriptors, its page map's opened first: that one is opened once
    per process, by whichever test first frees a memory (so a test run alone saw it appear)."""
    import os

    from mighty.engine import _memory

    _memory._pagemap_fd()
    return set(os.listdir("/proc/self/fd"))


def test_a_seal_refused_for_a_moment_is_tried_again_on_a_fresh_file(
    wat: Callable[[str], bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """F_SEAL_WRITE may be refused (EBUSY) while a just-written page sits in another CPU's LRU
    batch: the image is made on a fresh file, with the same bytes, and the thread keeps its CPUs."""
    import errno
    import fcntl
    import os

    real = fcntl.fcntl
    refusals = [2]

    def flaky(fd: int, cmd: int, arg: int = 0) -> int:
        if cmd == fcntl.F_ADD_SEALS and refusals[0]:
            refusals[0] -= 1
            raise OSError(errno.EBUSY, "Device or resource busy")
        return real(fd, cmd, arg)

    cpus = os.sched_getaffinity(0)
    before = _open_fds()
    monkeypatch.setattr(fcntl, "fcntl", flaky)
    component = Component.load(wat(_component(2, [(100, b"\x07" * 5000)])), use_cache=False)
    monkeypatch.undo()
    assert refusals == [0]
    assert component.images
    assert os.sched_getaffinity(0) == cpus
    with Instance(component) as instance:
        assert instance.call("peek", 100) == 7
        assert instance.call("peek", 5099) == 7
        assert instance.call("peek", 5100) == 0
    del component, instance
    import gc

    gc.collect()
    assert _open_fds() <= before  # the refused files were closed


def test_a_seal_refused_every_time_leaves_the_segments_to_wasmtime(
    wat: Callable[[str], bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No image to be had: the component loads without one (wasmtime copies the segments, as
    with share_memory=False), the same bytes, no file left open, the thread's CPUs kept."""
    import errno
    import fcntl
    import gc
    import os

    real = fcntl.fcntl
    refused = [0]

    def busy(fd: int, cmd: int, arg: int = 0) -> int:
        if cmd == fcntl.F_ADD_SEALS:
            refused[0] += 1
            raise OSError(errno.EBUSY, "Device or resource busy")
        return real(fd, cmd, arg)

    data = wat(_component(2, [(100, b"\x07" * 5000)]))
    cpus = os.sched_getaffinity(0)
    gc.collect()
    before = _open_fds()
    monkeypatch.setattr(fcntl, "fcntl", busy)
    component = Component.load(data, use_cache=False)
    monkeypatch.undo()
    assert refused[0] > 1  # tried again before giving up
    assert component.images == ()
    assert os.sched_getaffinity(0) == cpus
    with Instance(component) as instance:
        assert instance.call("peek", 100) == 7
        assert instance.call("peek", 5100) == 0
    del component, instance
    gc.collect()
    assert _open_fds() <= before


def test_freeing_a_memory_inside_the_table_lock_does_not_wait_for_itself() -> None:
    """A garbage collection that runs while a thread holds the memory table's lock may delete a
    store, whose free callback takes the lock again on that thread: it returns (CI's stress run
    once hung there, in the middle of making an instance)."""
    import threading

    from mighty.engine import _memory

    done = threading.Event()

    def inside() -> None:
        with _memory._MEMORIES_LOCK:
            _memory._free_memory(1 << 60)  # what a store deleted by the collection calls
        done.set()

    threading.Thread(target=inside, daemon=True).start()
    assert done.wait(60), "the free waited for the lock its own thread held"


def test_instances_collected_by_the_gc_while_others_are_made(wat: Callable[[str], bytes]) -> None:
    """Stores freed by garbage collections at any allocation (threshold 1), from two threads
    making instances at once: nothing hangs, and every memory is given back."""
    import gc
    import threading

    component = Component.load(wat(_component(1, [(0, b"\x05" * 100)])), use_cache=False)
    before = live_memories()
    errors: list[BaseException] = []

    def churn() -> None:
        try:
            for _ in range(30):
                cycle: list[object] = [Instance(component)]
                cycle.append(cycle)  # only a collection frees it (and its store's memory)
                del cycle
        except BaseException as exc:  # noqa: BLE001 -- reported below
            errors.append(exc)

    thresholds = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    try:
        threads = [threading.Thread(target=churn, daemon=True) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
        assert not any(thread.is_alive() for thread in threads), "instances hung"
    finally:
        gc.set_threshold(*thresholds)
    assert errors == []
    gc.collect()
    assert live_memories() == before
