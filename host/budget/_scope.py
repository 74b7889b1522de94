"""Cancel scopes and the call scope: deadlines, cancellation and waiting for one guest call.

``CancelScope`` follows trio: ``cancel(reason)`` from any thread, at any time; an optional
absolute deadline (``CancelScope(deadline=...)`` or ``CancelScope.after(seconds)``) cancels it
by itself when it passes; ``cancel_called`` says cancellation was requested, ``cancelled_caught``
that it actually stopped a call; ``by`` says who asked.

``CallScope`` is made by the :class:`~mighty.budget.Meter` for every call into a guest and handed
to every host function as ``ctx.scope`` (the gate knows it only as ``mighty.gate.Scope``). It
holds the call's wall-clock deadline, its cancel scope, the signal that interrupted it, and
the pause for host time. Three things use it:

- the epoch callback, once a tick while guest code runs (:meth:`CallScope.stop_reason`);
- host functions between slices of a wait (:meth:`CallScope.wait`, :meth:`CallScope.checkpoint`):
  the epoch callback cannot run while the guest is blocked in the host;
- the Meter, to turn how the call stopped into its typed error (:meth:`CallScope.error`).

Only this module makes a ``Cancelled`` (``tests/budget/test_scope.py`` checks that no other
module of mighty constructs one), so every ``Cancelled`` says truthfully who cancelled.

While paused, the deadline stands still: the check compares the moment the pause began with the
deadline, and the pause's length is added to the deadline when it ends. Cancellation, a
signal and the cancel scope's own deadline still apply while paused: they are not the guest's
time, they are the caller's.

Rejected: a lambda per concern in a string-keyed dict (``"wasi.io.interrupt"``,
``"budget.pause"``) with a hand-written wait loop in each user: the loops drifted apart (one
checked the deadline during a pause and stopped a tool call that should have been free, so the
others stopped checking it at all), and nothing typed what was in the dict.
"""

from __future__ import annotations

import concurrent.futures
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Literal, get_args

from mighty._errors import BadInput, BudgetExceeded, Cancelled, DeadlineExceeded
from mighty.engine import MemoryAccount
from mighty.gate import Scope, Waitable

__all__ = ["WAIT_SLICE", "CallScope", "CancelScope", "CancelledBy", "StopReason"]

CancelledBy = Literal["host", "supervisor", "deadline", "signal"]
"""Who cancelled: the host (``cancel()``), a supervisor, the cancel scope's own deadline, or a
signal (Ctrl-C) that landed during the call."""
StopReason = Literal["interrupt", "cancel", "deadline"]
"""Why a call must stop: a signal, its cancel scope, its own wall-clock deadline."""
_BY = frozenset(get_args(CancelledBy))

WAIT_SLICE = 0.02
"""The longest a wait blocks between two checks of its call (seconds): a cancel or a Ctrl-C
reaches a waiting host function within this, the epoch tick's counterpart for the host."""

_now = time.monotonic
_CANCEL_LOCK = threading.Lock()
"""Makes each scope's first cancel win (reason and ``by``). One for all scopes: a cancel is
rare and quick, and a lock per scope was a tenth of the cost of making one (one per agent
message)."""
_EXPIRED = "the cancel scope's deadline passed"


class CancelScope:
    """A handle to stop calls from any thread: ``scope.cancel("reason")``, or a deadline.

    ``deadline`` is absolute, on ``time.monotonic()``'s clock; None means none. One scope may be
    given to many calls (a session's runs): once cancelled it stays cancelled.

    ``parent``: a scope this one lives inside (a tool call in its run, a run started by a tool,
    an ask's handler in the asker's message). Cancelling the parent cancels this one, with the
    parent's reason and ``by``; this one's deadline is never later than the parent's. The link
    is read when this scope is checked (``cancel_called``), not pushed when the parent is
    cancelled: checks happen once an epoch tick and once a wait slice anyway, so a push would
    buy no speed and would make the parent hold every child it ever had.
    """

    __slots__ = (
        "_by",
        "_cancelled",
        "_deadline",
        "_parents",
        "_reason",
        "cancelled_caught",
    )

    def __init__(self, *, deadline: float | None = None, parent: CancelScope | None = None) -> None:
        self._cancelled = False
        self._reason: str | None = None
        self._by: CancelledBy | None = None
        self._deadline = _checked_deadline(deadline)
        self._parents: tuple[CancelScope, ...] = ()
        if parent is not None:
            self._link((parent,))
        self.cancelled_caught = False
        """True once a cancel actually interrupted a call (not merely requested)."""

    @classmethod
    def within(cls, *parents: CancelScope | None, deadline: float | None = None) -> CancelScope:
        """A scope cancelled when any of ``parents`` is (None entries are skipped), or at
        ``deadline``: e.g. a caller's own scope and the context the call is made in."""
        scope = cls(deadline=deadline)
        scope._link(tuple(p for p in parents if p is not None))
        return scope

    def _link(self, parents: tuple[CancelScope, ...]) -> None:
        deadline = self._deadline
        for parent in parents:
            if not isinstance(parent, CancelScope):
                raise BadInput(f"a cancel scope's parent is a CancelScope, got {parent!r}")
            outer = parent._deadline
            if outer is not None and (deadline is None or outer < deadline):
                deadline = outer
        self._deadline = deadline
        self._parents = parents

    @classmethod
    def after(cls, seconds: float, *, parent: CancelScope | None = None) -> CancelScope:
        """A scope that cancels itself ``seconds`` from now (or when ``parent`` is cancelled)."""
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise BadInput(f"CancelScope.after takes seconds, got {type(seconds).__name__}")
        if not (seconds >= 0 and math.isfinite(seconds)):
            raise BadInput(f"CancelScope.after takes a finite number >= 0, got {seconds}")
        return cls(deadline=_now() + seconds, parent=parent)

    @property
    def deadline(self) -> float | None:
        """When the scope cancels itself (``time.monotonic()`` seconds), or None."""
        return self._deadline

    @deadline.setter
    def deadline(self, value: float | None) -> None:
        self._deadline = _checked_deadline(value)

    @property
    def parents(self) -> tuple[CancelScope, ...]:
        """The scopes this one lives inside (cancelling any of them cancels this one)."""
        return self._parents

    def cancel(self, reason: str = "cancelled", *, by: CancelledBy = "host") -> None:
        """Request cancellation; the first request's reason and ``by`` are kept. Any thread."""
        if by not in _BY:
            raise BadInput(f"cancel(by=...) must be one of {sorted(_BY)}, got {by!r}")
        with _CANCEL_LOCK:
            if self._reason is None:
                deadline = self._deadline
                if by != "deadline" and deadline is not None and _now() >= deadline:
                    # Its deadline came first, even if nobody looked: the first cause wins.
                    reason, by = _EXPIRED, "deadline"
                self._reason = str(reason)
                self._by = by
            self._cancelled = True

    @property
    def cancel_called(self) -> bool:
        """Whether cancellation was requested (here or on a parent), or the deadline passed."""
        if self._cancelled:
            return True
        deadline = self._deadline
        if deadline is not None and _now() >= deadline:
            self.cancel(_EXPIRED, by="deadline")
            return True
        for parent in self._parents:
            if parent.cancel_called:
                self.cancel(parent._reason or "cancelled", by=parent._by or "host")
                return True
        return False

    def remaining(self) -> float | None:
        """Seconds until the deadline (0 once passed), or None without one."""
        deadline = self._deadline
        return None if deadline is None else max(0.0, deadline - _now())

    @property
    def reason(self) -> str | None:
        return self._reason

    @property
    def by(self) -> CancelledBy | None:
        """Who cancelled (None until cancelled)."""
        return self._by

    def error(self) -> BudgetExceeded:
        """The typed stop for work under this scope (call it once ``cancel_called`` is true):
        ``Cancelled`` with who and why (its deadline's passing is ``by="deadline"``)."""
        self.cancel_called  # noqa: B018 -- settles reason and by from the deadline or parent
        text = self._reason or "cancelled"
        return Cancelled(f"cancelled: {text}", reason=text, by=self._by or "host")

    def __repr__(self) -> str:
        state = f"cancelled by {self._by}: {self._reason}" if self.cancel_called else "active"
        return f"CancelScope({state})"


def _checked_deadline(value: float | None) -> float | None:
    if value is None:
        return None
    if type(value) is float and not math.isnan(value):  # the common case, a monotonic() sum
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise BadInput(f"a deadline is a time.monotonic() value or None, got {value!r}")
    return float(value)


class CallScope(Scope):
    """One guest call's deadline, cancel scope, interrupting signal and pause (``ctx.scope``).

    Made by the Meter for each call; ``timeout`` is the call's budget in seconds, from now.
    """

    __slots__ = (
        "_pause_depth",
        "_paused_at",
        "account",
        "cancel",
        "deadline",
        "exit_code",
        "failure",
        "fuel_marks",
        "host_failure",
        "interrupted",
        "raised",
        "stopped",
        "timeout",
    )

    def __init__(
        self, timeout: float, cancel: CancelScope | None, account: MemoryAccount | None = None
    ) -> None:
        self.timeout = timeout
        self.deadline = _now() + timeout
        """When the guest's wall clock runs out (``time.monotonic()``); moves later by every
        pause's length."""
        self.cancel = cancel
        self.account = account
        self.interrupted: int | None = None
        """The signal whose handler raised during the call."""
        self.stopped: str | None = None
        """Why the call was stopped: a :data:`StopReason`, or ``"memory"``/``"failure"`` (set by
        the epoch callback)."""
        self.failure: BaseException | None = None
        """A bug in the epoch callback itself."""
        self.host_failure: BaseException | None = None
        """The first exception a host function raised while serving the call (``host_failed``)."""
        self.exit_code: int | None = None
        """The status the guest asked to exit with (``guest_exited``), if it did."""
        self.raised: BudgetExceeded | None = None
        """The stop :meth:`checkpoint` raised inside a host function, if it did."""
        self.fuel_marks: list[float] | None = None
        """Set by the epoch callback: the fuel left and the thread's CPU time at its first
        tick, and when the fuel left last moved (see ``mighty.budget._budget``)."""
        self._pause_depth = 0
        self._paused_at = 0.0

    # -- the outcome the gate reports --------------------------------------------------------

    def host_failed(self, exc: BaseException) -> None:
        if self.host_failure is None:
            self.host_failure = exc

    def guest_exited(self, code: int) -> None:
        self.exit_code = code

    # -- what stops the call ---------------------------------------------------------------

    def interrupt(self, signum: int) -> None:
        """A signal's handler raised: stop the call at the next epoch tick or host check."""
        if self.interrupted is None:
            self.interrupted = signum

    def stop_reason(self) -> StopReason | None:
        """Why the call must stop now (a signal, its cancel scope, its deadline), or None."""
        if self.interrupted is not None:
            return "interrupt"
        cancel = self.cancel
        if cancel is not None and cancel.cancel_called:
            return "cancel"
        # Paused, the guest's clock stands where the pause began.
        now = self._paused_at if self._pause_depth else _now()
        if now >= self.deadline:
            return "deadline"
        return None

    def checkpoint(self) -> None:
        """Raise the call's typed stop (Cancelled, DeadlineExceeded) if it must stop now."""
        reason = self.stop_reason()
        if reason is not None:
            self.stopped = reason
            error = self.error(reason)
            self.raised = error
            raise error

    def error(self, reason: str, *, before_start: bool = False) -> BudgetExceeded:
        """The typed error for a call stopped for ``reason`` (a :data:`StopReason`)."""
        if reason == "interrupt":
            signum = self.interrupted
            return Cancelled(
                f"call interrupted by {_signal_name(signum)}",
                reason="interrupted",
                by="signal",
                signal=signum,
            )
        if reason == "cancel" and self.cancel is not None:
            self.cancel.cancelled_caught = True
            text = self.cancel.reason or ""
            when = "call cancelled before it started" if before_start else "call cancelled"
            return Cancelled(f"{when}: {text}", reason=text, by=self.cancel.by or "host")
        return DeadlineExceeded(
            f"call exceeded its {self.timeout:g} s deadline", timeout=self.timeout
        )

    # -- host time -------------------------------------------------------------------------

    def paused(self) -> AbstractContextManager[None]:
        """A block whose wall time is added back to the deadline (host work, e.g. a tool)."""
        return self._pause()

    @contextmanager
    def _pause(self) -> Iterator[None]:
        if self._pause_depth == 0:
            self._paused_at = _now()
        self._pause_depth += 1
        try:
            yield
        finally:
            self._pause_depth -= 1
            if self._pause_depth == 0:
                self.deadline += _now() - self._paused_at

    @property
    def is_paused(self) -> bool:
        return self._pause_depth > 0

    # -- the one wait loop -----------------------------------------------------------------

    def wait(self, what: Waitable, timeout: float | None) -> bool:
        """Block until ``what`` is ready (True) or ``timeout`` seconds pass (False).

        Waits in slices of at most :data:`WAIT_SLICE`; before each slice the call is checked,
        and its stop (cancel, signal, deadline unless paused) is raised as soon as it is seen.
        ``timeout`` None waits until ready or stopped.
        """
        block = _blocker(what)
        until = None if timeout is None else _now() + max(0.0, timeout)
        while True:
            self.checkpoint()
            if until is None:
                piece = WAIT_SLICE
            else:
                left = until - _now()
                if left <= 0:
                    return block(0.0)
                piece = min(left, WAIT_SLICE)
            if block(piece):
                return True

    def __repr__(self) -> str:
        left = self.deadline - _now()
        return f"CallScope({left:.3f} s left, cancel={self.cancel!r}, stopped={self.stopped})"


def _blocker(what: Waitable) -> Callable[[float], bool]:
    if isinstance(what, concurrent.futures.Future):
        return lambda seconds: _future_ready(what, seconds)
    if isinstance(what, threading.Event):
        return what.wait
    if callable(what):
        return what
    raise BadInput(f"a call scope cannot wait for a {type(what).__name__}")


def _future_ready(future: concurrent.futures.Future[object], seconds: float) -> bool:
    try:
        future.exception(seconds)  # returns once done, whatever the outcome
    except TimeoutError:  # concurrent.futures.TimeoutError is this one since 3.11
        return False
    except concurrent.futures.CancelledError:
        return True
    return True


def _signal_name(signum: int | None) -> str:
    try:
        return signal.Signals(signum or 0).name
    except ValueError:
        return f"signal {signum}"
