"""The call scope: deadline, cancel scope, signal and pause, and the one wait loop through them."""

from __future__ import annotations

import ast
import concurrent.futures
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mighty import (
    BadInput,
    Budget,
    BudgetExceeded,
    Cancelled,
    CancelScope,
    Component,
    DeadlineExceeded,
    Instance,
)
from mighty.budget import CallScope, _scope
from mighty.gate import UNSCOPED, Scope

ROOT = Path(__file__).resolve().parents[2]


class FakeClock:
    """``time.monotonic`` for the scope module, moved by hand (dyadic steps: exact sums)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(_scope, "_now", fake)
    return fake


def test_call_scope_is_the_gates_scope() -> None:
    """The budget's CallScope is what the gate hands host functions (mighty.gate.Scope)."""
    assert isinstance(CallScope(1.0, None), Scope)
    assert isinstance(UNSCOPED, Scope)


def test_first_cancel_wins_and_says_who(clock: FakeClock) -> None:
    """The first cancel's reason and source are kept; later ones change nothing."""
    scope = CancelScope()
    assert (scope.cancel_called, scope.reason, scope.by) == (False, None, None)
    scope.cancel("supervisor stopped it", by="supervisor")
    scope.cancel("too late", by="host")
    assert (scope.cancel_called, scope.reason, scope.by) == (
        True,
        "supervisor stopped it",
        "supervisor",
    )


def test_cancel_scope_deadline_cancels_by_itself(clock: FakeClock) -> None:
    """A cancel scope's deadline cancels it when it passes, as by="deadline"."""
    scope = CancelScope.after(2.0)
    assert scope.deadline == 1002.0
    clock.now = 1001.5
    assert not scope.cancel_called
    clock.now = 1002.0
    assert scope.cancel_called and scope.by == "deadline"


def test_a_passed_deadline_beats_a_later_cancel(clock: FakeClock) -> None:
    """A cancel after the deadline passed (unobserved) is still the deadline's."""
    scope = CancelScope(deadline=1001.0)
    clock.now = 1003.0
    scope.cancel("user", by="host")
    assert scope.by == "deadline"


def test_cancel_scope_refuses_bad_input() -> None:
    """Deadlines and sources are checked: BadInput, never a silent wrong scope."""
    with pytest.raises(BadInput):
        CancelScope.after(-1)
    with pytest.raises(BadInput):
        CancelScope.after(float("inf"))
    with pytest.raises(BadInput):
        CancelScope(deadline=float("nan"))
    with pytest.raises(BadInput):
        CancelScope().cancel("x", by="nobody")  # type: ignore[arg-type]


def test_checkpoint_raises_each_stop_typed(clock: FakeClock) -> None:
    """checkpoint raises DeadlineExceeded, Cancelled(by=host) and Cancelled(by=signal)."""
    call = CallScope(1.0, None)
    call.checkpoint()
    clock.now += 1.0
    with pytest.raises(DeadlineExceeded) as late:
        call.checkpoint()
    assert late.value.timeout == 1.0 and call.raised is late.value

    cancel = CancelScope()
    call = CallScope(10.0, cancel)
    cancel.cancel("enough")
    with pytest.raises(Cancelled) as cancelled:
        call.checkpoint()
    assert (cancelled.value.by, cancelled.value.reason) == ("host", "enough")
    assert cancel.cancelled_caught

    call = CallScope(10.0, None)
    call.interrupt(2)
    with pytest.raises(Cancelled) as signalled:
        call.checkpoint()
    assert (signalled.value.by, signalled.value.signal) == ("signal", 2)


def test_pause_stops_the_guest_clock_but_not_cancellation(clock: FakeClock) -> None:
    """Paused, the deadline stands still; a cancel still stops the call."""
    cancel = CancelScope()
    call = CallScope(1.0, cancel)
    with call.paused():
        clock.now += 5.0
        call.checkpoint()  # five seconds of host time: not the guest's
        with call.paused():  # nested: counted once
            clock.now += 1.0
        cancel.cancel("stop")
        with pytest.raises(Cancelled):
            call.checkpoint()
    assert call.deadline == 1000.0 + 1.0 + 6.0


def test_wait_returns_when_ready() -> None:
    """wait() on a future, an event and a block function returns True once it is ready."""
    call = CallScope(30.0, None)
    future: concurrent.futures.Future[int] = concurrent.futures.Future()
    threading.Timer(0.05, future.set_result, args=(7,)).start()
    assert call.wait(future, 10.0) and future.result() == 7
    event = threading.Event()
    threading.Timer(0.05, event.set).start()
    assert call.wait(event, 10.0)
    assert call.wait(lambda most: True, 0.0)


def test_wait_times_out_with_false() -> None:
    """wait() gives up after its timeout with False (the caller reports its own timeout)."""
    assert not CallScope(30.0, None).wait(threading.Event(), 0.05)


def test_wait_is_stopped_by_a_cancel_from_another_thread() -> None:
    """A cancel reaches a waiting host function within a slice: Cancelled, not a hang."""
    cancel = CancelScope()
    call = CallScope(30.0, cancel)
    threading.Timer(0.05, cancel.cancel, args=("from afar",)).start()
    with pytest.raises(Cancelled) as info, call.paused():
        call.wait(threading.Event(), None)
    assert info.value.reason == "from afar"


def test_unscoped_refuses_to_wait() -> None:
    """Outside a call nothing bounds a wait, so UNSCOPED refuses one; its checkpoint is a no-op."""
    UNSCOPED.checkpoint()
    with UNSCOPED.paused():
        pass
    with pytest.raises(Exception, match="outside a guest call"):
        UNSCOPED.wait(threading.Event(), 1.0)


def test_a_cancel_scope_deadline_stops_a_running_guest(budget_wasm: bytes) -> None:
    """A real guest spinning past its cancel scope's deadline ends Cancelled(by="deadline")."""
    guest = Instance(Component.load(budget_wasm))
    scope = CancelScope.after(0.1)
    with pytest.raises(Cancelled) as info:
        guest.call("spin", budget=Budget(fuel=10**18, timeout=30), cancel=scope)
    assert info.value.by == "deadline" and scope.cancelled_caught


def test_only_the_scope_makes_cancelled() -> None:
    """No module of mighty but the call scope constructs Cancelled (so `by` is always true)."""
    makers = []
    for base in (ROOT / "host", ROOT / "sandbox"):
        for path in base.rglob("*.py"):
            if base.name == "host" and "sandbox" in path.relative_to(base).parts[:1]:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Call):
                    func = node.func
                    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
                    if name == "Cancelled":
                        makers.append(path.relative_to(ROOT).as_posix())
    assert makers and set(makers) == {"host/budget/_scope.py"}


# -- the model: deadline, cancel scope, signal and pause in any order ---------------------------

_STEP = 1 / 16  # dyadic: sums of steps are exact, so the model agrees to the last bit


class ScopeModel(RuleBasedStateMachine):
    """CallScope against a model: the guest's clock runs only unpaused; the first cause of a
    cancel wins; a signal beats a cancel, a cancel beats the deadline; waits end as the model
    says."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self._saved = (_scope._now, _scope.WAIT_SLICE)
        _scope._now = self.clock
        _scope.WAIT_SLICE = _STEP
        self.timeout = 20 * _STEP
        self.cancel = CancelScope()
        self.scope = CallScope(self.timeout, self.cancel)
        self.pauses: list[Any] = []
        self.used = 0.0  # the guest's own time
        self.host_cancel_at: float | None = None
        self.cancel_deadline: float | None = None
        self.signal: int | None = None

    def teardown(self) -> None:
        _scope._now, _scope.WAIT_SLICE = self._saved

    def _advance(self, steps: int) -> None:
        self.clock.now += steps * _STEP
        if not self.pauses:
            self.used += steps * _STEP

    def expected(self) -> tuple[str, str | None] | None:
        """(error kind, by) the scope must raise now, or None."""
        if self.signal is not None:
            return ("cancelled", "signal")
        host, deadline = self.host_cancel_at, self.cancel_deadline
        if host is not None and (deadline is None or host < deadline):
            return ("cancelled", "host")
        if deadline is not None and self.clock.now >= deadline:
            return ("cancelled", "deadline")
        if self.used >= self.timeout:
            return ("deadline_exceeded", None)
        return None

    def _check(self, error: BudgetExceeded | None) -> None:
        got = None if error is None else (error.kind, getattr(error, "by", None))
        assert got == self.expected()

    @rule(steps=st.integers(0, 12))
    def advance(self, steps: int) -> None:
        self._advance(steps)

    @rule()
    def pause(self) -> None:
        manager = self.scope.paused()
        manager.__enter__()
        self.pauses.append(manager)

    @precondition(lambda self: bool(self.pauses))
    @rule()
    def unpause(self) -> None:
        self.pauses.pop().__exit__(None, None, None)

    @precondition(lambda self: self.host_cancel_at is None)
    @rule()
    def host_cancel(self) -> None:
        self.cancel.cancel("host", by="host")
        self.host_cancel_at = self.clock.now

    @precondition(lambda self: self.cancel_deadline is None and self.host_cancel_at is None)
    @rule(steps=st.integers(0, 30))
    def cancel_deadline_in(self, steps: int) -> None:
        self.cancel.deadline = self.clock.now + steps * _STEP
        self.cancel_deadline = self.cancel.deadline

    @precondition(lambda self: self.signal is None)
    @rule(signum=st.sampled_from([2, 15]))
    def signal_arrives(self, signum: int) -> None:
        self.scope.interrupt(signum)
        self.signal = signum

    @rule()
    def checkpoint(self) -> None:
        try:
            self.scope.checkpoint()
        except BudgetExceeded as exc:
            self._check(exc)
        else:
            self._check(None)

    @rule(ready_in=st.integers(0, 20), timeout=st.integers(0, 20))
    def wait(self, ready_in: int, timeout: int) -> None:
        ready_at = self.clock.now + ready_in * _STEP
        start = self.clock.now

        def block(most: float) -> bool:
            steps = round(most / _STEP)
            assert steps * _STEP == most and 0 <= steps <= 1  # never longer than a slice
            self._advance(steps)
            return self.clock.now >= ready_at

        try:
            done = self.scope.wait(block, timeout * _STEP)
        except BudgetExceeded as exc:
            self._check(exc)  # raised as soon as the cause held, the clock not moved since
            return
        if done:
            assert self.clock.now >= ready_at
        else:
            assert self.clock.now >= start + timeout * _STEP and self.clock.now < ready_at

    @invariant()
    def deadline_moves_only_by_pauses(self) -> None:
        if not self.pauses:
            assert self.scope.deadline == self.clock.now - self.used + self.timeout


ScopeModel.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_scope_model = ScopeModel.TestCase


def test_a_calls_outcome_is_kept_on_its_own_scope() -> None:
    """What the gate reports (a host function's failure, the guest's exit) lands on the scope
    of the call it belongs to, the first failure wins, a new call's scope starts with none,
    and outside a call (UNSCOPED) nothing is kept."""
    first, second = ValueError("first"), KeyError("second")
    call = CallScope(1.0, None)
    assert call.host_failure is None and call.exit_code is None
    call.host_failed(first)
    call.host_failed(second)
    call.guest_exited(3)
    assert call.host_failure is first and call.exit_code == 3
    later = CallScope(1.0, None)
    assert later.host_failure is None and later.exit_code is None
    UNSCOPED.host_failed(first)
    UNSCOPED.guest_exited(1)
    assert not hasattr(UNSCOPED, "host_failure")
