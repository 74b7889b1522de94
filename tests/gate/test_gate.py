"""The gate: every import through one trampoline, resources, hooks, and failures kept apart."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pytest
import wasmtime

from mighty import (
    Budget,
    Cancelled,
    CancelScope,
    Component,
    DeadlineExceeded,
    GuestExit,
    GuestTrap,
    Instance,
    InvalidComponent,
    MissingImports,
)
from mighty.budget import CallScope
from mighty.engine import get_engine
from mighty.gate import (
    UNSCOPED,
    Binding,
    Gate,
    GuestContext,
    GuestViolation,
    HostFunctionFailed,
    MissingSlot,
    ResourceKind,
    Slot,
    request_exit,
)
from mighty.gate._gate import _BY_ADDRESS

_API_STATE: Slot[str] = Slot("api")

API = """
(component
  (import "t:x/api" (instance $api
    (export "r" (type $r (sub resource)))
    (export "make" (func (param "v" u32) (result (own $r))))
    (export "two" (func (param "a" (borrow $r)) (param "b" (borrow $r)) (result u32)))
    (export "one" (func (param "a" (borrow $r)) (result u32)))
    (export "act" (func (param "how" u32) (result u32)))
  ))
  (alias export $api "r" (type $r))
  (core func $make (canon lower (func $api "make")))
  (core func $two (canon lower (func $api "two")))
  (core func $one (canon lower (func $api "one")))
  (core func $act (canon lower (func $api "act")))
  (core func $drop (canon resource.drop $r))
  (core module $m
    (import "api" "make" (func $make (param i32) (result i32)))
    (import "api" "two" (func $two (param i32 i32) (result i32)))
    (import "api" "one" (func $one (param i32) (result i32)))
    (import "api" "act" (func $act (param i32) (result i32)))
    (import "api" "drop" (func $drop (param i32)))
    (func (export "pair") (param $x i32) (param $y i32) (result i32) (local $h i32) (local $g i32)
      local.get $x call $make local.set $h
      local.get $y call $make local.set $g
      local.get $h local.get $g call $two
      local.get $h call $drop
      local.get $g call $drop)
    (func (export "same") (param $x i32) (result i32) (local $h i32)
      local.get $x call $make local.set $h
      local.get $h local.get $h call $two
      local.get $h call $drop)
    (func (export "keep") (param $x i32) (result i32)
      local.get $x call $make call $one)
    (func (export "act") (param i32) (result i32) local.get 0 call $act)
    (func (export "forge") (param $h i32) (result i32) local.get $h call $one))
  (core instance $i (instantiate $m (with "api" (instance
     (export "make" (func $make)) (export "two" (func $two)) (export "one" (func $one))
     (export "act" (func $act)) (export "drop" (func $drop))))))
  (func (export "pair") (param "x" u32) (param "y" u32) (result u32) (canon lift (core func $i "pair")))
  (func (export "same") (param "x" u32) (result u32) (canon lift (core func $i "same")))
  (func (export "keep") (param "x" u32) (result u32) (canon lift (core func $i "keep")))
  (func (export "act") (param "how" u32) (result u32) (canon lift (core func $i "act")))
  (func (export "forge") (param "h" u32) (result u32) (canon lift (core func $i "forge")))
)
"""

R_DROPPED: list[int] = []
R = ResourceKind("t:x/api", "r", on_drop=lambda _ctx, obj: R_DROPPED.append(obj))


SCOPES: list[object] = []


def _act(ctx: GuestContext, how: int) -> int:
    if how == 8:
        SCOPES.append(ctx.scope)
    if how == 9:
        ctx.scope.wait(threading.Event(), 30.0)  # until the call's scope stops it
    if how == 1:
        raise KeyError("host bug")
    if how == 2:
        raise GuestViolation("the guest asked for something the WIT forbids")
    if how == 3:
        request_exit(7)
    return how * 10


class Api:
    """A small provider: a resource holding an int, and functions over it."""

    def resources(self) -> Iterable[ResourceKind]:
        return [R]

    def bindings(self) -> Iterable[Binding]:
        return [
            Binding("t:x/api", "make", lambda ctx, v: ctx.new(R, v)),
            Binding("t:x/api", "two", lambda _ctx, a, b: a * 1000 + b),
            Binding("t:x/api", "one", lambda _ctx, a: a),
            Binding("t:x/api", "act", _act),
        ]

    def setup(self, ctx: GuestContext) -> None:
        ctx.put(_API_STATE, "ready")


@pytest.fixture(scope="module")
def component(wat: Callable[[str], bytes]) -> Component:
    """The resource test component."""
    return Component.load(wat(API))


@pytest.fixture
def gate() -> Gate:
    """A gate serving only the test API."""
    return Gate([Api()])


def test_two_borrowed_handles_in_one_call(component: Component, gate: Gate) -> None:
    """An import taking two borrows gets both host objects (wasmtime 50.0.1 trapped here)."""
    with Instance(component, gate=gate) as instance:
        assert instance.call("pair", 3, 4) == 3004


def test_the_same_handle_borrowed_twice(component: Component, gate: Gate) -> None:
    """Two borrows of one handle resolve to the same object."""
    with Instance(component, gate=gate) as instance:
        assert instance.call("same", 9) == 9009


def test_drop_reaches_the_host_and_frees_the_table(component: Component, gate: Gate) -> None:
    """A guest dropping its handle runs the kind's on_drop and empties the table."""
    R_DROPPED.clear()
    with Instance(component, gate=gate) as instance:
        instance.call("pair", 5, 6)
        assert sorted(R_DROPPED) == [5, 6]
        assert instance.context.live(R) == 0
        instance.call("keep", 8)  # not dropped by the guest
        assert instance.context.live(R) == 1


def test_host_exception_is_host_function_failed(component: Component, gate: Gate) -> None:
    """A host function raising is a HostFunctionFailed carrying the exception, not a trap."""
    with Instance(component, gate=gate) as instance:
        with pytest.raises(HostFunctionFailed) as info:
            instance.call("act", 1)
        assert isinstance(info.value.__cause__, KeyError)


def test_guest_violation_is_a_trap(component: Component, gate: Gate) -> None:
    """GuestViolation from a host function is the guest's fault: a GuestTrap."""
    with Instance(component, gate=gate) as instance, pytest.raises(GuestTrap) as info:
        instance.call("act", 2)
    assert info.value.trap_code == "contract_violation"
    assert "forbids" in info.value.message


def test_request_exit_is_guest_exit(component: Component, gate: Gate) -> None:
    """request_exit from a host function ends the call with GuestExit and the code."""
    with Instance(component, gate=gate) as instance, pytest.raises(GuestExit) as info:
        instance.call("act", 3)
    assert info.value.code == 7


def test_hooks_wrap_every_call_in_order(component: Component, gate: Gate) -> None:
    """Hooks see each import with its arguments and may change the result; outer hook first."""
    seen: list[tuple[str, str, tuple[Any, ...]]] = []

    def hook(tag: str) -> Callable[..., Any]:
        def around(
            ctx: GuestContext, binding: Binding, args: Sequence[Any], call: Callable[[], Any]
        ) -> Any:
            seen.append((tag, binding.name, tuple(args)))
            result = call()
            return result + 1 if binding.name == "act" and tag == "outer" else result

        return around

    with Instance(component, gate=gate, hooks=[hook("outer"), hook("inner")]) as instance:
        assert instance.call("act", 4) == 41
    assert seen == [("outer", "act", (4,)), ("inner", "act", (4,))]


def test_replaying_hook_need_not_call_the_host(component: Component, gate: Gate) -> None:
    """A hook can answer from elsewhere (as a replayer will) without running the function."""

    def replay(
        ctx: GuestContext, binding: Binding, args: Sequence[Any], call: Callable[[], Any]
    ) -> Any:
        return 99

    with Instance(component, gate=gate, hooks=[replay]) as instance:
        assert instance.call("act", 1) == 99  # `act(1)` would have raised


def test_missing_interfaces_are_all_named(component: Component) -> None:
    """A gate lacking an interface refuses to link and names each missing import."""
    with pytest.raises(MissingImports) as info:
        Instance(component, gate=Gate([]))
    assert info.value.missing == ("t:x/api",)


def test_imports_wasmtime_refuses_to_link_are_an_invalid_component(gate: Gate) -> None:
    """An import list wasmtime cannot link (a name twice) is our typed error, its cause kept."""
    with pytest.raises(InvalidComponent, match="defined twice") as info:
        gate.linker_for(get_engine(), ["t:x/api", "t:x/api"], "twice.wasm", [])
    assert "twice.wasm" in info.value.message
    assert isinstance(info.value.__cause__, wasmtime.WasmtimeError)


def test_provider_setup_runs_per_instance(component: Component, gate: Gate) -> None:
    """Each instance gets its own context, set up by every provider."""
    with Instance(component, gate=gate) as a, Instance(component, gate=gate) as b:
        assert a.context is not b.context
        assert a.context.slot(_API_STATE) == b.context.slot(_API_STATE) == "ready"
        a.context.take(_API_STATE)
        assert a.context.find(_API_STATE) is None
        assert b.context.slot(_API_STATE) == "ready"
        with pytest.raises(MissingSlot, match="api"):
            a.context.slot(_API_STATE)


def test_every_host_function_gets_the_calls_scope(component: Component, gate: Gate) -> None:
    """During a call ``ctx.scope`` is that call's CallScope; between calls it is UNSCOPED."""
    SCOPES.clear()
    with Instance(component, gate=gate) as instance:
        assert instance.call("act", 8) == 80
        assert instance.call("act", 8) == 80
        assert instance.context.scope is UNSCOPED
    first, second = SCOPES
    assert isinstance(first, CallScope) and isinstance(second, CallScope)
    assert first is not second


def test_a_stop_seen_in_a_host_wait_is_the_calls_typed_error(
    component: Component, gate: Gate
) -> None:
    """A cancel or the deadline while a host function waits ends the call with that error."""
    cancel = CancelScope()
    timer = threading.Timer(0.05, cancel.cancel, args=("stop",))
    timer.start()
    with Instance(component, gate=gate) as instance, pytest.raises(Cancelled) as info:
        instance.call("act", 9, cancel=cancel)
    timer.join()
    assert (info.value.by, info.value.reason) == ("host", "stop")
    assert cancel.cancelled_caught and info.value.usage is not None
    with Instance(component, gate=gate) as instance, pytest.raises(DeadlineExceeded):
        instance.call("act", 9, budget=Budget(timeout=0.1))


def test_budget_still_applies_through_the_gate(component: Component, gate: Gate) -> None:
    """Calls that go through the gate still run under the instance's budget."""
    with Instance(component, gate=gate, budget=Budget(fuel=10_000)) as instance:
        assert instance.call("act", 5) == 50
        assert instance.last_usage is not None
        assert 0 < instance.last_usage.fuel <= 10_000


@pytest.mark.parametrize("handle", [0, 1, 99, 2**31, 2**32 - 1])
def test_forged_handles_trap_before_reaching_the_host(
    component: Component, gate: Gate, handle: int
) -> None:
    """A handle the guest was never given traps in wasmtime's handle table; the host is unharmed."""
    calls: list[str] = []

    def spy(
        ctx: GuestContext, binding: Binding, args: Sequence[Any], call: Callable[[], Any]
    ) -> Any:
        calls.append(binding.name)
        return call()

    with Instance(component, gate=gate, hooks=[spy]) as instance, pytest.raises(GuestTrap):
        instance.call("forge", handle)
    assert "one" not in calls
    with Instance(component, gate=gate) as fresh:
        assert fresh.call("pair", 1, 2) == 1002


def test_a_store_where_a_closed_one_was_is_served_as_its_own(
    component: Component, gate: Gate
) -> None:
    """Imports find their instance by the address of its store's context: a new store at the
    address of a closed one whose context is not released yet is served with its own context,
    and releasing the old context then does not forget the new one."""
    engine = get_engine()
    linker = gate.linker_for(engine, component.imports, "test")
    reused = 0
    # Until the allocator has given a freed store's address to a new one a few times (it
    # usually does at once; other threads' allocations can take a freed block first).
    for _ in range(500):
        if reused >= 3:
            break
        old_store = wasmtime.Store(engine)
        old = gate.context(old_store)
        old_store.close()
        new_store = wasmtime.Store(engine)
        new_store.set_fuel(10**9)
        new_store.set_epoch_deadline(10**9)
        new = gate.context(new_store)
        reused += new._address == old._address
        act = linker.instantiate(new_store, component.wasm).get_func(new_store, "act")
        assert act is not None
        assert act(new_store, 4) == 40
        gate.release(old)
        assert _BY_ADDRESS[new._address]() is new  # still found without a C call
        assert act(new_store, 5) == 50
        assert (old.calls, new.calls) == (0, 2)
        new_store.close()
        gate.release(new)
    assert reused  # the allocator gave a freed store's address to a new one


def test_each_calls_outcome_is_its_own(component: Component, gate: Gate) -> None:
    """A host function's failure and the guest's exit are reported to the scope of the call
    they happen in: instances made one after another on one gate each end as their own call
    did, and a call that answered normally reports neither."""
    outcomes: list[str] = []
    for how in (1, 3, 4, 1, 4):
        with Instance(component, gate=gate) as instance:
            try:
                outcomes.append(str(instance.call("act", how)))
            except HostFunctionFailed as failed:
                outcomes.append(type(failed.__cause__).__name__)
            except GuestExit as exited:
                outcomes.append(f"exit {exited.code}")
    assert outcomes == ["KeyError", "exit 7", "40", "KeyError", "40"]
