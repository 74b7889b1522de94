"""Supervision strategies, restart types and intensity, nesting, threading, circuit breaker."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mighty._errors import BadInput, GuestError, HostError
from mighty.agents._supervisor import (
    ChildHandle,
    ChildSpec,
    CircuitBreaker,
    CircuitOpen,
    RestartType,
    Strategy,
    Supervisor,
    SupervisorEvent,
    SupervisorFailed,
    SupervisorStartFailed,
)


class Clock:
    """A fake monotonic clock that only moves when told."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Child:
    """A fake child that records its stop in the shared log; stop is idempotent."""

    def __init__(self, name: str, log: list[tuple[str, str]]) -> None:
        self.name = name
        self.log = log
        self.stopped = False
        self.on_stop: Callable[[], None] | None = None

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        self.log.append(("stop", self.name))
        if self.on_stop is not None:
            self.on_stop()


class Harness:
    """Children a, b, c, d (or as given) that log start and stop into one list."""

    def __init__(
        self,
        names: str = "abcd",
        restart: dict[str, RestartType] | None = None,
    ) -> None:
        self.log: list[tuple[str, str]] = []
        self.handles: dict[str, list[Child]] = {n: [] for n in names}
        self.fail_start: set[str] = set()
        self.fail_once: set[str] = set()
        # Called inside a child's start, after it exists and before start returns.
        self.during_start: dict[str, Callable[[], None]] = {}
        restart = restart or {}
        self.specs = [ChildSpec(n, self._starter(n), restart.get(n, "permanent")) for n in names]

    def _starter(self, name: str) -> Callable[[], ChildHandle]:
        def start() -> ChildHandle:
            if name in self.fail_start:
                raise RuntimeError(f"{name} cannot start")
            if name in self.fail_once:
                self.fail_once.discard(name)
                raise RuntimeError(f"{name} cannot start yet")
            self.log.append(("start", name))
            child = Child(name, self.log)
            self.handles[name].append(child)
            hook = self.during_start.pop(name, None)
            if hook is not None:
                hook()
            return child

        return start

    def current(self, name: str) -> Child:
        return self.handles[name][-1]

    def crash(self, sup: Supervisor, name: str, *, crashed: bool = True) -> SupervisorFailed | None:
        """Mark the current incarnation dead (as the runtime would see it) and report it."""
        self.current(name).stopped = True
        return sup.child_exited(name, crashed=crashed, reason="boom" if crashed else "")

    def starts(self) -> list[str]:
        return [n for kind, n in self.log if kind == "start"]


def make(
    harness: Harness,
    strategy: Strategy = "one_for_one",
    *,
    intensity: int = 3,
    period: float = 5.0,
    clock: Clock | None = None,
    events: list[SupervisorEvent] | None = None,
    on_failed: Callable[[str], None] | None = None,
) -> Supervisor:
    return Supervisor(
        "sup",
        harness.specs,
        strategy,
        intensity=intensity,
        period=period,
        clock=clock or Clock(),
        on_event=None if events is None else events.append,
        on_failed=on_failed,
    )


# -- start and stop ---------------------------------------------------------------------------


def test_start_in_order_stop_in_reverse() -> None:
    """Children start in spec order and stop in reverse order."""
    h = Harness()
    sup = make(h)
    assert sup.start() is sup
    assert sup.state == "running"
    sup.stop()
    sup.stop()  # idempotent
    assert h.log == [("start", n) for n in "abcd"] + [("stop", n) for n in "dcba"]
    assert sup.state == "stopped"


def test_which_children_reports_handles_types_and_restarts() -> None:
    """which_children lists name, current handle, restart type and restart count in order."""
    h = Harness("ab", {"b": "transient"})
    sup = make(h).start()
    h.crash(sup, "b")
    rows = sup.which_children()
    assert [(r.name, r.restart, r.restarts) for r in rows] == [
        ("a", "permanent", 0),
        ("b", "transient", 1),
    ]
    assert rows[1].handle is h.current("b")
    assert sup.children() == rows
    sup.stop()
    assert [r.handle for r in sup.which_children()] == [None, None]


def test_start_failure_rolls_back_in_reverse() -> None:
    """A child whose start raises: the started ones stop in reverse, the error names it."""
    h = Harness()
    h.fail_start.add("c")
    sup = make(h)
    with pytest.raises(SupervisorStartFailed, match="'c'") as info:
        sup.start()
    assert info.value.child == "c"
    assert isinstance(info.value.__cause__, RuntimeError)
    assert isinstance(info.value, HostError)
    assert h.log == [("start", "a"), ("start", "b"), ("stop", "b"), ("stop", "a")]
    assert sup.state == "stopped"
    # Once the cause is fixed, the same supervisor starts.
    h.fail_start.clear()
    sup.start()
    assert sup.state == "running"


def test_bad_configuration_is_refused() -> None:
    """Unknown strategies, restart types, duplicate names and bad limits raise BadInput."""
    h = Harness("ab")
    with pytest.raises(BadInput, match="strategy"):
        Supervisor("s", h.specs, "one_for_some")  # type: ignore[arg-type]
    with pytest.raises(BadInput, match="restart"):
        ChildSpec("x", lambda: Child("x", []), "sometimes")  # type: ignore[arg-type]
    with pytest.raises(BadInput, match="repeat"):
        Supervisor("s", [h.specs[0], h.specs[0]])
    with pytest.raises(BadInput, match="intensity"):
        Supervisor("s", h.specs, intensity=-1)
    with pytest.raises(BadInput, match="period"):
        Supervisor("s", h.specs, period=0)


def test_unknown_child_and_double_start_are_refused() -> None:
    """Reporting an unknown child or starting a running supervisor raises BadInput."""
    sup = make(Harness("a")).start()
    with pytest.raises(BadInput, match="no child"):
        sup.child_exited("zz", crashed=True)
    with pytest.raises(BadInput, match="already running"):
        sup.start()


# -- strategies -------------------------------------------------------------------------------


def test_one_for_one_restarts_only_that_child() -> None:
    """one_for_one restarts the crashed child and touches no other."""
    h = Harness()
    sup = make(h).start()
    h.log.clear()
    assert h.crash(sup, "b") is None
    assert h.log == [("start", "b")]
    assert [r.restarts for r in sup.which_children()] == [0, 1, 0, 0]


def test_rest_for_one_restarts_it_and_those_after() -> None:
    """rest_for_one stops the later children in reverse, then restarts from the crashed one."""
    h = Harness()
    sup = make(h, "rest_for_one").start()
    h.log.clear()
    h.crash(sup, "b")
    assert h.log == [("stop", "d"), ("stop", "c"), ("start", "b"), ("start", "c"), ("start", "d")]
    assert [r.restarts for r in sup.which_children()] == [0, 1, 1, 1]


def test_one_for_all_restarts_everyone() -> None:
    """one_for_all stops all the others in reverse, then restarts all in order."""
    h = Harness()
    sup = make(h, "one_for_all").start()
    h.log.clear()
    h.crash(sup, "b")
    assert h.log == [
        ("stop", "d"),
        ("stop", "c"),
        ("stop", "a"),
        *[("start", n) for n in "abcd"],
    ]


def test_group_restart_stops_a_temporary_sibling_for_good() -> None:
    """A running temporary sibling is stopped with the group and not restarted (as in OTP)."""
    h = Harness(restart={"c": "temporary"})
    sup = make(h, "one_for_all").start()
    h.log.clear()
    h.crash(sup, "a")
    assert h.log == [("stop", "d"), ("stop", "c"), ("stop", "b")] + [("start", n) for n in "abd"]
    assert sup.which_children()[2].handle is None


def test_group_restart_leaves_a_child_that_stayed_down() -> None:
    """A transient child that stopped normally is not brought back by a sibling's restart."""
    h = Harness(restart={"d": "transient"})
    sup = make(h, "rest_for_one").start()
    h.crash(sup, "d", crashed=False)
    h.log.clear()
    h.crash(sup, "b")
    assert h.log == [("stop", "c"), ("start", "b"), ("start", "c")]


# -- restart types ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("restart", "crashed", "restarted"),
    [
        ("permanent", False, True),
        ("permanent", True, True),
        ("transient", False, False),
        ("transient", True, True),
        ("temporary", False, False),
        ("temporary", True, False),
    ],
)
def test_restart_type_decides(restart: RestartType, crashed: bool, restarted: bool) -> None:
    """permanent always restarts, transient only after a crash, temporary never."""
    h = Harness("ab", {"a": restart})
    sup = make(h, "rest_for_one").start()
    h.log.clear()
    h.crash(sup, "a", crashed=crashed)
    # Under rest_for_one nothing else moves when the exited child is not restarted.
    expected = [("stop", "b"), ("start", "a"), ("start", "b")] if restarted else []
    assert h.log == expected
    assert (sup.which_children()[0].handle is not None) == restarted


# -- intensity --------------------------------------------------------------------------------


def test_intensity_exceeded_at_the_n_plus_first_restart() -> None:
    """With intensity 3, three restarts within the period pass and the fourth fails."""
    h = Harness()
    clock = Clock()
    events: list[SupervisorEvent] = []
    failed: list[str] = []
    sup = make(h, clock=clock, events=events, on_failed=failed.append).start()
    for _ in range(3):
        clock.advance(1)
        assert h.crash(sup, "a") is None
    assert sup.state == "running"
    h.log.clear()
    clock.advance(1)
    failure = h.crash(sup, "a")
    assert isinstance(failure, SupervisorFailed)
    assert isinstance(failure, GuestError)
    assert (failure.supervisor, failure.child, failure.intensity) == ("sup", "a", 3)
    assert sup.state == "failed"
    assert sup.failure is failure
    assert h.log == [("stop", "d"), ("stop", "c"), ("stop", "b")]
    assert failed == [failure.message]
    kinds = [e.kind for e in events]
    assert kinds[-5:] == [
        "restart_limit",
        "child_stopped",
        "child_stopped",
        "child_stopped",
        "supervisor_stopped",
    ]
    assert events[-5].time == 4.0
    # A failed supervisor ignores further reports.
    assert sup.child_exited("b", crashed=True) is None


def test_intensity_not_exceeded_when_restarts_are_spread_out() -> None:
    """Restarts further apart than period/intensity never fail the supervisor."""
    h = Harness()
    clock = Clock()
    sup = make(h, clock=clock, intensity=3, period=5.0).start()
    for i in range(50):
        clock.advance(2.0)
        assert h.crash(sup, "abcd"[i % 4]) is None
    assert sup.state == "running"


def test_intensity_window_is_sliding() -> None:
    """A restart leaves the window exactly `period` seconds after it happened."""
    h = Harness()
    clock = Clock()
    sup = make(h, clock=clock, intensity=2, period=5.0).start()
    h.crash(sup, "a")
    h.crash(sup, "a")  # two at t=0
    clock.advance(5.0)  # both are now exactly `period` old: out of the window
    h.crash(sup, "a")
    h.crash(sup, "a")
    assert sup.state == "running"
    clock.advance(4.9)
    assert h.crash(sup, "a") is not None  # the two at t=5 still count


def test_intensity_zero_fails_on_the_first_restart() -> None:
    """intensity=0 means no restart is allowed at all."""
    h = Harness("a")
    sup = make(h, intensity=0).start()
    assert h.crash(sup, "a") is not None
    assert h.starts() == ["a"]


def test_a_child_that_cannot_restart_fails_the_supervisor() -> None:
    """A failed restart counts as a crash and is retried until the intensity runs out."""
    h = Harness("ab")
    events: list[SupervisorEvent] = []
    sup = make(h, intensity=3, events=events).start()
    h.fail_start.add("a")
    failure = h.crash(sup, "a")
    assert failure is not None
    assert sum(e.kind == "child_stopped" and "start failed" in e.reason for e in events) == 3
    assert sup.state == "failed"


def test_a_failed_restart_resumes_the_group() -> None:
    """When a group restart cannot start a child, the retry starts it and the rest in order."""
    h = Harness()
    events: list[SupervisorEvent] = []
    sup = make(h, "rest_for_one", intensity=5, events=events).start()
    h.fail_once.add("b")
    h.log.clear()
    h.crash(sup, "b")
    # First round: c, d stopped, b fails to start; second round: b, c, d start in order.
    assert h.log == [("stop", "d"), ("stop", "c"), ("start", "b"), ("start", "c"), ("start", "d")]
    assert sup.state == "running"
    assert any("start failed" in e.reason for e in events)


# -- nesting ----------------------------------------------------------------------------------


def test_nested_supervisor_failure_is_a_crash_for_the_parent() -> None:
    """A child supervisor that gives up is restarted by its parent, with fresh children."""
    h = Harness("g")
    clock = Clock()
    parent_events: list[SupervisorEvent] = []
    parent: Supervisor | None = None

    def escalate(reason: str) -> None:
        assert parent is not None
        parent.child_exited("sub", crashed=True, reason=reason)

    sub = make(h, intensity=1, clock=clock, on_failed=escalate)
    other = Harness("x")
    parent = Supervisor(
        "top",
        [*other.specs, ChildSpec("sub", sub.start)],
        clock=clock,
        on_event=parent_events.append,
    ).start()
    assert sub.state == "running"
    h.crash(sub, "g")  # one restart: allowed
    assert h.crash(sub, "g") is not None  # the second gives up
    # The parent restarted the sub-supervisor, which started g afresh.
    assert sub.state == "running"
    assert h.starts() == ["g", "g", "g"]
    assert [(r.name, r.restarts) for r in parent.which_children()] == [("x", 0), ("sub", 1)]
    assert any(e.kind == "child_restarted" and e.child == "sub" for e in parent_events)
    parent.stop()
    assert sub.state == "stopped"
    assert h.log[-1] == ("stop", "g")


def test_failure_escalates_to_the_top() -> None:
    """When every level is out of restarts, the failure climbs to the top's on_failed."""
    h = Harness("g")
    top_failed: list[str] = []
    levels: dict[str, Supervisor] = {}

    def escalate_to(parent: str, child: str) -> Callable[[str], None]:
        def escalate(reason: str) -> None:
            levels[parent].child_exited(child, crashed=True, reason=reason)

        return escalate

    levels["mid"] = make(h, intensity=0, on_failed=escalate_to("top", "mid"))
    levels["top"] = Supervisor(
        "top", [ChildSpec("mid", levels["mid"].start)], intensity=0, on_failed=top_failed.append
    ).start()
    h.crash(levels["mid"], "g")
    assert levels["mid"].state == "failed"
    assert levels["top"].state == "failed"
    assert len(top_failed) == 1
    assert "'top' gave up" in top_failed[0]


# -- threading and reentrancy -----------------------------------------------------------------


def test_child_reporting_its_exit_from_stop_does_not_deadlock() -> None:
    """A child whose stop() reports its own exit synchronously is not restarted twice."""
    h = Harness()
    sup = make(h, "one_for_all").start()

    def reporter(name: str) -> Callable[[], None]:
        def report() -> None:
            sup.child_exited(name, crashed=False)

        return report

    for name in "acd":
        h.current(name).on_stop = reporter(name)
    h.log.clear()
    h.crash(sup, "b")
    assert h.starts() == list("abcd")
    assert [r.restarts for r in sup.which_children()] == [1, 1, 1, 1]


def test_child_whose_stop_joins_a_reporting_thread_does_not_deadlock() -> None:
    """stop() may wait for another thread that reports the exit: reports never block."""
    h = Harness("ab")
    sup = make(h, "one_for_all").start()
    worker_done = threading.Event()

    def report() -> None:
        sup.child_exited("a", crashed=False)
        worker_done.set()

    def stop_via_thread() -> None:
        reporter = threading.Thread(target=report)
        reporter.start()
        reporter.join(timeout=5)

    h.current("a").on_stop = stop_via_thread
    runner = threading.Thread(target=lambda: h.crash(sup, "b"))
    runner.start()
    runner.join(timeout=5)
    assert not runner.is_alive()
    assert worker_done.is_set()
    assert h.starts() == ["a", "b", "a", "b"]


def test_stop_called_from_inside_a_child_stop_is_queued() -> None:
    """sup.stop() from within one of its own operations returns at once and runs next."""
    h = Harness("ab")
    sup = make(h, "one_for_all").start()
    h.current("a").on_stop = sup.stop
    h.log.clear()
    h.crash(sup, "b")
    # The restart finished first, then the queued stop stopped everyone.
    assert h.log == [("stop", "a"), ("start", "a"), ("start", "b"), ("stop", "b"), ("stop", "a")]
    assert sup.state == "stopped"


def test_start_from_inside_an_operation_is_refused() -> None:
    """start() from inside one of the supervisor's own operations raises instead of hanging."""
    h = Harness("ab")
    sup = make(h).start()
    errors: list[BaseException] = []

    def restart_self() -> None:
        try:
            sup.start()
        except BadInput as exc:
            errors.append(exc)

    h.current("b").on_stop = restart_self
    sup.stop()
    assert len(errors) == 1


def test_exit_reported_during_start_is_handled_after() -> None:
    """A child that crashes while its siblings are still starting is restarted afterwards."""
    h = Harness("ab")
    sup = make(h)

    def report_crash() -> None:
        # Reported before a's start() has even returned.
        sup.child_exited("a", crashed=True)

    h.during_start["a"] = report_crash
    sup.start()
    assert h.starts() == ["a", "b", "a"]
    assert sup.which_children()[0].restarts == 1


def test_stale_report_about_a_replaced_child_is_ignored() -> None:
    """A late report naming an old handle does not restart the new incarnation."""
    h = Harness("a")
    sup = make(h).start()
    old = h.current("a")
    h.crash(sup, "a")
    assert sup.child_exited("a", crashed=True, handle=old) is None
    assert h.starts() == ["a", "a"]
    sup.child_exited("a", crashed=True, handle=h.current("a"))
    assert h.starts() == ["a", "a", "a"]


def test_concurrent_crash_reports_are_all_handled() -> None:
    """Crashes reported from many threads at once each lead to one restart, without deadlock."""
    names = [f"c{i}" for i in range(8)]
    h = Harness(names)  # type: ignore[arg-type]
    sup = make(h, intensity=10_000).start()
    barrier = threading.Barrier(len(names))

    def crash_many(name: str) -> None:
        barrier.wait()
        for _ in range(50):
            sup.child_exited(name, crashed=True, handle=h.current(name))

    threads = [threading.Thread(target=crash_many, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert sup.state == "running"
    # Each report named the handle current when it was made; stale ones were ignored.
    rows = sup.which_children()
    assert all(r.handle is h.current(r.name) for r in rows)
    assert sum(r.restarts for r in rows) == len(h.starts()) - len(names)


def test_stop_from_another_thread_waits_for_a_running_restart() -> None:
    """stop() from a second thread waits until the restart in progress is done, then stops."""
    h = Harness("ab")
    sup = make(h).start()
    entered, release = threading.Event(), threading.Event()

    def slow_start() -> None:
        entered.set()
        release.wait(timeout=5)

    h.during_start["a"] = slow_start
    crasher = threading.Thread(target=lambda: h.crash(sup, "a"))
    crasher.start()
    assert entered.wait(timeout=5)
    stopper = threading.Thread(target=sup.stop)
    stopper.start()
    stopper.join(timeout=0.1)
    assert stopper.is_alive()  # waiting for the restart
    release.set()
    crasher.join(timeout=5)
    stopper.join(timeout=5)
    assert not stopper.is_alive()
    assert sup.state == "stopped"
    assert h.log[-2:] == [("stop", "b"), ("stop", "a")]


def test_a_raising_observer_does_not_break_supervision(caplog: pytest.LogCaptureFixture) -> None:
    """An on_event callback that raises is logged and ignored."""

    def bad(event: SupervisorEvent) -> None:
        raise ValueError("observer bug")

    h = Harness("a")
    sup = Supervisor("s", h.specs, on_event=bad).start()
    h.crash(sup, "a")
    assert h.starts() == ["a", "a"]
    assert "on_event raised" in caplog.text


def test_events_describe_what_happened() -> None:
    """Events name the kind, supervisor, child, reason and time of each step."""
    h = Harness("ab")
    clock = Clock()
    events: list[SupervisorEvent] = []
    sup = make(h, clock=clock, events=events).start()
    clock.advance(2)
    h.crash(sup, "b")
    sup.stop()
    assert [(e.kind, e.child) for e in events] == [
        ("child_started", "a"),
        ("child_started", "b"),
        ("child_stopped", "b"),
        ("child_restarted", "b"),
        ("child_stopped", "b"),
        ("child_stopped", "a"),
        ("supervisor_stopped", None),
    ]
    assert events[2].reason == "crashed: boom"
    assert events[2].time == 2.0
    assert all(e.supervisor == "sup" for e in events)


# -- property: random crash sequences ---------------------------------------------------------

steps = st.lists(
    st.one_of(
        st.tuples(st.just("exit"), st.integers(0, 3), st.booleans()),
        st.tuples(st.just("advance"), st.floats(0, 3), st.just(False)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(
    strategy=st.sampled_from(["one_for_one", "rest_for_one", "one_for_all"]),
    types=st.lists(
        st.sampled_from(["permanent", "transient", "temporary"]), min_size=4, max_size=4
    ),
    intensity=st.integers(0, 4),
    period=st.floats(0.5, 10),
    script=steps,
)
def test_random_crash_sequences_keep_the_rules(
    strategy: Strategy,
    types: list[RestartType],
    intensity: int,
    period: float,
    script: list[tuple[str, float, bool]],
) -> None:
    """Temporary children never restart, the intensity is never exceeded silently, order holds."""
    names = "abcd"
    h = Harness(names, dict(zip(names, types, strict=True)))
    clock = Clock()
    sup = make(h, strategy, intensity=intensity, period=period, clock=clock).start()
    window: list[float] = []  # the model's restart times
    for kind, value, crashed in script:
        if kind == "advance":
            clock.advance(value)
            continue
        if sup.state == "failed":
            break
        name = names[int(value)]
        row = sup.which_children()[int(value)]
        restart = row.restart
        will_restart = row.handle is not None and (
            restart == "permanent" or (restart == "transient" and crashed)
        )
        h.log.clear()
        if row.handle is None:
            sup.child_exited(name, crashed=crashed)  # a report about a dead child: ignored
            assert h.log == []
            continue
        failure = h.crash(sup, name, crashed=crashed)
        if will_restart:
            window = [t for t in window if clock.now - t < period] + [clock.now]
        should_fail = will_restart and len(window) > intensity
        assert (failure is not None) == should_fail
        assert (sup.state == "failed") == should_fail
        stops = [names.index(n) for k, n in h.log if k == "stop"]
        starts = [names.index(n) for k, n in h.log if k == "start"]
        # Stops in reverse start order, then starts in start order, never interleaved.
        assert stops == sorted(stops, reverse=True)
        assert starts == sorted(starts)
        assert h.log[: len(stops)] == [("stop", names[i]) for i in stops]
        if not will_restart:
            assert h.log == []
    for name, restart in zip(names, types, strict=True):
        if restart == "temporary":
            assert len(h.handles[name]) == 1
    if sup.state == "failed":
        assert all(r.handle is None for r in sup.which_children())


# -- circuit breaker --------------------------------------------------------------------------


def test_circuit_opens_after_threshold_failures_in_window() -> None:
    """failure_threshold failures within the window open the circuit."""
    clock = Clock()
    cb = CircuitBreaker("svc", failure_threshold=3, window=10, cooldown=5, clock=clock)
    for _ in range(2):
        assert cb.allow()
        cb.record_failure()
        clock.advance(1)
    assert cb.state == "closed"
    cb.record_failure()
    assert cb.state == "open"
    assert not cb.allow()


def test_failures_outside_the_window_do_not_open() -> None:
    """Failures spread wider than the window never reach the threshold."""
    clock = Clock()
    cb = CircuitBreaker("svc", failure_threshold=3, window=10, clock=clock)
    for _ in range(20):
        cb.record_failure()
        clock.advance(5)
    assert cb.state == "closed"


def test_open_circuit_fails_fast_with_circuit_open() -> None:
    """check() raises CircuitOpen carrying the name and the seconds until the probe."""
    clock = Clock()
    cb = CircuitBreaker("svc", failure_threshold=1, cooldown=5, clock=clock)
    cb.record_failure()
    clock.advance(2)
    with pytest.raises(CircuitOpen, match="svc") as info:
        cb.check()
    assert info.value.name == "svc"
    assert info.value.retry_after == pytest.approx(3.0)
    assert info.value.kind == "circuit_open"


def test_half_open_lets_exactly_one_probe_through() -> None:
    """After the cooldown one call is allowed; the others are refused until it reports."""
    clock = Clock()
    cb = CircuitBreaker("svc", failure_threshold=1, cooldown=5, clock=clock)
    cb.record_failure()
    clock.advance(5)
    assert cb.state == "half_open"
    assert cb.retry_after == 0
    assert cb.allow()
    assert not cb.allow()
    assert not cb.allow()
    with pytest.raises(CircuitOpen):
        cb.check()


def test_probe_success_closes_and_forgets_failures() -> None:
    """A successful probe closes the circuit and resets the failure count."""
    clock = Clock()
    cb = CircuitBreaker("svc", failure_threshold=2, cooldown=5, clock=clock)
    cb.record_failure()
    cb.record_failure()
    clock.advance(5)
    assert cb.allow()
    cb.record_success()
    assert cb.state == "closed"
    cb.record_failure()
    assert cb.state == "closed"  # one failure, not three


def test_probe_failure_reopens_for_a_new_cooldown() -> None:
    """A failed probe opens the circuit again, counting the cooldown from the failure."""
    clock = Clock()
    cb = CircuitBreaker("svc", failure_threshold=1, cooldown=5, clock=clock)
    cb.record_failure()
    clock.advance(5)
    assert cb.allow()
    clock.advance(1)
    cb.record_failure()
    assert cb.state == "open"
    clock.advance(4.9)
    assert not cb.allow()
    clock.advance(0.1)
    assert cb.allow()


def test_a_lost_probe_counts_as_failed() -> None:
    """A probe that never reports reopens the circuit after a cooldown instead of sticking."""
    clock = Clock()
    cb = CircuitBreaker("svc", failure_threshold=1, cooldown=5, clock=clock)
    cb.record_failure()
    clock.advance(5)
    assert cb.allow()
    clock.advance(5)
    assert cb.state == "open"
    clock.advance(5)
    assert cb.allow()


def test_reports_while_open_are_ignored() -> None:
    """Late results of calls let through before the circuit opened change nothing."""
    clock = Clock()
    cb = CircuitBreaker("svc", failure_threshold=1, cooldown=5, clock=clock)
    cb.record_failure()
    clock.advance(1)
    cb.record_success()
    cb.record_failure()
    assert cb.state == "open"
    assert cb.retry_after == pytest.approx(4.0)


def test_only_one_probe_among_many_threads() -> None:
    """Threads racing in half_open get exactly one True from allow()."""
    clock = Clock()
    cb = CircuitBreaker("svc", failure_threshold=1, cooldown=5, clock=clock)
    cb.record_failure()
    clock.advance(5)
    barrier = threading.Barrier(16)
    results: list[bool] = []
    lock = threading.Lock()

    def race() -> None:
        barrier.wait()
        allowed = cb.allow()
        with lock:
            results.append(allowed)

    threads = [threading.Thread(target=race) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=5)
    assert sorted(results) == [False] * 15 + [True]


def test_circuit_bad_arguments_are_refused() -> None:
    """A zero threshold or window raises BadInput."""
    with pytest.raises(BadInput):
        CircuitBreaker("x", failure_threshold=0)
    with pytest.raises(BadInput):
        CircuitBreaker("x", window=0)
