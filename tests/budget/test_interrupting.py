"""``interrupting(signum)``: every guest call in the process stops, running or starting."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from mighty import BadInput, Budget, Cancelled, Component, Instance
from mighty.budget import _budget, interrupting

# Far more than the test lasts: only the interrupt can end these calls.
LONG = Budget(fuel=10**18, timeout=600)


def _spin(guest: Instance, outcomes: list[BaseException]) -> None:
    try:
        guest.call("spin", budget=LONG)
    except BaseException as exc:  # noqa: BLE001 - the outcome is the test's subject
        outcomes.append(exc)


def _until_running(count: int) -> None:
    """Wait (a bounded poll, not a timing assertion) until ``count`` calls are in the registry."""
    give_up = time.monotonic() + 120
    while len(_budget._ACTIVE) < count:
        assert time.monotonic() < give_up, "the guest calls never started"
        time.sleep(0.01)


@pytest.mark.timing
def test_running_calls_on_other_threads_stop_cancelled_by_the_signal(budget_wasm: bytes) -> None:
    """Two spinning calls on two threads both end Cancelled(reason="interrupted", by="signal")."""
    component = Component.load(budget_wasm)
    guests = [Instance(component), Instance(component)]
    outcomes: list[BaseException] = []
    threads = [threading.Thread(target=_spin, args=(g, outcomes)) for g in guests]
    for thread in threads:
        thread.start()
    _until_running(2)
    with interrupting(signal.SIGTERM) as running:
        assert running >= 2
        for thread in threads:
            thread.join()
    assert len(outcomes) == 2
    for exc in outcomes:
        assert isinstance(exc, Cancelled), exc
        assert (exc.reason, exc.by, exc.signal) == ("interrupted", "signal", signal.SIGTERM)


def test_a_call_that_starts_inside_the_block_stops_and_one_after_it_runs(
    budget_wasm: bytes,
) -> None:
    """A call made while the block is open is interrupted at its first tick; after, calls run."""
    guest = Instance(Component.load(budget_wasm))
    with interrupting(signal.SIGINT), pytest.raises(Cancelled) as info:
        guest.call("spin", budget=LONG)
    assert info.value.by == "signal" and info.value.signal == signal.SIGINT
    fresh = Instance(Component.load(budget_wasm))
    assert fresh.call("add", 2, 3, budget=Budget(fuel=10**6)) == 5


def test_blocks_nest_and_the_first_signal_is_kept(budget_wasm: bytes) -> None:
    """The outer block's signal stays until the outermost block closes."""
    guest = Instance(Component.load(budget_wasm))
    with interrupting(signal.SIGTERM):
        with interrupting(signal.SIGINT), pytest.raises(Cancelled) as inner:
            guest.call("spin", budget=LONG)
        assert inner.value.signal == signal.SIGTERM
        guest = Instance(Component.load(budget_wasm))
        with pytest.raises(Cancelled):
            guest.call("spin", budget=LONG)


@pytest.mark.parametrize("bad", [0, -2, True, 2.0, "SIGINT"])
def test_interrupting_takes_a_signal_number(bad: object) -> None:
    """Anything but a positive int is refused as BadInput."""
    with pytest.raises(BadInput), interrupting(bad):  # type: ignore[arg-type]
        pass
