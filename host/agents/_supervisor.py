"""OTP supervision as a state machine that never looks inside a child, and a circuit breaker.

A ``Supervisor`` starts its children in order, and when the runtime reports that one exited it
applies the strategy (``one_for_one``, ``rest_for_one``, ``one_for_all``) and the child's
restart type (``permanent``, ``transient``, ``temporary``), within a restart intensity: more than
``intensity`` restarts within ``period`` seconds and it gives up, stops everything and reports
its own failure to its parent, which sees a crashed child. A supervisor is itself a
``ChildHandle``, so trees nest.

Threading rule. One lock guards the supervisor's state and is held only for short reads and
writes: never while calling a child's ``start``/``stop``, ``on_event`` or ``on_failed``. Work that
calls children (start, stop, handling an exit) is an *operation*; operations run one at a time,
in submission order, on whichever thread finds no operation running (the *runner*). Other
threads:
- ``child_exited`` only queues the exit and returns at once, so a child whose ``stop()`` reports
  its own exit (from the same thread or from a thread ``stop()`` joins) cannot deadlock; an exit
  reported while the supervisor is stopping that child is expected and ignored;
- ``start``/``stop`` from another thread wait until the runner has done them; ``stop`` called
  from the runner itself (inside a child's ``stop``/``start``) is queued and done right after the
  current operation; ``start`` from the runner is refused (it could not finish first).
``on_failed`` is called after the runner role is released, so a parent may restart this
supervisor from inside the callback.

Decisions where OTP leaves room or where we differ:
- a group restart (``rest_for_one``/``one_for_all``) counts as one restart for the intensity and
  restarts the children that were running (or waiting to be restarted); a child that exited and
  was not restarted (a transient child that stopped normally, a temporary one) stays down, and a
  running temporary sibling is stopped and not restarted (as in OTP);
- a restart that fails to start a child counts as a crash of that child: the strategy applies
  again, within the intensity, so a child that cannot start fails the supervisor;
- an exit is matched to the incarnation current when it was reported (or to ``handle=`` when
  given), so late reports about a child already replaced are ignored;
- a child that will not be started again (its restart type, a temporary sibling of a group
  restart, the supervisor giving up, a parent retiring this supervisor) is *retired* once
  stopped, when its handle has a ``retire`` method (``RetiringHandle``): an agent then settles
  the messages still queued for it. ``stop`` alone keeps them, since a restart may follow;
- ``child_exited`` returns the ``SupervisorFailed`` when the exit it reported made the supervisor
  give up (a result, not an exception: the reporting thread is a worker of the runtime, and the
  parent learns of the failure through ``on_failed``).

Rejected: a reentrant lock held across child calls (deadlocks as soon as a child's ``stop()`` waits
for a thread that reports the exit); a supervisor thread with its own queue (one more thread per
supervisor, and ``start``/``stop`` still need to wait for it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple, Protocol, runtime_checkable

from mighty._errors import BadInput, GuestError, HostError
from mighty.agents._types import CircuitOpen

__all__ = [
    "ChildHandle",
    "ChildInfo",
    "ChildSpec",
    "CircuitBreaker",
    "CircuitState",
    "EventKind",
    "RestartType",
    "RetiringHandle",
    "Strategy",
    "Supervisor",
    "SupervisorEvent",
    "SupervisorFailed",
    "SupervisorStartFailed",
    "SupervisorState",
]

_log = logging.getLogger(__name__)

RestartType = Literal["permanent", "transient", "temporary"]
"""permanent: always restarted; transient: only after a crash; temporary: never."""

Strategy = Literal["one_for_one", "rest_for_one", "one_for_all"]
"""Which children a restart takes along: the one that exited, those started after it, or all."""

EventKind = Literal[
    "child_started", "child_stopped", "child_restarted", "restart_limit", "supervisor_stopped"
]

SupervisorState = Literal["new", "starting", "running", "stopped", "failed"]

_RESTART_TYPES: tuple[RestartType, ...] = ("permanent", "transient", "temporary")
_STRATEGIES: tuple[Strategy, ...] = ("one_for_one", "rest_for_one", "one_for_all")


class SupervisorStartFailed(HostError):
    """A child raised while the supervisor was starting; the children already started were
    stopped again. The child's error is the ``__cause__``."""

    kind = "supervisor_start_failed"

    def __init__(self, message: str, *, supervisor: str, child: str) -> None:
        super().__init__(message)
        self.supervisor = supervisor
        self.child = child


class SupervisorFailed(GuestError):
    """Children crashed more often than the restart intensity allows; the supervisor stopped
    them all and gave up. Its parent treats this as a crash of the supervisor."""

    kind = "supervisor_failed"

    def __init__(
        self, message: str, *, supervisor: str, child: str, intensity: int, period: float
    ) -> None:
        super().__init__(message)
        self.supervisor = supervisor
        self.child = child
        self.intensity = intensity
        self.period = period


class ChildHandle(Protocol):
    """What a supervisor holds of a running child: only the means to stop it."""

    def stop(self) -> None:
        """Stop the child; stopping a stopped child does nothing."""
        ...


@runtime_checkable
class RetiringHandle(ChildHandle, Protocol):
    """A handle that wants to know when its supervisor will not start it again.

    ``stop`` may be followed by a restart (a group restart keeps an agent's mailbox); a child
    that exited or was stopped and will not be restarted (its restart type, a temporary
    sibling of a group restart, the supervisor giving up) is then ``retire``d, so that what it
    still holds (queued messages) is settled instead of waiting forever.
    """

    def retire(self) -> None:
        """The supervisor will not start this incarnation again; already stopped."""
        ...


@dataclass(frozen=True)
class ChildSpec:
    """How to start one child, and when to restart it."""

    name: str
    start: Callable[[], ChildHandle]
    restart: RestartType = "permanent"

    def __post_init__(self) -> None:
        if self.restart not in _RESTART_TYPES:
            raise BadInput(
                f"child {self.name!r}: restart must be one of {', '.join(_RESTART_TYPES)}, "
                f"not {self.restart!r}"
            )


@dataclass(frozen=True)
class SupervisorEvent:
    """Something the supervisor did or saw, for the runtime to log or emit."""

    kind: EventKind
    supervisor: str
    child: str | None
    reason: str
    time: float


class ChildInfo(NamedTuple):
    """One row of ``Supervisor.which_children``."""

    name: str
    handle: ChildHandle | None
    restart: RestartType
    restarts: int


_ChildStatus = Literal["down", "starting", "running", "stopping", "pending"]


@dataclass(eq=False)
class _Child:
    spec: ChildSpec
    handle: ChildHandle | None = None
    # pending: should be running and will be started by the restart in progress.
    status: _ChildStatus = "down"
    # Bumped at every start attempt, so an exit report names one incarnation.
    generation: int = 0
    restarts: int = 0
    # The handle of the latest start, kept while the child is down until it is retired.
    last: ChildHandle | None = None


@dataclass(eq=False)
class _Op:
    kind: Literal["start", "stop", "exit"]
    child: str = ""
    crashed: bool = False
    reason: str = ""
    generation: int = 0
    done: bool = False
    error: BaseException | None = None
    failure: SupervisorFailed | None = None


class Supervisor:
    """Starts children, restarts them by strategy and restart type, gives up past the intensity.

    Satisfies ``ChildHandle``: ``ChildSpec("sub", start=sub.start)`` nests ``sub``, and
    ``on_failed=lambda reason: parent.child_exited("sub", crashed=True, reason=reason)`` lets
    its failure reach the parent.
    """

    def __init__(
        self,
        name: str,
        children: Sequence[ChildSpec],
        strategy: Strategy = "one_for_one",
        intensity: int = 3,
        period: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        on_event: Callable[[SupervisorEvent], None] | None = None,
        on_failed: Callable[[str], None] | None = None,
    ) -> None:
        if strategy not in _STRATEGIES:
            raise BadInput(f"strategy must be one of {', '.join(_STRATEGIES)}, not {strategy!r}")
        if intensity < 0:
            raise BadInput(f"intensity must be >= 0, not {intensity}")
        if period <= 0:
            raise BadInput(f"period must be > 0, not {period}")
        names = [spec.name for spec in children]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise BadInput(f"supervisor {name!r}: child names repeat: {', '.join(duplicates)}")
        self._name = name
        self._strategy: Strategy = strategy
        self._intensity = intensity
        self._period = period
        self._clock = clock
        self._on_event = on_event
        self._on_failed = on_failed
        self._children = [_Child(spec) for spec in children]
        self._by_name = {child.spec.name: child for child in self._children}
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._queue: deque[_Op] = deque()
        self._runner: int | None = None
        # Calls to make once the runner role is released (on_failed).
        self._after: list[Callable[[], None]] = []
        self._state: SupervisorState = "new"
        self._restarts: deque[float] = deque()
        self._failure: SupervisorFailed | None = None

    # -- public API -------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The supervisor's name, used in events and errors."""
        return self._name

    @property
    def strategy(self) -> Strategy:
        """The restart strategy."""
        return self._strategy

    @property
    def intensity(self) -> int:
        """The most restarts allowed within ``period`` seconds."""
        return self._intensity

    @property
    def period(self) -> float:
        """The window, in seconds, the restart intensity counts over."""
        return self._period

    @property
    def state(self) -> SupervisorState:
        """new, starting, running, stopped or failed (gave up past the restart intensity)."""
        with self._lock:
            return self._state

    @property
    def failure(self) -> SupervisorFailed | None:
        """Why the supervisor gave up, if it did (cleared by the next ``start``)."""
        with self._lock:
            return self._failure

    def start(self) -> Supervisor:
        """Start every child in order and return self (so ``start=sup.start`` nests it).

        Restartable after ``stop`` or a failure, with a fresh restart history. If a child's
        start raises, the children already started are stopped in reverse order and
        ``SupervisorStartFailed`` names the child.
        """
        with self._lock:
            if self._runner == threading.get_ident():
                raise BadInput(
                    f"supervisor {self._name!r}: start() called from inside one of its own "
                    "operations (a child's start or stop); call it from elsewhere"
                )
        self._submit(_Op("start"), wait=True)
        return self

    def stop(self) -> None:
        """Stop every child in reverse start order. Idempotent.

        Called from inside one of this supervisor's own operations, it is queued and done right
        after that operation, and returns at once.
        """
        self._submit(_Op("stop"), wait=True)

    def retire(self) -> None:
        """Retire every child of a stopped or failed supervisor (see ``RetiringHandle``).

        A parent calls this when it will not restart this supervisor; a running supervisor
        is left alone.
        """
        with self._lock:
            if self._state not in ("stopped", "failed"):
                return
        self._retire(self._children)

    def child_exited(
        self,
        name: str,
        *,
        crashed: bool,
        reason: str = "",
        handle: ChildHandle | None = None,
    ) -> SupervisorFailed | None:
        """Report that child ``name`` stopped (``crashed=False``) or crashed, and react.

        Never waits for another thread. Returns the ``SupervisorFailed`` when this very report
        made the supervisor give up (``on_failed`` is called as well), else None. ``handle``,
        when given, ties the report to that incarnation: a report about a replaced one is
        ignored.
        """
        with self._lock:
            child = self._by_name.get(name)
            if child is None:
                raise BadInput(f"supervisor {self._name!r} has no child {name!r}")
            if child.status == "stopping":
                return None  # the supervisor is stopping it: this exit is the expected one
            if handle is not None and child.status != "starting" and child.handle is not handle:
                return None
            op = _Op("exit", name, crashed, reason, child.generation)
        self._submit(op, wait=False)
        return op.failure if op.done else None

    def relocate(
        self, name: str, handle: ChildHandle, start: Callable[[], ChildHandle]
    ) -> Callable[[], ChildHandle]:
        """Child ``name`` moved while running (a live migration): ``handle`` is its running
        incarnation now, and ``start`` starts it from now on. Returns the ``start`` it had.

        BadInput unless the child is running (a child being started, stopped or restarted
        is not moved)."""
        with self._lock:
            child = self._by_name.get(name)
            if child is None:
                raise BadInput(f"supervisor {self._name!r} has no child {name!r}")
            if child.status != "running" or self._state != "running":
                raise BadInput(
                    f"supervisor {self._name!r}: child {name!r} is {child.status}, not running"
                )
            previous = child.spec.start
            child.spec = ChildSpec(child.spec.name, start, child.spec.restart)
            child.handle = child.last = handle
        return previous

    def which_children(self) -> list[ChildInfo]:
        """(name, handle or None, restart type, restarts) of each child, in start order."""
        with self._lock:
            return [
                ChildInfo(c.spec.name, c.handle, c.spec.restart, c.restarts) for c in self._children
            ]

    children = which_children

    def __repr__(self) -> str:
        return f"Supervisor({self._name!r}, strategy={self._strategy!r}, state={self.state!r})"

    # -- operations -------------------------------------------------------------------------

    def _submit(self, op: _Op, *, wait: bool) -> None:
        """Queue ``op``; run the queue if no thread is, else wait for it when ``wait``."""
        me = threading.get_ident()
        with self._lock:
            self._queue.append(op)
            while True:
                if op.done:
                    break
                if self._runner is None:
                    self._runner = me
                    break
                if self._runner == me or not wait:
                    return
                self._changed.wait()
            ran = self._runner == me and not op.done
        if ran:
            self._run()
        if op.error is not None:
            error, op.error = op.error, None
            raise error

    def _run(self) -> None:
        """Run queued operations until none is left, then release the runner role."""
        calls: list[Callable[[], None]] = []
        try:
            while True:
                with self._lock:
                    if not self._queue:
                        # Released in the same critical section that saw the queue empty: an
                        # op queued after this finds no runner and runs itself.
                        self._runner = None
                        calls, self._after = self._after, []
                        self._changed.notify_all()
                        break
                    op = self._queue.popleft()
                try:
                    self._apply(op)
                except BaseException as exc:  # noqa: BLE001 -- handed to the thread that submitted the op
                    op.error = exc
                    if op.kind == "exit":
                        _log.exception("supervisor %r: handling an exit failed", self._name)
                with self._lock:
                    op.done = True
                    self._changed.notify_all()
        finally:
            with self._lock:
                if self._runner == threading.get_ident():  # left by an exception
                    self._runner = None
                    calls, self._after = self._after, []
                    self._changed.notify_all()
        for call in calls:
            call()

    def _apply(self, op: _Op) -> None:
        if op.kind == "start":
            self._do_start()
        elif op.kind == "stop":
            self._do_stop()
        else:
            self._do_exit(op)

    def _do_start(self) -> None:
        with self._lock:
            if self._state in ("starting", "running"):
                raise BadInput(f"supervisor {self._name!r} is already running")
            self._state = "starting"
            self._failure = None
            self._restarts.clear()
            for child in self._children:
                child.restarts = 0
        started: list[_Child] = []
        for child in self._children:
            try:
                self._start_child(child)
            except Exception as exc:
                self._stop_children(reversed(started), "shutdown: start failed")
                with self._lock:
                    self._state = "stopped"
                raise SupervisorStartFailed(
                    f"supervisor {self._name!r}: child {child.spec.name!r} failed to start: {exc}",
                    supervisor=self._name,
                    child=child.spec.name,
                ) from exc
            started.append(child)
            self._emit("child_started", child.spec.name, "")
        with self._lock:
            self._state = "running"

    def _do_stop(self) -> None:
        with self._lock:
            if self._state != "running":
                return
            self._state = "stopped"
        self._stop_children(reversed(self._children), "shutdown")
        self._emit("supervisor_stopped", None, "stopped")

    def _do_exit(self, op: _Op) -> None:
        with self._lock:
            child = self._by_name[op.child]
            if (
                self._state != "running"
                or child.generation != op.generation
                or child.status != "running"
            ):
                return  # stale: that incarnation was already replaced or stopped
            child.handle = None
            child.status = "down"
        how = "crashed" if op.crashed else "stopped"
        self._emit("child_stopped", child.spec.name, f"{how}: {op.reason}" if op.reason else how)
        if not _should_restart(child.spec.restart, crashed=op.crashed):
            self._retire([child])
            return
        crashed_child, reason = child, op.reason or "crashed"
        while True:
            if self._count_restart():
                op.failure = self._give_up(crashed_child, reason)
                return
            failed = self._restart(crashed_child)
            if failed is None:
                return
            crashed_child, reason = failed

    # -- steps ------------------------------------------------------------------------------

    def _count_restart(self) -> bool:
        """Record one restart now; True when that exceeds the intensity."""
        with self._lock:
            now = self._clock()
            # Sliding window: a restart counts while less than `period` seconds old.
            while self._restarts and now - self._restarts[0] >= self._period:
                self._restarts.popleft()
            self._restarts.append(now)
            return len(self._restarts) > self._intensity

    def _restart(self, exited: _Child) -> tuple[_Child, str] | None:
        """Apply the strategy for ``exited``; the child that failed to start, if any."""
        with self._lock:
            index = self._children.index(exited)
            if self._strategy == "one_for_one":
                group = [exited]
            else:
                first = index if self._strategy == "rest_for_one" else 0
                group = [
                    c
                    for c in self._children[first:]
                    if c is exited or c.status in ("running", "pending")
                ]
        others = [c for c in group if c is not exited]
        self._stop_children(
            reversed(others), f"shutdown: restarting after {exited.spec.name!r} exited"
        )
        with self._lock:
            for c in others:
                # A temporary sibling is stopped with the group but never restarted.
                c.status = "down" if c.spec.restart == "temporary" else "pending"
            exited.status = "pending"
            to_start = [c for c in group if c.status == "pending"]
        self._retire([c for c in others if c.status == "down"])
        for child in to_start:
            try:
                self._start_child(child)
            except Exception as exc:  # noqa: BLE001 -- a child that cannot start has crashed
                with self._lock:
                    child.status = "pending"
                reason = f"start failed: {exc!r}"
                self._emit("child_stopped", child.spec.name, reason)
                return child, reason
            with self._lock:
                child.restarts += 1
            self._emit("child_restarted", child.spec.name, "")
        return None

    def _give_up(self, child: _Child, reason: str) -> SupervisorFailed:
        with self._lock:
            self._state = "failed"
            message = (
                f"supervisor {self._name!r} gave up: more than {self._intensity} restarts in "
                f"{self._period}s (last: child {child.spec.name!r}, {reason})"
            )
            failure = SupervisorFailed(
                message,
                supervisor=self._name,
                child=child.spec.name,
                intensity=self._intensity,
                period=self._period,
            )
            self._failure = failure
            on_failed = self._on_failed
            if on_failed is not None:
                self._after.append(lambda: on_failed(message))
            for c in self._children:
                if c.status == "pending":
                    c.status = "down"
        self._emit("restart_limit", child.spec.name, message)
        self._stop_children(reversed(self._children), "shutdown: restart limit")
        self._retire(reversed(self._children))
        self._emit("supervisor_stopped", None, message)
        return failure

    def _start_child(self, child: _Child) -> None:
        """Start one child (runner only); raises what its start raises."""
        with self._lock:
            child.generation += 1
            child.status = "starting"
        try:
            handle = child.spec.start()
        except BaseException:
            with self._lock:
                child.status = "down"
            raise
        with self._lock:
            child.handle = handle
            child.last = handle
            child.status = "running"

    def _stop_children(self, children: Iterable[_Child], reason: str) -> None:
        """Stop the running ones of ``children``, in the order given (runner only)."""
        for child in children:
            with self._lock:
                handle = child.handle
                if child.status != "running" or handle is None:
                    continue
                child.status = "stopping"
            try:
                handle.stop()
            except Exception as exc:  # noqa: BLE001 -- one bad stop must not keep the rest running
                _log.warning("supervisor %r: stopping %r raised", self._name, child.spec.name)
                stop_reason = f"{reason} (stop raised {exc!r})"
            else:
                stop_reason = reason
            with self._lock:
                child.handle = None
                child.status = "down"
            self._emit("child_stopped", child.spec.name, stop_reason)

    def _retire(self, children: Iterable[_Child]) -> None:
        """Tell the stopped ``children``'s handles they will not be started again."""
        for child in children:
            with self._lock:
                handle, child.last = child.last, None
                if child.status != "down":
                    child.last = handle
                    continue
            if isinstance(handle, RetiringHandle):
                try:
                    handle.retire()
                except Exception:  # noqa: BLE001 -- one bad retire must not keep the rest
                    _log.exception("supervisor %r: retiring %r raised", self._name, child.spec.name)

    def _emit(self, kind: EventKind, child: str | None, reason: str) -> None:
        if self._on_event is None:
            return
        event = SupervisorEvent(kind, self._name, child, reason, self._clock())
        try:
            self._on_event(event)
        except Exception:  # noqa: BLE001 -- an observer must not break supervision
            _log.exception("supervisor %r: on_event raised", self._name)


def _should_restart(restart: RestartType, *, crashed: bool) -> bool:
    if restart == "permanent":
        return True
    if restart == "transient":
        return crashed
    return False


# -- circuit breaker ------------------------------------------------------------------------

CircuitState = Literal["closed", "open", "half_open"]


class CircuitBreaker:
    """Fail fast after repeated failures, then let one probe call test the water.

    closed -> open after ``failure_threshold`` failures within the last ``window`` seconds;
    open -> half_open once ``cooldown`` seconds have passed; half_open lets exactly one call
    through (the probe): its success closes the circuit and forgets the failures, its failure
    opens it again for a new cooldown. A probe that reports nothing within ``cooldown`` counts
    as failed, so a lost probe cannot keep the circuit half open forever. A success while
    closed does not forget failures (the window does). Reports that arrive while the circuit is
    open come from calls let through before it opened and are ignored. Thread-safe.
    """

    def __init__(
        self,
        name: str,
        failure_threshold: int = 5,
        window: float = 10.0,
        cooldown: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if failure_threshold < 1:
            raise BadInput(f"failure_threshold must be >= 1, not {failure_threshold}")
        if window <= 0 or cooldown < 0:
            raise BadInput(f"window must be > 0 and cooldown >= 0, not {window}, {cooldown}")
        self._name = name
        self._threshold = failure_threshold
        self._window = window
        self._cooldown = cooldown
        self._clock = clock
        self._lock = threading.Lock()
        self._failures: deque[float] = deque()
        self._state: CircuitState = "closed"
        self._opened_at = 0.0
        self._probe_at: float | None = None

    @property
    def name(self) -> str:
        """The name ``CircuitOpen`` carries."""
        return self._name

    @property
    def state(self) -> CircuitState:
        """closed, open, or half_open (cooldown over, probe not yet reported)."""
        with self._lock:
            return self._refresh(self._clock())

    def allow(self) -> bool:
        """May a call go through now? In half_open, True for the probe only."""
        with self._lock:
            now = self._clock()
            state = self._refresh(now)
            if state == "closed":
                return True
            if state == "open" or self._probe_at is not None:
                return False
            self._probe_at = now
            return True

    def check(self) -> None:
        """``allow()``, raising ``CircuitOpen`` instead of returning False."""
        if not self.allow():
            raise CircuitOpen(
                f"circuit {self._name!r} is open; next probe in {self.retry_after:.3g}s",
                name=self._name,
                retry_after=self.retry_after,
            )

    @property
    def retry_after(self) -> float:
        """Seconds until a probe may go through (0 when closed or half open)."""
        with self._lock:
            now = self._clock()
            if self._refresh(now) != "open":
                return 0.0
            return max(0.0, self._opened_at + self._cooldown - now)

    def record_success(self) -> None:
        """A call that ``allow`` let through succeeded."""
        with self._lock:
            if self._refresh(self._clock()) == "half_open":
                self._state = "closed"
                self._failures.clear()
                self._probe_at = None

    def record_failure(self) -> None:
        """A call that ``allow`` let through failed."""
        with self._lock:
            now = self._clock()
            state = self._refresh(now)
            if state == "half_open":
                self._open(now)
            elif state == "closed":
                self._failures.append(now)
                self._prune(now)
                if len(self._failures) >= self._threshold:
                    self._open(now)

    def __repr__(self) -> str:
        return f"CircuitBreaker({self._name!r}, state={self.state!r})"

    def _open(self, now: float) -> None:
        self._state = "open"
        self._opened_at = now
        self._probe_at = None
        self._failures.clear()

    def _prune(self, now: float) -> None:
        while self._failures and now - self._failures[0] >= self._window:
            self._failures.popleft()

    def _refresh(self, now: float) -> CircuitState:
        """Apply the passage of time to the state (lock held)."""
        if self._state == "open" and now - self._opened_at >= self._cooldown:
            self._state = "half_open"
            self._probe_at = None
        if (
            self._state == "half_open"
            and self._probe_at is not None
            and now - self._probe_at >= self._cooldown
            and self._cooldown > 0
        ):
            # The probe never reported: count it as failed, from the moment it timed out.
            self._open(self._probe_at + self._cooldown)
            return self._refresh(now)
        return self._state
