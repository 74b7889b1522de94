"""Rewinding a memory in place: after ``Instance.rewind(target)`` the memory holds ``target``
byte for byte, whatever the instance wrote, and a rewind that cannot be exact changes nothing."""

from __future__ import annotations

import gc
import os
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mighty import Component, Instance
from mighty.engine import MemoryState, _memory

_PAGE = 65536
_HOST_PAGE = os.sysconf("SC_PAGE_SIZE")
_PAGES = 3
_SIZE = _PAGES * _PAGE

_PATTERN = "".join(f"\\{b:02x}" for b in bytes(range(256)) * 20)

_WAT = f"""
(component
  (core module $m
    (memory {_PAGES})
    (func (export "poke") (param $a i32) (param $v i32) local.get $a local.get $v i32.store8)
    (func (export "peek") (param $a i32) (result i32) local.get $a i32.load8_u)
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
    (data (i32.const 4096) "{_PATTERN}")
    (data (i32.const 131072) "image bytes past the first page")
  )
  (core instance $i (instantiate $m))
  (func (export "poke") (param "a" u32) (param "v" u8) (canon lift (core func $i "poke")))
  (func (export "peek") (param "a" u32) (result u8) (canon lift (core func $i "peek")))
  (func (export "grow") (param "n" u32) (result s32) (canon lift (core func $i "grow")))
  (func (export "hash") (param "len" u32) (result u32) (canon lift (core func $i "hash")))
)
"""


def _model() -> bytearray:
    memory = bytearray(_SIZE)
    memory[4096 : 4096 + 5120] = bytes(range(256)) * 20
    text = b"image bytes past the first page"
    memory[131072 : 131072 + len(text)] = text
    return memory


def _fnv(memory: bytes) -> int:
    h = 0x811C9DC5
    for b in memory:
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h


Pokes = list[tuple[int, int]]
_pokes = st.lists(st.tuples(st.integers(0, _SIZE - 1), st.integers(0, 255)), max_size=40)


def _poke(instance: Instance, model: bytearray, pokes: Pokes) -> None:
    for at, value in pokes:
        instance.call("poke", at, value)
        model[at] = value


@pytest.fixture(scope="module")
def component(wat: Callable[[str], bytes]) -> Component:
    loaded = Component.load(wat(_WAT), use_cache=False)
    assert loaded.images  # the rewind is about memories made from an image's states
    return loaded


def _states(component: Component, base: Pokes, target: Pokes) -> tuple[MemoryState, MemoryState]:
    """A base state (the image after ``base``) and a target: another instance made from the
    base, after ``target``."""
    with Instance(component) as first:
        _poke(first, bytearray(_SIZE), base)
        made_from = first.capture_memory(gap=0)
    with Instance(component, memory=made_from) as second:
        _poke(second, bytearray(_SIZE), target)
        return made_from, second.capture_memory(exact=True)


_PATHS = ["compiled", "pure"] if _memory._pages is not None else ["pure"]


@pytest.mark.parametrize("path", _PATHS)
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(base=_pokes, target=_pokes, before=_pokes, runs=st.lists(_pokes, min_size=1, max_size=3))
def test_a_rewound_memory_holds_the_target_byte_for_byte(
    component: Component,
    monkeypatch: pytest.MonkeyPatch,
    path: str,
    base: Pokes,
    target: Pokes,
    before: Pokes,
    runs: list[Pokes],
) -> None:
    """Any writes, before and between rewinds, compiled copy or pure Python: afterwards the
    memory is the target exactly (pages the target changed that the instance never wrote,
    pages it wrote that the target never changed)."""
    monkeypatch.setenv("MIGHTY_PURE_PYTHON", "1" if path == "pure" else "0")
    made_from, goal = _states(component, base, target)
    expected = _model()
    for at, value in (*base, *target):
        expected[at] = value
    with Instance(component, memory=made_from) as instance:
        _poke(instance, bytearray(_SIZE), before)
        for run in runs:
            assert instance.rewind(goal)
            assert instance.call("hash", _SIZE) == _fnv(expected)
            for at, _value in run[:5]:
                assert instance.call("peek", at) == expected[at]
            _poke(instance, bytearray(_SIZE), run)
        assert instance.rewind(goal)
        assert instance.call("hash", _SIZE) == _fnv(expected)


def test_a_memory_that_grew_is_not_rewound_and_keeps_its_bytes(component: Component) -> None:
    """The size cannot go back (wasmtime's view of it): the rewind says no, nothing changes."""
    made_from, goal = _states(component, [(10, 1)], [(20, 2)])
    with Instance(component, memory=made_from) as instance:
        instance.call("poke", 30, 3)
        assert instance.call("grow", 1) == _PAGES
        assert not instance.rewind(goal)
        assert [instance.call("peek", a) for a in (10, 20, 30)] == [1, 0, 3]


def test_a_memory_not_made_from_a_state_is_not_rewound(component: Component) -> None:
    """Fresh from the image: no state says which pages hold what, so no rewind."""
    _made_from, goal = _states(component, [], [(20, 2)])
    with Instance(component) as instance:
        instance.call("poke", 30, 3)
        assert not instance.rewind(goal)
        assert instance.call("peek", 30) == 3


def test_a_closed_instance_is_not_rewound(component: Component) -> None:
    """After close there is no memory to rewind."""
    made_from, goal = _states(component, [], [])
    instance = Instance(component, memory=made_from)
    instance.close()
    assert not instance.rewind(goal)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(pokes=_pokes, back=st.lists(st.integers(0, _SIZE - 1), max_size=10))
def test_a_capture_keeps_the_same_pages_compiled_or_in_python(
    component: Component, monkeypatch: pytest.MonkeyPatch, pokes: Pokes, back: list[int]
) -> None:
    """A capture keeps exactly the pages that differ from the image (or zeros), compiled compare
    or pure Python; pages written back to what they held are dropped both ways."""
    model = _model()
    with Instance(component) as instance:
        _poke(instance, model, pokes)
        _poke(instance, model, [(at, _model()[at]) for at in back])  # written back unchanged
        captured: dict[str, MemoryState] = {}
        for path in _PATHS:
            monkeypatch.setenv("MIGHTY_PURE_PYTHON", "1" if path == "pure" else "0")
            captured[path] = instance.capture_memory(exact=True)
    states = list(captured.values())
    pages = [dict(state.pages()) for state in states]
    assert all(p == pages[0] for p in pages)
    image = _model()
    expected = {
        at
        for at in range(0, _SIZE, _HOST_PAGE)
        if model[at : at + _HOST_PAGE] != image[at : at + _HOST_PAGE]
    }
    kept = {
        at + i
        for state in states[:1]
        for at, length, _ in state.ranges
        for i in range(0, length, _HOST_PAGE)
    }
    assert kept == expected
    with Instance(component, memory=states[0]) as copy:
        assert copy.call("hash", _SIZE) == _fnv(model)


# -- recycled memories: a freed memory made from a state serves the next one made from it -----


def _kept(source: object) -> int:
    """How many freed mappings are kept for ``source`` (a state or an image)."""
    with _memory._MEMORIES_LOCK:
        return len(_memory._REUSED.get(id(source), ()))


def _base_of(instance: Instance) -> int:
    """The address of ``instance``'s one linear memory."""
    account = instance._meter.account
    with _memory._MEMORIES_LOCK:
        bases = [m.base for m in _memory._MEMORIES.values() if m.account is account]
    assert len(bases) == 1
    return bases[0]


_grown = st.lists(st.tuples(st.integers(0, _PAGE - 1), st.integers(1, 255)), max_size=10)


@pytest.mark.parametrize("path", _PATHS)
@pytest.mark.parametrize("source", ["state", "image"])
@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(base=_pokes, used=_pokes, grow=st.booleans(), grown=_grown, again=_pokes)
def test_a_freed_memory_serves_the_next_instance_made_alike_byte_for_byte(
    component: Component,
    monkeypatch: pytest.MonkeyPatch,
    path: str,
    source: str,
    base: Pokes,
    used: Pokes,
    grow: bool,
    grown: Pokes,
    again: Pokes,
) -> None:
    """An instance made from a state (or fresh from the image), written anywhere, grown and
    written past its old end, then closed: the next instance made alike gets the same mapping,
    holding the state (or the image) byte for byte, its size the original, and what the first
    grew into zeros again."""
    monkeypatch.setenv("MIGHTY_PURE_PYTHON", "1" if path == "pure" else "0")
    expected = _model()
    made_from: MemoryState | None = None
    if source == "state":
        made_from, _goal = _states(component, base, [])
        for at, value in base:
            expected[at] = value
    key: object = made_from if made_from is not None else component.images[0]
    with Instance(component, memory=made_from) as first:
        _poke(first, bytearray(_SIZE), used)
        if grow:
            assert first.call("grow", 1) == _PAGES
            _poke(first, bytearray(_SIZE + _PAGE), [(_SIZE + at, v) for at, v in grown])
        address = _base_of(first)
    for writes in ([], again):  # a mapping served twice is exact the second time too
        before = _kept(key)
        assert before >= 1
        with Instance(component, memory=made_from) as second:
            assert _kept(key) == before - 1, "no freed mapping was taken"
            if source == "state":  # the image's may be another test's instance's
                assert _base_of(second) == address
            assert second.call("hash", _SIZE) == _fnv(expected)
            for at, _value in used[:5]:
                assert second.call("peek", at) == expected[at]
            assert second.call("grow", 1) == _PAGES  # the original size, not the grown one
            for at, _value in grown:
                assert second.call("peek", _SIZE + at) == 0
            _poke(second, bytearray(_SIZE), writes)


def test_a_mapping_is_kept_only_within_its_bounds_and_while_its_state_lives(
    component: Component, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kept within the bounds only (its own pages; past the totals the mapping kept longest ago
    is unmapped), for what the memory was made from, and unmapped with it."""
    made_from, _goal = _states(component, [(10, 1)], [])
    assert _kept(made_from) == 1  # the instance _states made from it
    with Instance(component, memory=made_from) as instance:
        assert _kept(made_from) == 0
        instance.call("poke", 4096 * 5, 7)
    assert _kept(made_from) == 1  # taken, and kept again
    with Instance(component) as fresh:  # from the image: kept for the image, not the state
        fresh.call("poke", 30, 3)
    assert _kept(made_from) == 1
    monkeypatch.setattr(_memory, "_REUSE_MAX_OWN", 1)
    with Instance(component, memory=made_from) as busy:  # takes the kept one, writes 2 pages
        busy.call("poke", 0, 1)
        busy.call("poke", 4096 * 9, 1)
    assert _kept(made_from) == 0  # over the bound: given back to the kernel
    monkeypatch.undo()
    monkeypatch.setattr(_memory, "_REUSE_MAX_TOTAL", 0)  # no room even for one
    with Instance(component, memory=made_from) as instance:
        instance.call("poke", 0, 2)
    assert _kept(made_from) == 0  # over the bound of all kept pages together
    monkeypatch.undo()
    other, _other_goal = _states(component, [(20, 2)], [])  # kept one for `other`
    with Instance(component, memory=made_from) as instance:
        instance.call("poke", 0, 2)
    assert _kept(made_from) == 1 and _kept(other) == 1
    monkeypatch.setattr(_memory, "_REUSE_MAX", 1)
    with Instance(component, memory=other) as instance:  # taken and kept again: the newest
        instance.call("poke", 0, 3)
    assert _kept(other) == 1 and _kept(made_from) == 0  # the older ones made room
    monkeypatch.undo()
    with Instance(component, memory=made_from) as instance:
        instance.call("poke", 0, 2)
    assert _kept(made_from) == 1
    count, key = _memory._reuse_count, id(made_from)
    del made_from, _goal
    gc.collect()
    assert key not in _memory._REUSED
    assert _memory._reuse_count <= count - 1
