"""The scheduler keeps light work on one worker and heavy work on all (mighty.agents._scheduler).

Runnables here are plain Python objects (the scheduler's protocol), so each test controls what a
batch does and when it ends. Waits are bounded by generous timeouts; nothing asserts a speed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from pydantic import BaseModel, field_validator

from mighty import Component
from mighty.agents import AgentType, Runtime
from mighty.agents._scheduler import PATIENCE, Scheduler

ROOT = Path(__file__).resolve().parents[2]

WAIT = 30.0


class Job:
    """A runnable with ``batches`` turns; each turn calls ``step`` (if any) and logs itself."""

    def __init__(
        self,
        name: str,
        log: list[tuple[str, int, str]],
        *,
        light: bool | None = None,
        batches: int = 1,
        step: Callable[[Job], None] | None = None,
        fresh: bool = True,
    ) -> None:
        self.name = name
        self.log = log
        if light is not None:
            self.light = light
        self.left = batches
        self.turn = 0
        self.step = step
        self.fresh = fresh
        self.running = 0
        self.overlapped = False
        self.done = threading.Event()

    @property
    def started(self) -> float:
        # A message that began just now (moving on), or long ago (stuck).
        return time.monotonic() if self.fresh else 0.0

    def run_batch(self) -> tuple[int, bool]:
        self.running += 1
        if self.running > 1:
            self.overlapped = True
        try:
            if self.step is not None:
                self.step(self)
            self.log.append((self.name, self.turn, threading.current_thread().name))
            self.turn += 1
            self.left -= 1
            return 1, self.left > 0
        finally:
            self.running -= 1
            if self.left <= 0:
                self.done.set()


def _holding(gate: threading.Event, entered: threading.Event) -> Callable[[Job], None]:
    def step(job: Job) -> None:
        entered.set()
        assert gate.wait(WAIT)

    return step


def test_light_work_waits_for_the_worker_running_light_work() -> None:
    """While a light agent's message moves on, a backlog of light agents is not started on
    the idle worker: the running one takes them after, oldest first, across both queues."""
    log: list[tuple[str, int, str]] = []
    gate, entered = threading.Event(), threading.Event()
    scheduler = Scheduler(2)
    try:
        first = Job("first", log, light=True, step=_holding(gate, entered))
        scheduler.schedule(first)
        assert entered.wait(WAIT)
        others = [Job(f"j{i}", log, light=True) for i in range(10)]
        with scheduler._lock:  # queued all at once: a backlog before any worker looks
            for job in others:
                scheduler.schedule(job)
        # Three patience periods: a watcher looked and held back each time.
        time.sleep(PATIENCE * 3)
        assert [name for name, _, _ in log] == []
        gate.set()
        for job in others:
            assert job.done.wait(WAIT)
        assert [name for name, _, _ in log] == ["first"] + [f"j{i}" for i in range(10)]
        assert len({thread for _, _, thread in log}) == 1
        assert sum(s.messages for s in scheduler.stats()) == 11
    finally:
        gate.set()
        scheduler.stop()


def test_a_stuck_light_message_lets_the_idle_worker_in() -> None:
    """A light message that has gone on for PATIENCE (a sleep, a long host call) no longer
    holds the queue back: the idle worker runs the queued agent meanwhile."""
    log: list[tuple[str, int, str]] = []
    gate, entered = threading.Event(), threading.Event()
    scheduler = Scheduler(2)
    try:
        stuck = Job("stuck", log, light=True, step=_holding(gate, entered), fresh=False)
        scheduler.schedule(stuck)
        assert entered.wait(WAIT)
        queued = Job("queued", log, light=True)
        scheduler.schedule(queued)
        assert queued.done.wait(WAIT)  # while ``stuck`` still holds its worker
        assert not stuck.done.is_set()
        gate.set()
        assert stuck.done.wait(WAIT)
        threads = {name: thread for name, _, thread in log}
        assert threads["queued"] != threads["stuck"]
    finally:
        gate.set()
        scheduler.stop()


def test_heavy_work_runs_on_both_workers_at_once() -> None:
    """Two heavy agents (or runnables that do not say) run at the same time: each waits for
    the other inside its turn, which only returns when both run in parallel."""
    for light in (False, None):
        log: list[tuple[str, int, str]] = []
        barrier = threading.Barrier(2, timeout=WAIT)
        scheduler = Scheduler(2)

        def meet(_: Job, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()

        try:
            jobs = [Job(f"h{i}", log, light=light, step=meet) for i in (0, 1)]
            for job in jobs:
                scheduler.schedule(job)
            for job in jobs:
                assert job.done.wait(WAIT)
            assert not barrier.broken
        finally:
            scheduler.stop()


def test_a_light_agent_queued_alone_starts_at_once() -> None:
    """No backlog: a light agent made runnable while a light message moves on starts on the
    idle worker at once (an ask through a worker does not wait for the other's turn)."""
    log: list[tuple[str, int, str]] = []
    gate, entered = threading.Event(), threading.Event()
    scheduler = Scheduler(2)
    try:
        scheduler.schedule(Job("first", log, light=True, step=_holding(gate, entered)))
        assert entered.wait(WAIT)
        alone = Job("alone", log, light=True)
        scheduler.schedule(alone)
        assert alone.done.wait(WAIT)  # while ``first`` still holds its worker
    finally:
        gate.set()
        scheduler.stop()


def test_a_heavy_agent_is_not_held_back_by_light_work() -> None:
    """A heavy agent made runnable while a light message runs starts on the idle worker."""
    log: list[tuple[str, int, str]] = []
    gate, entered = threading.Event(), threading.Event()
    scheduler = Scheduler(2)
    try:
        scheduler.schedule(Job("light", log, light=True, step=_holding(gate, entered)))
        assert entered.wait(WAIT)
        heavy = Job("heavy", log, light=False)
        scheduler.schedule(heavy)
        assert heavy.done.wait(WAIT)
    finally:
        gate.set()
        scheduler.stop()


def test_a_worker_waiting_in_an_ask_lets_light_work_run() -> None:
    """A worker inside ``blocking`` (its agent waits for a reply) is not running work: the
    queued light agent (the one it may be waiting for) runs on the other worker."""
    log: list[tuple[str, int, str]] = []
    scheduler = Scheduler(2)
    answered = threading.Event()
    queued = Job("asked", log, light=True, step=lambda _: answered.set())

    def ask(job: Job) -> None:
        with scheduler.blocking():
            scheduler.schedule(queued)
            assert answered.wait(WAIT)

    try:
        asker = Job("asker", log, light=True, step=ask)
        scheduler.schedule(asker)
        assert asker.done.wait(WAIT)
        assert queued.done.is_set()
    finally:
        scheduler.stop()


@settings(max_examples=25)
@given(
    st.lists(
        st.tuples(st.sampled_from([True, False, None]), st.integers(1, 6)),
        min_size=1,
        max_size=24,
    ),
    st.integers(1, 3),
)
def test_every_turn_runs_once_in_order_and_never_twice_at_once(
    jobs: list[tuple[bool | None, int]], workers: int
) -> None:
    """Any mix of light, heavy and silent agents with several turns each: every turn of every
    agent runs exactly once, an agent's turns in order, never two turns of one agent at once."""
    log: list[tuple[str, int, str]] = []
    scheduler = Scheduler(workers)
    try:
        made = [Job(f"a{i}", log, light=light, batches=n) for i, (light, n) in enumerate(jobs)]
        for job in made:
            scheduler.schedule(job)
        for job in made:
            assert job.done.wait(WAIT)
        for job, (_, batches) in zip(made, jobs, strict=True):
            assert [turn for name, turn, _ in log if name == job.name] == list(range(batches))
            assert not job.overlapped
        assert sum(s.messages for s in scheduler.stats()) == sum(n for _, n in jobs)
    finally:
        scheduler.stop()


def test_a_heavy_agent_queued_behind_light_ones_runs_on_the_idle_worker() -> None:
    """Light agents held back in the queues do not keep a heavy one behind them from the
    idle worker."""
    log: list[tuple[str, int, str]] = []
    gate, entered = threading.Event(), threading.Event()
    scheduler = Scheduler(2)
    try:
        scheduler.schedule(Job("light", log, light=True, step=_holding(gate, entered)))
        assert entered.wait(WAIT)
        held = [Job(f"l{i}", log, light=True) for i in range(5)]  # in both queues
        with scheduler._lock:  # a backlog before any worker looks
            for job in held:
                scheduler.schedule(job)
        heavy = Job("heavy", log, light=False)
        scheduler.schedule(heavy)
        assert heavy.done.wait(WAIT)  # while the light message still runs
        assert not any(job.done.is_set() for job in held)
        gate.set()
        for job in held:
            assert job.done.wait(WAIT)
        assert sorted(name for name, _, _ in log) == sorted(
            ["light", "heavy"] + [job.name for job in held]
        )
    finally:
        gate.set()
        scheduler.stop()


class SchedulerMachine(RuleBasedStateMachine):
    """Agents of every kind made runnable while others hold their workers (a message that
    moves on, or one stuck), released in any order: at every step no agent runs two turns at
    once and each agent's turns so far ran in order; at the end every turn ran exactly once."""

    @initialize(workers=st.integers(1, 3))
    def start(self, workers: int) -> None:
        self.scheduler = Scheduler(workers)
        self.log: list[tuple[str, int, str]] = []
        self.jobs: list[tuple[Job, int]] = []
        self.gates: list[threading.Event] = []

    @rule(light=st.sampled_from([True, False, None]), batches=st.integers(1, 4))
    def add(self, light: bool | None, batches: int) -> None:
        job = Job(f"a{len(self.jobs)}", self.log, light=light, batches=batches)
        self.jobs.append((job, batches))
        self.scheduler.schedule(job)

    @rule(light=st.sampled_from([True, False, None]), fresh=st.booleans())
    def add_holding(self, light: bool | None, fresh: bool) -> None:
        gate = threading.Event()
        self.gates.append(gate)
        job = Job(
            f"h{len(self.jobs)}",
            self.log,
            light=light,
            step=lambda _: gate.wait(WAIT) and None,
            fresh=fresh,
        )
        self.jobs.append((job, 1))
        self.scheduler.schedule(job)

    @rule(which=st.integers(0, 7))
    def release(self, which: int) -> None:
        held = [gate for gate in self.gates if not gate.is_set()]
        if held:
            held[which % len(held)].set()

    @invariant()
    def turns_in_order_never_at_once(self) -> None:
        for job, _ in self.jobs:
            assert not job.overlapped
            turns = [turn for name, turn, _ in list(self.log) if name == job.name]
            assert turns == list(range(len(turns)))

    def teardown(self) -> None:
        if not hasattr(self, "scheduler"):
            return
        try:
            for gate in self.gates:
                gate.set()
            for job, batches in self.jobs:
                assert job.done.wait(WAIT)
                assert [turn for name, turn, _ in self.log if name == job.name] == list(
                    range(batches)
                )
            total = sum(batches for _, batches in self.jobs)
            assert sum(s.messages for s in self.scheduler.stats()) == total
        finally:
            self.scheduler.stop()


TestSchedulerMachine = SchedulerMachine.TestCase
TestSchedulerMachine.settings = settings(max_examples=40, stateful_step_count=12)


# A loop at the top of the echo agent's handle: 30,000 rounds, about 210,000 fuel.
_SPIN = """
    (func $spin (local $i i32)
      (loop $l
        local.get $i i32.const 1 i32.add local.tee $i
        i32.const 30000 i32.lt_u br_if $l))"""


def test_the_runtime_tells_light_agents_from_heavy_ones(
    echo_agent: Component, wat: Callable[[str], bytes]
) -> None:
    """An agent's lightness is measured by the fuel of its messages: the echo agent (about 160
    fuel a message) is light, the same agent spinning first (210,000) is not; and 400 sends to
    20 light agents on two workers are all handled."""
    text = (ROOT / "tests" / "fixtures" / "echo_agent.wat").read_text()
    spin = Component.load(
        wat(
            text.replace(
                '(func (export "reset0")', _SPIN + '\n    (func (export "reset0")'
            ).replace(
                "(local $r i32) (local $name i32)\n",
                "(local $r i32) (local $name i32)\n      call $spin\n",
            )
        )
    )
    with Runtime(workers=2) as rt:
        rt.register(AgentType("echo", echo_agent))
        rt.register(AgentType("spin", spin))
        light, heavy = rt.spawn("echo"), rt.spawn("spin")
        assert not rt.process(light).light  # nothing measured yet: heavy, woken at once
        for i in range(20):  # a turn preempted for 0.5 ms on a loaded machine looks waiting
            assert rt.ask(light, "x", i) == i
            if rt.process(light).light:
                break
        assert rt.process(light).light
        assert rt.ask(heavy, "x", 2) == 2
        assert not rt.process(heavy).light
        agents = [rt.spawn("echo") for _ in range(20)]
        for i in range(400):
            rt.send(agents[i % 20], "x", i)
        assert rt.drain(WAIT)
        assert [rt.process(a).stats.handled for a in agents] == [20] * 20


class Slow(BaseModel):
    """A body whose validation waits (as a message waiting on I/O would, with little fuel)."""

    n: int

    @field_validator("n")
    @classmethod
    def wait(cls, n: int) -> int:
        time.sleep(0.005)
        return n


def test_an_agent_whose_messages_wait_is_not_light(echo_agent: Component) -> None:
    """Little fuel but a long wall time (the message waited): not light, so the scheduler
    lets a second worker take such agents at once."""
    with Runtime(workers=2) as rt:
        rt.register(AgentType("slow", echo_agent, accepts={"x": Slow}))
        address = rt.spawn("slow")
        assert rt.ask(address, "x", {"n": 1}) == {"n": 1}
        assert rt.process(address).stats.fuel < 100_000
        assert not rt.process(address).light
