"""The reply of one ask made through ``Runtime.ask`` / ``ask_raw``: a one-shot future.

An ask run in place (``AgentProcess.run_here``) is settled and read on one thread, within
microseconds; ``concurrent.futures.Future`` made and settled there cost about 3.5 us of a 40 us
ask (its ``Condition`` is an ``RLock`` plus half a dozen bound methods, made for every future,
and notified on every settle). :class:`Reply` keeps one plain lock and makes a second one
only when a thread actually has to wait (the ask went through a worker, or was drained by a
shutdown or a migration on another thread).

It is a ``Future`` for everything the runtime and its waits do with a reply (``done``,
``result``, ``exception``, ``set_result``, ``set_exception``, ``add_done_callback``), so
``CallScope.wait`` and the migration's forwarding take it as they take any future. It cannot
be cancelled (an ask's message is handled whether or not its asker still waits) and it is
never handed to ``concurrent.futures.wait``, which reads a future's private condition.

Rejected: a future made only once the ask is known to run in place: whether it does is only
known under the agent's locks, after the message is in its mailbox, and a drain (shutdown,
migration) may settle it from another thread after that.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError

__all__ = ["Reply"]

_log = logging.getLogger(__name__)

_Outcome = tuple[bool, object]  # (ok, the value or the exception)


class Reply(Future[bytes | None]):
    """A one-shot future for an ask's raw reply body (see the module docstring)."""

    # No super().__init__(): the Condition it makes is what this class saves. Every public
    # method of Future is overridden, so nothing reads the attributes it would have set.
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._outcome: _Outcome | None = None
        # Made (held) by the first thread that has to wait, released by the settle: waiting is
        # one C-level acquire, where threading.Event's wait and set run a Condition in Python.
        self._gate: threading.Lock | None = None
        self._callbacks: list[Callable[[Future[bytes | None]], object]] | None = None

    def cancel(self) -> bool:
        return False

    def cancelled(self) -> bool:
        return False

    def running(self) -> bool:
        return self._outcome is None

    def done(self) -> bool:
        return self._outcome is not None

    def set_running_or_notify_cancel(self) -> bool:
        return True

    def set_result(self, result: bytes | None) -> None:
        # set_result and set_exception each settle inline (no helper frame): an ask run in
        # place settles here on its own thread, a microsecond counts.
        with self._lock:
            if self._outcome is not None:
                raise InvalidStateError(f"{self!r} is already settled")
            self._outcome = (True, result)
            gate, callbacks = self._gate, self._callbacks
            self._callbacks = None
        if gate is not None or callbacks is not None:
            self._wake(gate, callbacks)

    def set_exception(self, exception: BaseException | None) -> None:
        with self._lock:
            if self._outcome is not None:
                raise InvalidStateError(f"{self!r} is already settled")
            self._outcome = (False, exception)
            gate, callbacks = self._gate, self._callbacks
            self._callbacks = None
        if gate is not None or callbacks is not None:
            self._wake(gate, callbacks)

    def _wake(
        self,
        gate: threading.Lock | None,
        callbacks: list[Callable[[Future[bytes | None]], object]] | None,
    ) -> None:
        if gate is not None:
            gate.release()
        for callback in callbacks or ():
            try:
                callback(self)
            except Exception:  # noqa: BLE001 - as Future does: a callback's bug is logged
                _log.exception("exception calling callback for %r", self)

    def _wait(self, timeout: float | None) -> _Outcome:
        with self._lock:
            outcome = self._outcome
            if outcome is None and self._gate is None:
                self._gate = threading.Lock()
                self._gate.acquire()
            gate = self._gate
        if outcome is None:
            assert gate is not None
            wait = -1 if timeout is None else min(max(0.0, timeout), threading.TIMEOUT_MAX)
            if not gate.acquire(timeout=wait):
                raise TimeoutError
            gate.release()  # open for every other wait, now and later
            outcome = self._outcome
            assert outcome is not None
        return outcome

    def result(self, timeout: float | None = None) -> bytes | None:
        outcome = self._outcome
        ok, value = self._wait(timeout) if outcome is None else outcome
        if ok:
            return value  # type: ignore[return-value]  # set_result's bytes | None
        assert isinstance(value, BaseException)
        raise value

    def exception(self, timeout: float | None = None) -> BaseException | None:
        outcome = self._outcome
        ok, value = self._wait(timeout) if outcome is None else outcome
        return None if ok else value  # type: ignore[return-value]  # set_exception's

    def add_done_callback(self, fn: Callable[[Future[bytes | None]], object]) -> None:
        with self._lock:
            if self._outcome is None:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(fn)
                return
        try:
            fn(self)
        except Exception:  # noqa: BLE001 - as Future does: a callback's bug is logged
            _log.exception("exception calling callback for %r", self)

    def __repr__(self) -> str:
        outcome = self._outcome
        if outcome is None:
            return f"<Reply at {id(self):#x} pending>"
        state = "returned" if outcome[0] else f"raised {type(outcome[1]).__name__}"
        return f"<Reply at {id(self):#x} {state}>"
