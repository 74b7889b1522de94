"""Hibernation: idle CPython agents leave memory and wake on their next message, state intact.

The idle timer runs on a fake clock here (``Runtime(clock=...)``): the test decides when a
deadline passes and calls ``runtime.hibernation.tick()`` itself, from its own thread or from a
racing one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mighty import Component
from mighty.agents import (
    AgentChild,
    AgentProcess,
    AgentType,
    NoProc,
    Runtime,
    SnapshotCorrupt,
    SnapshotRefused,
    SupervisorSpec,
    decode_body,
    start_tree,
)
from mighty.agents._hibernate import Hibernator
from mighty.budget import Budget
from mighty.reload import ReloadRefused

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


class Clock:
    """A clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def counter(counter_wasm: Path) -> Component:
    return Component.load(counter_wasm)


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Counter v2 (adds a field), v3 (changes a type), v4 (restore traps), built once."""
    from mighty.build import build_component

    tmp = tmp_path_factory.mktemp("versions")
    out: dict[str, Path] = {}
    for name in ("v2", "v3", "v4"):
        path = tmp / f"{name}.wasm"
        build_component(
            ROOT / "guests" / "testing" / "counter" / f"{name}.py",
            output=path,
            wit=ROOT / "wit" / "agent",
            python_path=[ROOT / "guests" / "sdk"],
        )
        out[name] = path
    return out


def make_runtime(state_dir: Path, counter: Component, clock: Clock, **type_options: Any) -> Runtime:
    rt = Runtime(workers=2, state_dir=state_dir, clock=clock)
    rt.register(AgentType("counter", counter, hibernate_after=10.0, **type_options))
    return rt


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def rt(tmp_path: Path, counter: Component, clock: Clock) -> Iterator[Runtime]:
    with make_runtime(tmp_path / "state", counter, clock) as runtime:
        yield runtime


def test_an_idle_agent_hibernates_and_wakes_with_its_state(rt: Runtime, clock: Clock) -> None:
    address = rt.spawn("counter")
    assert rt.ask(address, "incr", {"by": 7})["count"] == 7
    assert rt.hibernation is not None
    clock.now = 9.0
    assert rt.hibernation.tick() == 0  # not idle long enough yet
    clock.now = 10.5
    assert rt.hibernation.tick() == 1
    process = rt.process(address)
    assert process.hibernated and process.instance is None
    assert rt.hibernation_stats()["hibernated"] == 1
    # Inspect answers for the sleeper without waking it (it is not a mailbox message).
    snapshot = rt.inspect(address)
    assert (snapshot["state"], snapshot["hibernations"], snapshot["wakes"]) == ("hibernated", 1, 0)
    assert snapshot["budget"]["memory_used"] == 0
    assert process.hibernated
    # The next message wakes it: a fresh instance restored from the store, then the message.
    assert rt.ask(address, "incr", {"by": 1})["count"] == 8
    assert not process.hibernated and process.instance is not None
    stats = rt.hibernation_stats()
    assert (stats["hibernations"], stats["wakes"], stats["hibernated"]) == (1, 1, 0)
    assert stats["wake_ms_p50"] is not None and stats["store_bytes"] > 0
    assert (process.stats.hibernations, process.stats.wakes) == (1, 1)
    kinds = [e.kind for e in rt.events if e.address == address]
    assert kinds.index("agent.hibernated") < kinds.index("agent.woke")


def _wakes_on(monkeypatch: pytest.MonkeyPatch, fail: int = 0, pause: float = 0.0) -> list[str]:
    """Record the thread of every wake tried; the first ``fail`` raise SnapshotCorrupt, and each
    first sleeps ``pause`` seconds."""
    threads: list[str] = []
    real = Hibernator._restore

    def restore(self: Hibernator, process: Any) -> Any:
        threads.append(threading.current_thread().name)
        if pause:
            time.sleep(pause)
        if len(threads) <= fail:
            raise SnapshotCorrupt(f"{process.address}: made to fail")
        return real(self, process)

    monkeypatch.setattr(Hibernator, "_restore", restore)
    return threads


def test_an_ask_wakes_a_hibernated_agent_on_the_asking_thread(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ask to a hibernated agent from a thread that may run its turn wakes it there and
    runs the message there too (no worker), as an ask to an awake idle agent does."""
    address = rt.spawn("counter")
    rt.ask(address, "incr", {"by": 2})
    assert rt.hibernate(address)
    threads = _wakes_on(monkeypatch)
    assert rt.ask(address, "incr", {"by": 1})["count"] == 3
    assert threads == [threading.current_thread().name]
    process = rt.process(address)
    assert not process.hibernated and process.stats.wakes == 1
    assert rt.hibernation_stats()["wakes"] == 1
    kinds = [e.kind for e in rt.events if e.address == address]
    assert kinds.count("agent.woke") == 1


def test_a_wake_that_fails_on_the_asking_thread_is_tried_and_reported_by_a_worker(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wake that fails on the asking thread is not reported there: the ask goes to the
    mailbox, a worker wakes the agent again, and that failure is reported once, as ever (the
    agent crashes; with no supervisor it is gone); a wake that fails only the first time
    leaves a worker to wake it and answer."""
    doomed, lucky = rt.spawn("counter"), rt.spawn("counter")
    rt.ask(lucky, "incr", {"by": 4})
    assert rt.hibernate(doomed) and rt.hibernate(lucky)
    threads = _wakes_on(monkeypatch, fail=2)
    with pytest.raises(NoProc, match="snapshot_corrupt"):
        rt.ask(doomed, "get", timeout=60)
    assert threads[0] == threading.current_thread().name
    assert len(threads) == 2 and threads[1].startswith("mighty-worker")
    assert rt.hibernation is not None
    assert rt.hibernation_stats()["wake_failures"] == 1
    assert [e.address for e in rt.events if e.kind == "wake.failed"] == [doomed]
    threads.clear()
    monkeypatch.undo()
    threads = _wakes_on(monkeypatch, fail=1)
    assert rt.ask(lucky, "get", timeout=60)["count"] == 4
    assert len(threads) == 2 and threads[1].startswith("mighty-worker")
    assert rt.hibernation_stats()["wake_failures"] == 1  # not reported: the worker's woke


def test_a_wake_that_leaves_too_little_time_hands_the_message_to_a_worker(
    tmp_path: Path, counter: Component, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Woken on the asking thread, an agent whose message might no longer end before the ask's
    deadline (its per-message budget is more than the time left) is not run there: a worker
    takes the message, and the asker gets the reply all the same."""
    budget = Budget(timeout=2.0)
    with make_runtime(tmp_path / "state", counter, clock, budget=budget) as runtime:
        address = runtime.spawn("counter")
        runtime.ask(address, "incr", {"by": 5})
        assert runtime.hibernate(address)
        threads = _wakes_on(monkeypatch, pause=0.6)  # of the 2.5 s, less than 2 s left
        handled: list[str] = []
        real = AgentProcess._run_turn

        def turn(self: AgentProcess, *args: Any) -> Any:
            handled.append(threading.current_thread().name)
            return real(self, *args)

        monkeypatch.setattr(AgentProcess, "_run_turn", turn)
        assert runtime.ask(address, "get", timeout=2.5)["count"] == 5
        assert threads == [threading.current_thread().name]  # woken here, once
        assert len(handled) == 1 and handled[0].startswith("mighty-worker")


def test_activity_postpones_the_idle_deadline(rt: Runtime, clock: Clock) -> None:
    address = rt.spawn("counter")
    assert rt.hibernation is not None
    clock.now = 8.0
    rt.ask(address, "incr")  # idle again from t=8: due at 18, not 10
    clock.now = 12.0
    assert rt.hibernation.tick() == 0
    assert not rt.process(address).hibernated
    clock.now = 18.0
    assert rt.hibernation.tick() == 1
    assert rt.hibernation.pending() == 0  # one entry per agent at most, none once asleep


def test_an_agent_seen_asleep_is_counted_asleep(rt: Runtime) -> None:
    """A status read while the hibernating agent's instance is still being closed (it takes
    milliseconds for a CPython agent; the reads take no lock) sees it asleep and counted, in
    the agent's counters and the runtime's: `mty run`'s control `status` once read
    hibernated=True with hibernations=0."""
    address = rt.spawn("counter")
    process = rt.process(address)
    instance = process.instance
    assert instance is not None
    seen: list[tuple[bool, int, int]] = []
    close = instance.close

    def observed_close() -> None:
        assert rt.hibernation is not None
        seen.append(
            (process.hibernated, process.stats.hibernations, rt.hibernation.stats.hibernations)
        )
        close()

    instance.close = observed_close  # type: ignore[method-assign]
    assert rt.hibernate(address)
    assert seen == [(True, 1, 1)]


def test_hibernate_by_hand_declines_while_busy(rt: Runtime) -> None:
    address = rt.spawn("counter")
    process = rt.process(address)
    with process._run:  # as if a turn were running
        assert not rt.hibernate(address, timeout=0)
        assert not rt.hibernate(address, timeout=0.01)
    assert rt.hibernate(address)
    assert not rt.hibernate(address)  # asleep already
    assert rt.ask(address, "get")["count"] == 0


def test_name_supervisor_link_and_mailbox_stay(rt: Runtime, clock: Clock) -> None:
    root = start_tree(rt, SupervisorSpec("root", [AgentChild("c", "counter")]))
    rt.ask("c", "incr", {"by": 2})
    address = rt.whereis("c")
    assert address is not None
    process = rt.process(address)
    assert rt.hibernate("c")
    assert rt.whereis("c") == address and process.hibernated
    assert [c.handle for c in root.which_children()] == [process]
    assert process.on_exit is not None
    rt.ask("c", "incr", {"by": 1})
    assert rt.hibernate("c")
    assert rt.ask("c", "get")["count"] == 3
    assert process.stats.restarts == 0


def test_a_steady_stream_with_a_racing_timer_loses_nothing(rt: Runtime, clock: Clock) -> None:
    """Asks and sends while another thread keeps hibernating whatever is idle: every message
    is handled once, in order."""
    address = rt.spawn("counter")
    assert rt.hibernation is not None
    hibernation = rt.hibernation
    # Asleep at the start, so the stream begins with a wake however the timer thread races.
    assert rt.hibernate(address)
    clock.now = 1e9  # every idle agent is past its deadline
    stop = threading.Event()

    def timer() -> None:
        while not stop.is_set():
            hibernation.tick()
            rt.hibernate(address)

    thread = threading.Thread(target=timer)
    thread.start()
    counts: list[int] = []
    futures: list[Future[bytes | None]] = []
    try:
        for i in range(150):
            if i % 3 == 0:
                rt.send(address, "incr", {"by": 1})
            elif i % 3 == 1:
                futures.append(rt.ask_future(address, "incr", {"by": 1}))
            else:
                counts.append(rt.ask(address, "incr", {"by": 1})["count"])
    finally:
        stop.set()
        thread.join()
    assert rt.drain()
    counts += [decode_body(f.result(5))["count"] for f in futures]
    assert rt.ask(address, "get")["count"] == 150
    assert len(set(counts)) == len(counts) == 100  # each handled once
    assert rt.hibernation_stats()["hibernations"] >= 1
    process = rt.process(address)
    assert process.stats.handled == 151 and process.stats.crashes == 0


class IdleTimerRace(RuleBasedStateMachine):
    """Messages, clock steps, timer ticks and hand hibernations in any order, including a
    message landing while the snapshot is being written and a tick racing a send."""

    component: Component
    base: Path
    runs = 0

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        IdleTimerRace.runs += 1
        self.runs = IdleTimerRace.runs
        self.rt = make_runtime(self.base / f"run{self.runs}", self.component, self.clock)
        self.address = self.rt.spawn("counter")
        self.sent = 0
        self.futures: list[tuple[int, Future[bytes | None]]] = []
        assert self.rt.hibernation is not None
        self.hibernation = self.rt.hibernation

    def _send(self, ask: bool) -> None:
        self.sent += 1
        if ask:
            self.futures.append((self.sent, self.rt.ask_future(self.address, "incr")))
        else:
            self.rt.send(self.address, "incr")

    @rule(ask=st.booleans())
    def message(self, ask: bool) -> None:
        self._send(ask)

    @rule(seconds=st.floats(0, 25, allow_nan=False))
    def advance(self, seconds: float) -> None:
        self.clock.now += seconds

    @rule()
    def tick(self) -> None:
        self.hibernation.tick()

    @rule()
    def by_hand(self) -> None:
        self.rt.hibernate(self.address)

    @rule(ask=st.booleans())
    def message_during_snapshot(self, ask: bool) -> None:
        """The message arrives while the hibernation writes its snapshot."""
        store = self.hibernation.store
        real_put = store.put

        def put(snapshot: Any, *, sync: bool = False) -> None:
            self._send(ask)
            real_put(snapshot, sync=sync)

        store.put = put  # type: ignore[method-assign]
        try:
            self.clock.now += 100
            self.hibernation.tick()
            self.rt.hibernate(self.address)
        finally:
            del store.put

    @rule(ask=st.booleans())
    def tick_racing_a_send(self, ask: bool) -> None:
        self.clock.now += 100
        thread = threading.Thread(target=self.hibernation.tick)
        thread.start()
        self._send(ask)
        thread.join()

    @precondition(lambda self: self.sent > 0)
    @rule()
    def settle(self) -> None:
        assert self.rt.drain(10)
        got = self.rt.ask(self.address, "get")["count"]
        assert got == self.sent
        for index, future in self.futures:
            # The reply to the n-th increment says n: handled once, in sending order.
            assert decode_body(future.result(5))["count"] == index
        self.futures.clear()

    @invariant()
    def never_crashed(self) -> None:
        process = self.rt.process(self.address)
        assert process.stats.crashes == 0 and process.alive

    def teardown(self) -> None:
        try:
            assert self.rt.drain(10)
            assert self.rt.ask(self.address, "get")["count"] == self.sent
            for index, future in self.futures:
                assert decode_body(future.result(5))["count"] == index
        finally:
            self.rt.shutdown()


def test_the_idle_timer_race(counter: Component, tmp_path: Path) -> None:
    IdleTimerRace.component = counter
    IdleTimerRace.base = tmp_path
    run = IdleTimerRace.TestCase
    run.settings = settings(
        max_examples=15,
        stateful_step_count=15,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    IdleTimerRace.runs = 0
    run().runTest()
    assert IdleTimerRace.runs >= 10  # the machine really ran that many examples


# -- hot swap across hibernated agents -----------------------------------------------------


def test_reload_swaps_hibernated_agents_too(rt: Runtime, versions: dict[str, Path]) -> None:
    asleep = [rt.spawn("counter") for _ in range(2)]
    awake = rt.spawn("counter")
    for i, address in enumerate([*asleep, awake]):
        rt.ask(address, "incr", {"by": 10 + i})
    for address in asleep:
        assert rt.hibernate(address)
    report = rt.reload("counter", versions["v2"])
    assert sorted(report.agents) == sorted([*asleep, awake])
    # Still asleep; they wake with the new component and their stored state.
    assert all(rt.process(a).hibernated for a in asleep)
    for i, address in enumerate([*asleep, awake]):
        assert rt.ask(address, "get") == {"count": 10 + i, "increments": 0, "version": 2}


def test_reload_is_refused_for_all_when_a_stored_schema_does_not_fit(
    rt: Runtime, versions: dict[str, Path]
) -> None:
    """A hibernated agent whose snapshot was taken under a schema the new version refuses
    (here: v3's, whose count is a str) makes the whole swap refused; nothing changes."""
    import sqlite3

    asleep, awake = rt.spawn("counter"), rt.spawn("counter")
    rt.ask(asleep, "incr", {"by": 4})
    assert rt.hibernate(asleep)
    assert rt.hibernation is not None
    probe = rt.hibernation  # the schema v3 declares, stored as if v3 had written the row
    from mighty.instance import Instance

    v3 = Instance(Component.load(versions["v3"]), gate=rt.gate)
    text = str(v3.call("state-schema"))
    v3.close()
    from mighty.reload import parse_schema

    v3_hash = parse_schema(text).hash
    probe.store.put_schema(v3_hash, text)
    with sqlite3.connect(probe.store.path) as db:
        db.execute("UPDATE snapshots SET schema = ? WHERE address = ?", (v3_hash, asleep))
    with pytest.raises(ReloadRefused, match="hibernated"):
        rt.reload("counter", versions["v2"])
    assert rt.ask(awake, "get")["version"] == 1
    assert rt.process(asleep).hibernated


def test_a_restore_that_fails_keeps_the_stored_snapshot(
    rt: Runtime, versions: dict[str, Path]
) -> None:
    """v4 has a compatible schema but its restore traps: the swap is confirmed for the asleep
    agent, its wake fails with a typed error, the row is kept byte for byte."""
    address = rt.spawn("counter")
    other = rt.spawn("counter")
    rt.ask(address, "incr", {"by": 3})
    assert rt.hibernate(address) and rt.hibernate(other)
    assert rt.hibernation is not None
    before = rt.hibernation.store.get(address)
    rt.reload("counter", versions["v4"])
    with pytest.raises(NoProc, match="snapshot_refused"):
        rt.ask(address, "get", timeout=60)  # the trap is a deep recursion: slow on a busy CPU
    assert rt.hibernation.store.get(address) == before
    assert rt.hibernation_stats()["wake_failures"] == 1
    # The runtime is fine: the other one (count 0, which v4 restores) still answers.
    assert rt.ask(other, "get")["version"] == 4
    failed = [e for e in rt.events if e.kind == "wake.failed"]
    assert failed and "snapshot_refused" in failed[0].data["reason"]
    assert issubclass(SnapshotRefused, Exception)
