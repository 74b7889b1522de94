"""The gate's tapped frames: a hook that taps an import sees what ``watch_import`` would have
seen (a method's resource as its rep), a failed call still goes to ``watch_import`` with
Handles, and a stale handle reaches neither. Real instances of the WAT component of
test_methods (methods with and without an argument, an int argument, records and byte lists
as results, a constructor returning a resource)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mighty import Component, Instance
from mighty.gate import (
    Binding,
    Gate,
    GuestContext,
    Handle,
    HostFunctionFailed,
    ResourceKind,
    StaleHandle,
)
from tests.gate.test_methods import WAT, Api, R


class Watcher:
    """A hook that only watches: every import goes to watch_import (the general path)."""

    fuel_limit = 0

    def __init__(self) -> None:
        self.seen: list[tuple[str, list[Any], Any, bool]] = []

    def __call__(
        self, ctx: GuestContext, binding: Binding, args: Sequence[Any], call: Callable[[], Any]
    ) -> Any:
        raise AssertionError("a watching hook alone is never called around the import")

    def watch_import(
        self, ctx: GuestContext, binding: Binding, args: Sequence[Any], value: Any, failed: bool
    ) -> None:
        self.seen.append((binding.name, list(args), repr(value) if failed else value, failed))


class Tapper(Watcher):
    """A hook that taps every import the gate lets it: what it sees, as watch_import would."""

    def __init__(self) -> None:
        super().__init__()
        self.taps = 0
        self.asked: list[tuple[str, int, ResourceKind | None]] = []

    def tap_import(
        self, binding: Binding, nparams: int, self_kind: ResourceKind | None
    ) -> Callable[..., None]:
        self.asked.append((binding.name, nparams, self_kind))

        def tap(context_ptr: int, result: Any, *args: Any) -> None:
            assert type(context_ptr) is int and context_ptr
            self.taps += 1
            given = list(args)
            if self_kind is not None:
                given[0] = Handle(self_kind, given[0])
            self.seen.append((binding.name, given, result, False))

        return tap


def _run(component: Component, hook: Watcher, steps: list[tuple[str, int]]) -> list[Any]:
    out: list[Any] = []
    with Instance(component, gate=Gate([Failing()]), hooks=[hook]) as instance:
        handle = instance.call("make", 7)
        for export, value in steps:
            try:
                if export in ("get",):
                    out.append(instance.call(export, handle))
                elif export == "add":
                    out.append(instance.call(export, handle, value))
                else:
                    out.append(instance.call(export, value))
            except HostFunctionFailed as exc:
                out.append(type(exc.__cause__).__name__)
                break  # the instance is unusable after a host failure
    return out


class Failing(Api):
    """The test_methods API, but ``repeat`` of 13 bytes raises (a host bug)."""

    def bindings(self) -> Iterable[Binding]:
        return [
            Binding(b.interface, b.name, _repeat) if b.name == "repeat" else b
            for b in super().bindings()
        ]


def _repeat(_ctx: GuestContext, n: int) -> bytes:
    if n == 13:
        raise RuntimeError("thirteen")
    return bytes(i % 256 for i in range(n))


@pytest.fixture(scope="module")
def component(wat: Callable[[str], bytes]) -> Component:
    return Component.load(wat(WAT))


calls = st.lists(
    st.tuples(
        st.sampled_from(["get", "add", "split", "repeat"]),
        st.integers(0, 20) | st.sampled_from([-1, -2, 13, 2**31]),
    ),
    max_size=8,
)


@settings(max_examples=25, deadline=None)
@given(calls)
def test_a_tap_sees_what_watch_import_sees(component: Component, steps: list[Any]) -> None:
    """Tapped or watched, the hook sees the same imports, arguments and results, and the
    guest gets the same answers (a wrong record from the host is seen, then refused)."""
    # split takes any s64 (-1 and -2 are wrong records); add a u32; repeat a small length.
    steps = [(e, v % 2**32 if e == "add" else v if e == "split" else v % 64) for e, v in steps]
    watcher, tapper = Watcher(), Tapper()
    assert _run(component, watcher, steps) == _run(component, tapper, steps)
    assert tapper.seen == watcher.seen
    failed = sum(1 for *_, f in tapper.seen if f)
    assert tapper.taps == len(tapper.seen) - failed
    # Asked once per import, a method with its resource's kind (its rep counted in nparams).
    names = [name for name, _, _ in tapper.asked]
    assert sorted(names) == sorted({name for name, *_ in tapper.seen})
    for name, nparams, kind in tapper.asked:
        assert kind is (R if name.startswith("[method]") else None)
        assert nparams == {"[method]r.get": 1}.get(name, 1 if kind is None else 2)


def test_a_failed_call_goes_to_watch_import(component: Component) -> None:
    tapper = Tapper()
    assert _run(component, tapper, [("repeat", 2), ("repeat", 13)]) == [65538, "RuntimeError"]
    assert [(name, args, failed) for name, args, _, failed in tapper.seen] == [
        ("[constructor]r", [7], False),
        ("repeat", [2], False),
        ("repeat", [13], True),
    ]
    assert "thirteen" in tapper.seen[2][2]


def test_a_stale_handle_reaches_neither(component: Component) -> None:
    """A live guest handle whose host object left the table: StaleHandle before the
    implementation runs, and no record of it (as on the general path)."""
    for export, extra in (("get", ()), ("add", (1,))):
        tapper = Tapper()
        with Instance(component, gate=Gate([Api()]), hooks=[tapper]) as instance:
            h = instance.call("make", 5)
            (rep,) = [rep for name, rep in instance.context.holdings() if name == "t:m/api/r"]
            instance.context._drop(R.type_id, rep)
            with pytest.raises(HostFunctionFailed) as info:
                instance.call(export, h, *extra)
            assert isinstance(info.value.__cause__, StaleHandle)
        assert [name for name, *_ in tapper.seen] == ["[constructor]r"]


def test_a_hook_that_taps_nothing_is_watched(component: Component) -> None:
    """tap_import returning None: that import goes to watch_import."""

    class Refusing(Tapper):
        def tap_import(self, binding: Binding, nparams: int, self_kind: Any) -> Any:
            return None

    hook = Refusing()
    assert _run(component, hook, [("get", 0), ("split", 5)]) == [7, 5]
    assert [(name, failed) for name, _, _, failed in hook.seen] == [
        ("[constructor]r", False),
        ("[method]r.get", False),
        ("split", False),
    ]
    assert hook.taps == 0
