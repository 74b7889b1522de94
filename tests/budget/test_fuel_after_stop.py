"""Fuel reported for a call its deadline stopped is what it spent, not what wasmtime had written
back (wasmtime keeps a loop's count in a local until its next call: a tight loop stopped by the
epoch reported 0, CPython's ``while True: pass`` ~500k for a second of work).

Each test compares the reported fuel with a run of the same loop under a fuel budget (where
wasmtime's count is exact) in thread CPU time, with margins far wider than any machine's
noise: the subject is a 1000x under-count, not a few percent.
"""

from __future__ import annotations

import time

import pytest

from mighty import Budget, Component, DeadlineExceeded, Instance, OutOfFuel
from mighty.engine import EPOCH_TICK

FUEL_RUN = 500_000_000


def _fuel_rate(run: object) -> float:
    """Fuel per CPU second of ``run()``, a call that ends out of its FUEL_RUN fuel."""
    began = time.thread_time()
    run()  # type: ignore[operator]
    return FUEL_RUN / max(time.thread_time() - began, 1e-6)


@pytest.mark.timing
def test_a_tight_loop_stopped_by_its_deadline_reports_the_fuel_it_spent(
    budget_wasm: bytes,
) -> None:
    """A WAT ``(loop (br 0))`` under a 0.3 s deadline reports at least a tick of its own fuel
    rate, and at least a twentieth of what its CPU time burns (it reported 0)."""
    component = Component.load(budget_wasm)

    def out_of_fuel() -> None:
        with pytest.raises(OutOfFuel):
            Instance(component).call("spin", budget=Budget(fuel=FUEL_RUN, timeout=600))

    rate = _fuel_rate(out_of_fuel)
    guest = Instance(component)
    began = time.thread_time()
    with pytest.raises(DeadlineExceeded) as info:
        guest.call("spin", budget=Budget(fuel=10**15, timeout=0.3))
    cpu = time.thread_time() - began
    usage = info.value.usage
    assert usage is not None
    assert usage.fuel >= rate * EPOCH_TICK
    assert usage.fuel >= rate * cpu / 20
    assert usage.fuel <= 10**15


@pytest.mark.timing
def test_while_true_pass_in_the_sandbox_reports_the_fuel_it_spent(interpreter: Component) -> None:
    """The sandbox's ``while True: pass`` stopped by ``Limits(timeout=1.0)`` reports within 5x
    of the fuel its CPU time burns in a fuel-limited run of the same code (it reported ~500k,
    1,000x under)."""
    from mighty.sandbox import Limits, Sandbox

    with Sandbox(limits=Limits(fuel=10**12, timeout=600)) as box:
        box.run("pass")  # the interpreter is set up before anything is measured

        def out_of_fuel() -> None:
            result = box.run("while True: pass", limits=Limits(fuel=FUEL_RUN, timeout=600))
            assert result.error is not None and result.error.kind == "out_of_fuel"

        rate = _fuel_rate(out_of_fuel)
        began = time.thread_time()
        result = box.run("while True: pass", limits=Limits(fuel=10**12, timeout=1.0))
        cpu = time.thread_time() - began
    assert result.error is not None and result.error.kind == "deadline_exceeded"
    assert result.usage.fuel >= rate * EPOCH_TICK
    assert rate * cpu / 5 <= result.usage.fuel <= rate * cpu * 5
