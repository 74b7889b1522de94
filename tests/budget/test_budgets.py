"""Every budget kind is triggered by a real guest and reported with the right typed error."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mighty import (
    Budget,
    Cancelled,
    CancelScope,
    Component,
    DeadlineExceeded,
    GuestExit,
    GuestTrap,
    Instance,
    OutOfFuel,
    OutOfMemory,
)

PAGE = 65536


@pytest.fixture
def guest(budget_wasm: bytes) -> Instance:
    """A fresh instance of the budget test guest."""
    return Instance(Component.load(budget_wasm))


def test_fuel_exhaustion_is_out_of_fuel(guest: Instance) -> None:
    """An endless loop with a fuel budget stops with OutOfFuel and reports all fuel used."""
    with pytest.raises(OutOfFuel) as info:
        guest.call("spin", budget=Budget(fuel=1_000_000))
    assert info.value.kind == "out_of_fuel"
    assert info.value.usage is not None
    assert info.value.usage.fuel == 1_000_000


def test_fuel_used_is_deterministic_and_exact(guest: Instance, budget_wasm: bytes) -> None:
    """The same call uses the same fuel every time, and more work uses more fuel."""
    _, first = guest.call_with_usage("count", 10_000)
    _, again = guest.call_with_usage("count", 10_000)
    _, more = guest.call_with_usage("count", 20_000)
    assert first.fuel == again.fuel > 0
    assert more.fuel > first.fuel


def test_enough_fuel_returns_the_result(guest: Instance) -> None:
    """A call within its fuel returns normally."""
    assert guest.call("count", 1000, budget=Budget(fuel=10_000_000)) == 1000


def test_deadline_stops_an_endless_loop(guest: Instance) -> None:
    """An endless loop with plenty of fuel is stopped by the wall-clock deadline."""
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded) as info:
        guest.call("spin", budget=Budget(fuel=10**18, timeout=0.2))
    assert info.value.kind == "deadline_exceeded"
    assert info.value.timeout == 0.2
    assert time.monotonic() - started >= 0.2
    assert info.value.usage is not None and info.value.usage.wall_time >= 0.2


@pytest.mark.timing
def test_deadline_is_rearmed_for_every_call(budget_wasm: bytes) -> None:
    """Each call gets its full timeout: several short calls add up past one timeout."""
    component = Component.load(budget_wasm)
    # 1 s per call (not 0.3 s) leaves a loaded machine room for the call's own work; the idle
    # time between the calls (1.5 s) still adds up past it.
    with Instance(component, budget=Budget(timeout=1.0)) as instance:
        for _ in range(5):
            time.sleep(0.3)  # idle time between calls must not count
            assert instance.call("count", 1000) == 1000


def test_cancel_from_another_thread(guest: Instance) -> None:
    """cancel(reason) from another thread stops a running guest with Cancelled and the reason."""
    scope = CancelScope()
    timer = threading.Timer(0.1, scope.cancel, args=("user pressed stop",))
    timer.start()
    with pytest.raises(Cancelled) as info:
        guest.call("spin", budget=Budget(fuel=10**18, timeout=30), cancel=scope)
    timer.join()
    assert info.value.reason == "user pressed stop"
    assert scope.cancel_called and scope.cancelled_caught


def test_cancel_before_the_call_never_enters_the_guest(guest: Instance) -> None:
    """A scope cancelled before the call fails it at once and leaves the instance usable."""
    scope = CancelScope()
    scope.cancel("too late")
    with pytest.raises(Cancelled):
        guest.call("count", 5, cancel=scope)
    assert guest.call("count", 5) == 5


def test_cancel_requested_but_not_needed(guest: Instance) -> None:
    """A scope never cancelled does not count as caught."""
    scope = CancelScope()
    assert guest.call("count", 5, cancel=scope) == 5
    assert not scope.cancel_called and not scope.cancelled_caught


def test_memory_ceiling_is_out_of_memory(budget_wasm: bytes) -> None:
    """Growing linear memory past the ceiling is OutOfMemory naming the request and the limit."""
    component = Component.load(budget_wasm)
    with Instance(component, budget=Budget(memory=16 * PAGE)) as instance:
        assert instance.call("grow", 4) == 1  # returns the old size in pages
        with pytest.raises(OutOfMemory) as info:
            instance.call("grow", 100)
    assert info.value.limit == 16 * PAGE
    assert info.value.requested == 105 * PAGE
    assert info.value.kind == "out_of_memory"


def test_peak_memory_is_reported(budget_wasm: bytes) -> None:
    """Usage reports the linear memory size reached during the call."""
    with Instance(Component.load(budget_wasm)) as instance:
        _, before = instance.call_with_usage("grow", 0)
        _, after = instance.call_with_usage("grow", 10)
    assert before.memory_peak == PAGE
    assert after.memory_peak == 11 * PAGE


@given(pages=st.lists(st.integers(min_value=0, max_value=20), min_size=1, max_size=6))
def test_memory_accounting_matches_grows(budget_wasm: bytes, pages: list[int]) -> None:
    """Whatever the sequence of grows, the peak equals one page plus every page granted."""
    limit = 40 * PAGE
    with Instance(Component.load(budget_wasm), budget=Budget(memory=limit)) as instance:
        size = 1
        for grow in pages:
            if (size + grow) * PAGE > limit:
                with pytest.raises(OutOfMemory):
                    instance.call("grow", grow)
                return
            assert instance.call("grow", grow) == size
            size += grow
            assert instance.last_usage is not None
            assert instance.last_usage.memory_peak == size * PAGE


def test_trap_is_guest_trap_with_backtrace(guest: Instance) -> None:
    """`unreachable` is a GuestTrap with the trap code and a wasm backtrace."""
    with pytest.raises(GuestTrap) as info:
        guest.call("boom")
    assert info.value.trap_code == "unreachable"
    assert info.value.kind == "trap"
    assert "boom" in info.value.wasm_backtrace or info.value.wasm_backtrace


def test_stack_overflow_is_a_trap(guest: Instance) -> None:
    """Unbounded recursion is a GuestTrap with the stack_overflow code, not a host crash."""
    with pytest.raises(GuestTrap) as info:
        guest.call("recurse", 0)
    assert info.value.trap_code == "stack_overflow"


@pytest.mark.parametrize("code", [0, 1])
def test_exit_is_guest_exit(budget_wasm: bytes, code: int) -> None:
    """A guest calling wasi:cli/exit raises GuestExit with its status."""
    with Instance(Component.load(budget_wasm)) as instance, pytest.raises(GuestExit) as info:
        instance.call("quit", code)
    assert info.value.code == code
    assert info.value.kind == "guest_exit"


def test_instance_is_unusable_after_a_failure(guest: Instance) -> None:
    """After a trap every further call fails clearly instead of touching broken state."""
    with pytest.raises(GuestTrap):
        guest.call("boom")
    with pytest.raises(GuestTrap, match="unusable after an earlier failure"):
        guest.call("add", 1, 2)


def test_budget_validation() -> None:
    """Budgets reject nonsense values with a message naming the field."""
    with pytest.raises(ValueError, match="fuel"):
        Budget(fuel=0)
    with pytest.raises(TypeError, match="fuel"):
        Budget(fuel=True)
    with pytest.raises(ValueError, match="memory"):
        Budget(memory=-1)
    with pytest.raises(ValueError, match="timeout"):
        Budget(timeout=float("inf"))
    assert Budget().replace(fuel=5).fuel == 5


def test_threads_run_guests_in_parallel(budget_wasm: bytes) -> None:
    """Two instances on two threads each finish their own work without interfering."""
    component = Component.load(budget_wasm)
    results: dict[int, int] = {}

    def work(n: int) -> None:
        with Instance(component) as instance:
            results[n] = instance.call("count", 200_000 + n)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == {n: 200_000 + n for n in range(4)}


@pytest.mark.timing
def test_budget_pause_moves_the_deadline(guest: Instance) -> None:
    """Time spent inside ``ctx.scope.paused()`` is not charged to the call's deadline."""
    from mighty.budget import Meter
    from mighty.gate import Gate

    # A 1 s deadline (not 0.2 s) for the unpaused rest, which a loaded machine may slow.
    meter = Meter(Budget(timeout=1.0))
    ctx = Gate([]).context(meter.store)

    def work() -> str:
        with ctx.scope.paused():
            time.sleep(1.2)
            ctx.scope.checkpoint()  # paused: the guest's clock stands still
        ctx.scope.checkpoint()  # raises if the deadline had passed
        return "done"

    result, usage = meter.run(work, Budget(timeout=1.0), ctx=ctx)
    assert result == "done"
    assert usage.wall_time >= 1.2
