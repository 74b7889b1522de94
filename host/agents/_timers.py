"""Durable timers: a message sent later, once or every period, that survives a restart.

``Runtime.send_after(delay, to, name, body, every=None)`` (and a guest's
``mighty_agent.send_after``, an ask to the host's :data:`TIMERS` address) schedules a send of
``name`` to ``to``; ``every`` makes it periodic. It returns the timer's id, which
``cancel_timer`` takes. With a ``state_dir`` each timer is a row of the snapshot store
(``timers``, written with ``synchronous = FULL`` before the call returns), and a runtime opened
on the same directory fires what is due: a timer set before a crash or a shutdown is not lost.
Without one, timers live as long as their runtime.

When a timer fires, its message is delivered as a send from the agent that set it (``host`` for
the host's own), and the row is deleted (or moved to its next time) **in the same transaction**
that journals the message, when the target is a local durable agent: exactly once across a
crash. To any other target the message is sent first and the row updated after: a crash
between the two sends it once more after the restart (at least once, the promise a send to an
agent that is not durable can keep anyway: its mailbox dies with the process). A periodic timer
that missed ticks while the runtime was down fires once, then keeps its period from then.

Cancelling stops every later fire; a fire already under way (its message being delivered)
still lands. A target that does not exist when the timer fires (its type not registered yet after a
restart, a name not yet taken) is tried again every second for :data:`NOPROC_GRACE` seconds,
then the timer is dropped (``timer.dropped`` event); so is one whose send fails otherwise.

Bounds (a guest is hostile): a delay and a period within [0, :data:`MAX_DELAY`] (a period of at
least :data:`MIN_EVERY`), a body of at most :data:`MAX_TIMER_BODY` bytes, at most
:data:`MAX_TIMERS_PER_SENDER` pending timers per agent and :data:`MAX_TIMERS` per runtime. A
guest may only schedule a message it may send (its type's grants) and cancel its own timers.
Rows read back from the store are checked (types, bounds) like every other row.

Wall-clock time (``time.time``) is what a timer's due time is kept in: it must mean the same
thing to the next process, which a monotonic clock does not. A clock stepped back delays the
timers; stepped forward, fires them early.

Rejected: a timer as a message parked in the target's mailbox until due (mailboxes are FIFO: a
message due later would hold back every message behind it); the guest setting timers through a
new import of ``mighty:agent/host`` (every guest would need rebuilding against the new WIT, and
an ask to a host address is recorded, replayed and answered from a durable agent's log like
any other ask, so a recovered message never sets its timer twice); one thread per timer.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mighty._errors import BadInput, MightyError
from mighty.agents._store import MAX_TIMER_ROW_BODY
from mighty.agents._types import NoProc

if TYPE_CHECKING:
    from mighty.agents._store import SnapshotStore

__all__ = [
    "MAX_DELAY",
    "MAX_TIMERS",
    "MAX_TIMERS_PER_SENDER",
    "MAX_TIMER_BODY",
    "MIN_EVERY",
    "NOPROC_GRACE",
    "TIMERS",
    "BadTimer",
    "Timer",
    "Timers",
]

_log = logging.getLogger("mighty.agents")

TIMERS = "__timers"
"""The host's address a guest asks to set (``after``) or cancel (``cancel``) a timer."""
MAX_DELAY = 366 * 24 * 3600.0
"""The longest delay or period: a year and a day."""
MIN_EVERY = 0.01
"""The shortest period of a periodic timer (10 ms)."""
MAX_TIMER_BODY = MAX_TIMER_ROW_BODY
"""Most bytes of a timer's message body."""
MAX_TIMERS_PER_SENDER = 1000
"""Most pending timers one agent (or the host) may have."""
MAX_TIMERS = 100_000
"""Most pending timers in one runtime (and read back from one store)."""
NOPROC_GRACE = 30.0
"""How long a timer whose target does not exist yet is tried again before it is dropped."""
_RETRY = 1.0


class BadTimer(BadInput):
    """A timer that cannot be set: a bad delay or period, a body too large, too many."""

    kind = "bad_timer"


@dataclass(frozen=True, slots=True)
class Timer:
    """One pending timer; ``due`` is wall-clock time (``time.time()``)."""

    id: int
    due: float
    every: float | None
    sender: str
    to: str
    name: str
    body: bytes

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "due": self.due,
            "every": self.every,
            "sender": self.sender,
            "to": self.to,
            "name": self.name,
            "body_bytes": len(self.body),
        }


def check_timing(delay: object, every: object) -> tuple[float, float | None]:
    """``delay`` and ``every`` as seconds, or BadTimer naming what is wrong."""
    if isinstance(delay, bool) or not isinstance(delay, int | float):
        raise BadTimer(f"a timer's delay must be a number of seconds, not {type(delay).__name__}")
    if not (math.isfinite(delay) and 0 <= delay <= MAX_DELAY):
        raise BadTimer(f"a timer's delay must be within 0 and {MAX_DELAY:g} s, not {delay!r}")
    if every is None:
        return float(delay), None
    if isinstance(every, bool) or not isinstance(every, int | float):
        raise BadTimer(f"a timer's period must be a number of seconds, not {type(every).__name__}")
    if not (math.isfinite(every) and MIN_EVERY <= every <= MAX_DELAY):
        raise BadTimer(
            f"a timer's period must be within {MIN_EVERY:g} and {MAX_DELAY:g} s, not {every!r}"
        )
    return float(delay), float(every)


Fire = Callable[[Timer, "float | None"], None]
"""Deliver a due timer's message and settle its stored row (``next_due``: its next time, None:
delete it), in one transaction with the message where the target journals it; raise NoProc
when the target does not exist (the row is left as it was), any MightyError when the send
failed."""


class Timers:
    """The pending timers of one runtime and the thread that fires them (see the module)."""

    def __init__(
        self,
        fire: Fire,
        *,
        store: SnapshotStore | None = None,
        on_dropped: Callable[[Timer, str], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._fire = fire
        self._store = store
        self._on_dropped = on_dropped
        self._clock = clock
        self._cond = threading.Condition()
        self._pending: dict[int, Timer] = {}
        self._heap: list[tuple[float, int]] = []
        self._per_sender: dict[str, int] = {}
        self._missing: dict[int, float] = {}
        """Timer id -> when its target was first found missing (NOPROC_GRACE)."""
        self._ids = itertools.count(1)
        self._calls: dict[int, Callable[[], None]] = {}
        """In-memory calls (``call_later``), under negative ids in the heap."""
        self._call_ids = itertools.count(1)
        self._thread: threading.Thread | None = None
        self._closed = False

    # -- setting and cancelling -------------------------------------------------------------

    def load(self) -> int:
        """Take the timers stored by an earlier runtime (checked rows); how many. A damaged
        table (SnapshotCorrupt) is left as it is for inspection and raises: the caller decides
        whether to run without them."""
        if self._store is None:
            return 0
        stored = [Timer(*row) for row in self._store.timers(MAX_TIMERS)]
        with self._cond:
            for timer in stored:
                self._add(timer)
            if stored:
                self._start()
        return len(stored)

    def add(
        self,
        delay: object,
        to: str,
        name: str,
        body: bytes,
        *,
        sender: str,
        every: object = None,
    ) -> Timer:
        """Schedule ``name`` to ``to`` in ``delay`` seconds (then every ``every``)."""
        seconds, period = check_timing(delay, every)
        if len(body) > MAX_TIMER_BODY:
            raise BadTimer(f"a timer's body is at most {MAX_TIMER_BODY} bytes, not {len(body)}")
        due = self._clock() + seconds
        with self._cond:
            if self._closed:
                raise BadTimer("the runtime is shutting down: no more timers")
            if self._per_sender.get(sender, 0) >= MAX_TIMERS_PER_SENDER:
                raise BadTimer(f"{sender} has {MAX_TIMERS_PER_SENDER} timers pending already")
            if len(self._pending) >= MAX_TIMERS:
                raise BadTimer(f"the runtime has {MAX_TIMERS} timers pending already")
            # Stored before it is pending: a timer the caller was told about survives a crash.
            if self._store is not None:
                timer_id = self._store.timer_put(due, period, sender, to, name, body)
            else:
                timer_id = next(self._ids)
            timer = Timer(timer_id, due, period, sender, to, name, body)
            self._add(timer)
            self._start()
            self._cond.notify()
        return timer

    def cancel(self, timer_id: int, *, sender: str | None = None) -> bool:
        """Cancel a pending timer (only ``sender``'s, when given); False if there is none."""
        with self._cond:
            timer = self._pending.get(timer_id)
            if timer is None or (sender is not None and timer.sender != sender):
                return False
            self._forget(timer)
            if self._store is not None:
                self._store.timer_next(timer_id, None)
        return True

    def call_later(self, delay: float, call: Callable[[], None]) -> bool:
        """Run ``call`` on the timer thread in ``delay`` seconds (the runtime's own retries):
        in memory only, outside the limits; False when closed (the caller acts at once).
        A close runs the calls still waiting, on the closing thread."""
        with self._cond:
            if self._closed:
                return False
            key = -next(self._call_ids)
            self._calls[key] = call
            heapq.heappush(self._heap, (self._clock() + max(0.0, delay), key))
            self._start()
            self._cond.notify()
        return True

    def pending(self, sender: str | None = None) -> list[Timer]:
        """The pending timers (``sender``'s only, when given), soonest first."""
        with self._cond:
            timers = [t for t in self._pending.values() if sender is None or t.sender == sender]
        return sorted(timers, key=lambda t: (t.due, t.id))

    def close(self) -> None:
        """Stop firing (the stored timers stay for the next runtime)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
            calls, self._calls = list(self._calls.values()), {}
        if thread is not None and thread is not threading.current_thread():
            thread.join(10)
        for call in calls:
            self._call(call)

    # -- inside -----------------------------------------------------------------------------

    def _add(self, timer: Timer) -> None:
        self._pending[timer.id] = timer
        self._per_sender[timer.sender] = self._per_sender.get(timer.sender, 0) + 1
        heapq.heappush(self._heap, (timer.due, timer.id))

    def _forget(self, timer: Timer) -> None:
        del self._pending[timer.id]
        self._missing.pop(timer.id, None)
        left = self._per_sender[timer.sender] - 1
        if left:
            self._per_sender[timer.sender] = left
        else:
            del self._per_sender[timer.sender]

    def _start(self) -> None:
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._run, name="mighty-timers", daemon=True)
            self._thread.start()

    def _next_due(self) -> Timer | Callable[[], None] | None:
        """The timer or call due now (removed from the heap), else None after waiting for
        one (``_cond`` held)."""
        while self._heap and not self._closed:
            due, timer_id = self._heap[0]
            if timer_id < 0:  # a call_later
                wait = due - self._clock()
                if wait <= 0:
                    heapq.heappop(self._heap)
                    call = self._calls.pop(timer_id, None)
                    if call is not None:
                        return call
                    continue
                self._cond.wait(min(wait, 60.0))
                continue
            timer = self._pending.get(timer_id)
            if timer is None or timer.due != due:
                heapq.heappop(self._heap)  # cancelled, or moved to a later time
                continue
            wait = due - self._clock()
            if wait <= 0:
                heapq.heappop(self._heap)
                return timer
            self._cond.wait(min(wait, 60.0))
        if not self._closed:
            self._cond.wait(60.0)
        return None

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                due = self._next_due()
            if isinstance(due, Timer):
                self._fire_one(due)
            elif due is not None:
                self._call(due)

    @staticmethod
    def _call(call: Callable[[], None]) -> None:
        try:
            call()
        except Exception:  # noqa: BLE001 -- a failing call must not end the timers
            _log.exception("a delayed call failed")

    def _fire_one(self, timer: Timer) -> None:
        now = self._clock()
        next_due = None
        if timer.every is not None:
            next_due = timer.due + timer.every
            if next_due <= now:  # missed ticks (the runtime was down): once, then on period
                next_due = now + timer.every
        with self._cond:
            if self._pending.get(timer.id) is not timer:
                return  # cancelled meanwhile
        try:
            self._fire(timer, next_due)
        except NoProc as exc:
            with self._cond:
                first = self._missing.setdefault(timer.id, now)
                if now - first < NOPROC_GRACE and self._pending.get(timer.id) is timer:
                    retry = Timer(
                        timer.id, now + _RETRY, timer.every, timer.sender, timer.to, timer.name,
                        timer.body,
                    )  # fmt: skip
                    self._pending[timer.id] = retry
                    heapq.heappush(self._heap, (retry.due, retry.id))
                    return
            self._drop(timer, f"no target: {exc.message}")
            return
        except MightyError as exc:
            self._drop(timer, exc.message)
            return
        except Exception as exc:  # noqa: BLE001 -- a bug in a send must not end the timers
            _log.exception("timer %d to %s: unexpected error firing it", timer.id, timer.to)
            self._drop(timer, f"internal error: {type(exc).__name__}: {exc}")
            return
        with self._cond:
            if self._pending.get(timer.id) is not timer:
                return
            self._missing.pop(timer.id, None)
            if next_due is None:
                self._forget(timer)
                return
            moved = Timer(
                timer.id, next_due, timer.every, timer.sender, timer.to, timer.name, timer.body
            )
            self._pending[timer.id] = moved
            heapq.heappush(self._heap, (next_due, timer.id))

    def _drop(self, timer: Timer, why: str) -> None:
        with self._cond:
            if self._pending.get(timer.id) is not None:
                self._forget(timer)
        if self._store is not None:
            try:
                self._store.timer_next(timer.id, None)
            except MightyError as exc:
                _log.warning("timer %d: could not delete its row: %s", timer.id, exc)
        _log.warning("timer %d to %s (%r) dropped: %s", timer.id, timer.to, timer.name, why)
        if self._on_dropped is not None:
            self._on_dropped(timer, why)
