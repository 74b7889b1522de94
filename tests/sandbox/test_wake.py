"""The sync call's hand-off: the compiled bell (sandbox/_wake.c) against its pure-Python form
(``_PipeBell``, the oracle), and the pool's hand-off state machine (submit, wait, complete,
abandon, close in any order) with either bell."""

from __future__ import annotations

import gc
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    rule,
    run_state_machine_as_test,
)

from mighty.abi import Ok
from mighty.budget import RunContext
from mighty.sandbox import _tools as tools
from mighty.sandbox import _wake
from mighty.sandbox._tools import _BellLike, _Job, _PipeBell, _Workers, tools_from

BELLS: dict[str, Callable[[], _BellLike]] = {"compiled": _wake.Bell, "pure": _PipeBell}
SPINS = {"compiled": [0, 20_000, 200_000], "pure": [0]}  # the pure bell ignores the spin
LONG = 30_000_000_000  # a wait that only a ring may end within a test


@pytest.fixture(params=sorted(BELLS))
def make_bell(request: pytest.FixtureRequest) -> Callable[[], _BellLike]:
    return BELLS[request.param]


def test_the_compiled_module_is_built_from_its_source() -> None:
    """The editable install's extension is newer than sandbox/_wake.c (else run
    ``python hatch_build.py``), and this process uses it unless told not to."""
    source = Path(tools.__file__).with_name("_wake.c")
    assert Path(_wake.__file__).stat().st_mtime >= source.stat().st_mtime
    pure = os.environ.get("MIGHTY_PURE_PYTHON", "") not in ("", "0")
    assert tools._Bell is (_PipeBell if pure else _wake.Bell)
    assert tools.HANDOFF_SPIN_NS == 0 or not pure


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
class BellsAgree(RuleBasedStateMachine):
    """One thread: rings, waits (spinning or not, blocking or not), rings through another bell,
    closes; the compiled bell answers as the pure one does, and both as the model: a wait is
    True when a ring came since the last True wait, a closed bell ignores rings and waits."""

    def __init__(self) -> None:
        super().__init__()
        self.pairs = [(_wake.Bell(), _PipeBell()) for _ in range(2)]
        self.rung = [False, False]
        self.closed = [False, False]

    @rule(i=st.integers(0, 1))
    def ring(self, i: int) -> None:
        for bell in self.pairs[i]:
            bell.ring()
        self.rung[i] = self.rung[i] or not self.closed[i]

    @rule(i=st.integers(0, 1), spin=st.sampled_from([0, 1, 5_000]), block=st.booleans())
    def wait(self, i: int, spin: int, block: bool) -> None:
        # Blocking only when a ring is due (or the bell closed): a wait for nothing would sleep.
        timeout = 2_000_000 if block else 0
        got = [bell.wait(spin, timeout) for bell in self.pairs[i]]
        expected = self.rung[i] and not self.closed[i]
        assert got == [expected, expected]
        self.rung[i] = False if not self.closed[i] else self.rung[i]

    @rule(i=st.integers(0, 1), j=st.integers(0, 1))
    def wait_ringing(self, i: int, j: int) -> None:
        """wait(ring=other): the other is rung first (itself too, when i == j)."""
        got = [
            bell.wait(0, 0, other) for bell, other in zip(self.pairs[i], self.pairs[j], strict=True)
        ]
        self.rung[j] = self.rung[j] or not self.closed[j]
        expected = self.rung[i] and not self.closed[i]
        assert got == [expected, expected]
        if not self.closed[i]:
            self.rung[i] = False

    @rule(i=st.integers(0, 1))
    def close(self, i: int) -> None:
        for bell in self.pairs[i]:
            bell.close()
        self.closed[i] = True

    @invariant()
    def closed_agrees(self) -> None:
        for (compiled, pure), closed in zip(self.pairs, self.closed, strict=True):
            assert compiled.closed == pure.closed == closed

    def teardown(self) -> None:
        for pair in self.pairs:
            for bell in pair:
                bell.close()


TestBellsAgree = BellsAgree.TestCase


def test_bad_arguments_are_refused_alike(make_bell: Callable[[], _BellLike]) -> None:
    bell = make_bell()
    other = _PipeBell() if isinstance(bell, _wake.Bell) else _wake.Bell()
    for spin, timeout in ((-1, 0), (_wake.MAX_SPIN_NS + 1, 0), (0, -2), (0, 3601 * 10**9)):
        with pytest.raises(ValueError, match=r"spin_ns|timeout_ns"):
            bell.wait(spin, timeout)
    with pytest.raises(TypeError, match="ring must be a Bell"):
        bell.wait(0, 0, other)  # the other kind of bell is not this kind's
    with pytest.raises(TypeError, match="ring must be a Bell"):
        bell.wait(0, 0, 3)
    with pytest.raises(TypeError):
        bell.wait("1", 0)  # type: ignore[arg-type]
    bell.close()


def test_ping_pong_between_two_threads_loses_no_wake_up(
    make_bell: Callable[[], _BellLike],
) -> None:
    """Two threads hand a token back and forth 2,000 times through wait(ring=other), as a
    caller and a worker do: with each spin (0: every wait parks), none is lost (a lost one
    would leave both asleep: the long timeout would fail the test, not hang it)."""
    kind = "compiled" if make_bell is _wake.Bell else "pure"
    for spin in SPINS[kind]:
        here, there = make_bell(), make_bell()
        rounds = 2000
        seen: list[int] = []

        def peer(
            here: _BellLike = here,
            there: _BellLike = there,
            spin: int = spin,
            rounds: int = rounds,
            seen: list[int] = seen,
        ) -> None:
            assert there.wait(spin, LONG)
            for n in range(rounds):
                seen.append(n)
                if n == rounds - 1:
                    here.ring()
                else:
                    assert there.wait(spin, LONG, here)

        thread = threading.Thread(target=peer)
        thread.start()
        for _ in range(rounds):
            assert here.wait(spin, LONG, there)
        thread.join(10)
        assert not thread.is_alive()
        assert seen == list(range(rounds))
        here.close()
        there.close()


def _pipes() -> set[str]:
    """The pipes this process has open (``pipe:[inode]``; both ends of one pipe are one)."""
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # closed meanwhile
            continue
        if link.startswith("pipe:"):
            found.add(link)
    return found


def _made(make: Callable[[], _BellLike]) -> tuple[_BellLike, set[str]]:
    """A bell and the pipe it opened (other threads of the suite, e.g. a pool refilling in the
    background, open and close pipes too: they can only make the set larger, never hide the
    bell's from the checks below)."""
    before = _pipes()
    bell = make()
    return bell, _pipes() - before


def test_closing_wakes_a_parked_waiter_and_frees_the_pipe_after_it(
    make_bell: Callable[[], _BellLike],
) -> None:
    """A close from another thread wakes a waiter parked for 30 s; the pipe is closed when the
    waiter leaves (not under it: its descriptor might be reused meanwhile)."""
    bell, pipe = _made(make_bell)
    assert pipe
    parked = threading.Event()
    left: list[float] = []

    def waiter() -> None:
        parked.set()
        started = time.monotonic()
        bell.wait(0, LONG)
        left.append(time.monotonic() - started)

    thread = threading.Thread(target=waiter)
    thread.start()
    parked.wait(10)
    time.sleep(0.05)  # into its poll (a close before it is fine too: it returns at once)
    bell.close()
    thread.join(10)
    assert not thread.is_alive()
    assert left and left[0] < 10
    assert bell.closed
    assert not pipe & _pipes()
    bell.ring()  # a late ring of a closed bell: nothing
    assert not bell.wait(0, 0)


@pytest.mark.timing
def test_a_signal_handler_that_raises_ends_a_parked_wait(
    make_bell: Callable[[], _BellLike],
) -> None:
    """Ctrl-C (here SIGALRM's handler) during a parked wait on the main thread raises out of
    it, as the host's Ctrl-C during a sync tool must."""

    class Alarm(Exception):
        pass

    def handler(signum: int, frame: Any) -> None:
        raise Alarm

    old = signal.signal(signal.SIGALRM, handler)
    bell = make_bell()
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        started = time.monotonic()
        with pytest.raises(Alarm):
            bell.wait(0, 600_000_000_000)
        # Woken by the signal (at 0.05 s), not by the wait's own 600 s timeout; the wide gap
        # between the two leaves a loaded machine room (the timeout was 5 s, the bound 4 s).
        assert time.monotonic() - started < 300
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        bell.close()


def test_a_bell_dropped_unclosed_frees_its_pipe(make_bell: Callable[[], _BellLike]) -> None:
    pipes: set[str] = set()
    for _ in range(50):
        bell, pipe = _made(make_bell)
        pipes |= pipe
        bell.ring()
        del bell
    gc.collect()
    assert pipes
    assert not pipes & _pipes()


# -- the pool's hand-off state machine ----------------------------------------------------------


class _Gate:
    """What a test tool blocks on until the test lets it return."""

    def __init__(self) -> None:
        self.opened = threading.Event()
        self.ran = threading.Event()


_GATES: dict[int, _Gate] = {}


def gated(key: int) -> int:
    gate = _GATES[key]
    gate.ran.set()
    if not gate.opened.wait(20):
        raise TimeoutError("the test never opened the gate")
    return key


_TOOL = tools_from([gated])["gated"]
_CONTEXT = RunContext.top("tool")
_POOLS: dict[tuple[str, int], _Workers] = {}
_SIZE = 2


def _pool(kind: str, spin: int) -> _Workers:
    """One pool per bell and spin for the whole session: its threads outlive each example (a
    pool's threads are never stopped), and each example leaves it with nothing stuck."""
    key = (kind, spin)
    if key not in _POOLS:
        _POOLS[key] = _Workers(_SIZE, bell=BELLS[kind], spin_ns=spin)
    return _POOLS[key]


def _eventually(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 20
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.001)


class _Call:
    def __init__(self, key: int, job: _Job, bell: _BellLike | None, done: list[Any]) -> None:
        self.key = key
        self.job = job
        self.bell = bell  # the caller's (None: a started call, its outcome through `then`)
        self.done = done  # outcomes handed to `then`
        self.released = 0
        self.abandoned = False
        self.stuck = False  # abandoned while its tool ran (or was handed to a thread)
        self.bell_closed = False


class HandOff(RuleBasedStateMachine):
    """Sync calls (a caller's bell, the first wait wakes the thread), started calls (a
    callback), abandons before or after the first wait, completions and closed caller bells in
    any order, on a pool of two threads. Checked: a waited call's outcome, the stuck count, the
    pool bound (``submit`` says no once every thread is stuck), every call released exactly
    once, and no ring of a closed bell reaching the pipe that reuses its descriptors."""

    calls = Bundle("calls")

    def __init__(self, kind: str, spin: int) -> None:
        super().__init__()
        self.kind = kind
        self.pool = _pool(kind, spin)
        assert self.pool.stuck() == 0
        self.all: list[_Call] = []
        self.keys = 0

    def _new(self, bell: _BellLike | None) -> _Call | None:
        self.keys += 1
        key = self.keys
        _GATES[key] = _Gate()
        done: list[Any] = []
        holder: list[_Call] = []

        def release() -> None:
            holder[0].released += 1

        blocked = sum(1 for c in self.all if c.stuck and not _GATES[c.key].opened.is_set())
        # A stuck thread whose call may end (its gate opened) comes back on its own: wait for
        # it, so that whether ``submit`` refuses follows the model (``blocked``), not how soon
        # that thread ran.
        _eventually(
            lambda: self.pool.stuck() == blocked,
            "a stuck thread whose call may end never came back",
        )
        job = self.pool.submit(
            _TOOL, ((key,), {}), (1, _CONTEXT), release, None if bell else done.append, bell=bell
        )
        if job is None:
            assert blocked >= _SIZE  # refused only when every thread is stuck
            return None
        assert blocked < _SIZE  # every thread stuck in a call that cannot end: must refuse
        call = _Call(key, job, bell, done)
        holder.append(call)
        self.all.append(call)
        return call

    @rule(target=calls)
    def sync_call(self) -> _Call | None:
        """A sync call: submit, then the caller's first wait (which wakes the thread)."""
        call = self._new(BELLS[self.kind]())
        if call is not None:
            call.job.wait(0.0)
        return call

    @rule(target=calls)
    def sync_call_given_up_before_its_wait(self) -> _Call | None:
        """A sync call whose scope raised before its first wait: the abandon wakes the thread."""
        call = self._new(BELLS[self.kind]())
        if call is not None:
            self.abandon(call)
        return call

    @rule(target=calls)
    def started_call(self) -> _Call | None:
        return self._new(None)

    @rule(call=calls)
    def complete(self, call: _Call | None) -> None:
        if call is not None:
            _GATES[call.key].opened.set()

    @rule(call=consumes(calls))
    def wait_for(self, call: _Call | None) -> None:
        """Wait for a call once every call that could hold a thread ahead of it may end.

        No precondition: which calls the pool took or refused, and which were stuck when
        abandoned, follow the scheduler too; a rule chosen by them would draw differently when
        hypothesis replays the steps (FlakyStrategyDefinition beside busy loops)."""
        if call is None or call.abandoned:
            return
        for other in self.all:
            _GATES[other.key].opened.set()  # else its wait might be for a thread stuck forever
        if call.bell is not None and not call.bell_closed:
            _eventually(lambda: call.job.wait(0.05), "a sync call's wait never saw it over")
        else:
            _eventually(lambda: call.job.state == "over", "a call never finished")
        _eventually(lambda: call.released == 1, "a finished call was not released")
        assert call.job.outcome == Ok(json.dumps(call.key).encode())
        if call.bell is None:
            _eventually(lambda: call.done == [call.job.outcome], "then() was not called")

    @rule(call=calls)
    def abandon(self, call: _Call | None) -> None:
        """The caller gives up (its timeout, a cancel), maybe before its first wait ran."""
        if call is None or call.abandoned:
            return
        call.abandoned = True
        left_running = self.pool.abandon(call.job)
        call.stuck = left_running
        if not left_running:  # it was over, or still queued (then never run, released now)
            assert call.job.state == "over"
            _eventually(lambda: call.released == 1, "an abandoned call was not released")

    @rule(call=calls)
    def close_caller_bell(self, call: _Call | None) -> None:
        """The caller's instance is closed while its call may still run: a late ring of its
        bell must not reach the pipe that reuses its descriptors."""
        if call is None or call.bell is None or call.bell_closed:
            return
        call.bell_closed = True
        self.pool.close_bell(call.bell)
        reuse = os.pipe()
        for other in self.all:
            _GATES[other.key].opened.set()  # the calls ahead of it in the queue too
        _eventually(lambda: call.job.state == "over", "the call never finished")
        os.set_blocking(reuse[0], False)
        with pytest.raises(BlockingIOError):
            os.read(reuse[0], 1)
        for fd in reuse:
            os.close(fd)

    @invariant()
    def bounded(self) -> None:
        assert self.pool.threads() <= _SIZE
        assert 0 <= self.pool.stuck() <= _SIZE
        for call in self.all:
            assert call.released <= 1

    def teardown(self) -> None:
        for call in self.all:
            _GATES[call.key].opened.set()
        for call in self.all:
            if not call.abandoned and call.bell is not None and not call.bell_closed:
                _eventually(lambda call=call: call.job.wait(0.05), "a call never finished")
            _eventually(lambda call=call: call.job.state == "over", "a call never finished")
            _eventually(lambda call=call: call.released == 1, "a call was not released")
        _eventually(lambda: self.pool.stuck() == 0, "a stuck thread never came back")
        for call in self.all:
            if call.bell is not None:
                call.bell.close()
            del _GATES[call.key]


def _cases() -> Iterator[tuple[str, int]]:
    for kind in sorted(BELLS):
        for spin in SPINS[kind][:2]:
            yield kind, spin


@pytest.mark.parametrize(("kind", "spin"), list(_cases()))
def test_the_hand_off(kind: str, spin: int) -> None:
    run_state_machine_as_test(
        lambda: HandOff(kind, spin),
        settings=settings(
            max_examples=40,
            stateful_step_count=12,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


@pytest.mark.parametrize(
    ("text", "cpus", "micros"),
    [
        ("", {0, 1}, 100),
        ("", {0}, 0),  # one CPU to run on: spinning would only delay the thread waited for
        ("20", {0, 1}, 20),
        ("20", {0}, 20),  # said explicitly
        ("0", {0, 1}, 0),
        ("5000", {0, 1}, 1000),  # bounded
        ("-3", {0, 1}, 0),
        ("lots", {0, 1}, 100),  # not a number: the default
    ],
)
def test_the_spin_setting(
    monkeypatch: pytest.MonkeyPatch, text: str, cpus: set[int], micros: int
) -> None:
    monkeypatch.setenv("MIGHTY_TOOL_SPIN_US", text)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: cpus)
    monkeypatch.setattr(tools, "_Bell", _wake.Bell)
    assert tools._spin_default() == micros * 1000
    monkeypatch.setattr(tools, "_Bell", _PipeBell)
    assert tools._spin_default() == 0  # the pure bell cannot spin
