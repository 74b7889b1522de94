"""An ask takes the shortest path: the asking thread runs an idle agent's turn itself.

Only when the agent's per-message budget ends before the ask's timeout would, the agent is
idle (awake, nothing queued, not scheduled) and a worker is free (or the asker is a worker in
a turn). Everything else (crashes, supervision, order, the circuit breaker, introspection)
behaves as through a worker.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mighty import Component
from mighty.agents import (
    AgentChild,
    AgentCrashed,
    AgentEvent,
    AgentType,
    HandlerFailed,
    NoProc,
    Runtime,
    SupervisorSpec,
    start_tree,
)
from mighty.agents import _host as host_module
from mighty.agents._host import _HERE_GRACE, _guest_ask_wait
from mighty.budget import Budget, CallScope

ROOT = Path(__file__).resolve().parents[2]
SHORT = Budget(timeout=1.0)
"""A per-message budget that ends before a 5 s ask would: asks may run in place."""

_HANDLE = (
    '(func (export "handle") (param i32 i32 i32 i32 i32 i32) (result i32)'
    " (local $r i32) (local $name i32)"
)
# A message named "ping" (4 bytes, 'p' first) traps.
_TRAP_ON_PING = """
      (if (i32.and (i32.eq (local.get 3) (i32.const 4))
                   (i32.eq (i32.load8_u (local.get 2)) (i32.const 0x70)))
        (then unreachable))"""


@pytest.fixture(scope="module")
def ping_crasher(wat: Callable[[str], bytes]) -> Component:
    """The echo agent, trapping on a message named "ping" (what the ping-pong agent asks)."""
    text = (ROOT / "tests" / "fixtures" / "echo_agent.wat").read_text()
    assert text.count(_HANDLE) == 1
    return Component.load(wat(text.replace(_HANDLE, _HANDLE + _TRAP_ON_PING)))


def _runtime(workers: int) -> tuple[Runtime, list[int]]:
    """A runtime, and the threads on which its agent.crashed events were emitted, in order."""
    threads: list[int] = []

    def hear(event: AgentEvent) -> None:
        if event.kind == "agent.crashed":
            threads.append(threading.get_ident())

    return Runtime(workers=workers, on_event=hear), threads


def test_an_ask_to_an_idle_agent_runs_on_the_asking_thread(crasher_agent: Component) -> None:
    rt, threads = _runtime(2)
    with rt:
        rt.register(AgentType("c", crasher_agent, budget=SHORT))
        start_tree(rt, SupervisorSpec("root", [AgentChild("c", "c")]))
        address = rt.process("c").address
        assert rt.ask(address, "x", {"n": 1}) == {"n": 1}
        with pytest.raises(AgentCrashed):
            rt.ask(address, "crash", 1)
        # The crash happened here, and was reported to the supervisor from here: it revived
        # the agent before the ask returned, with the same address.
        assert threads == [threading.get_ident()]
        assert rt.ask(address, "x", 2) == 2
        process = rt.process(address)
        assert process.stats.crashes == 1
        assert process.stats.restarts == 1
        assert process.stats.handled == 2
        assert rt.drain(10)


def test_an_ask_whose_budget_outlasts_its_timeout_goes_through_a_worker(
    crasher_agent: Component,
) -> None:
    rt, threads = _runtime(2)
    with rt:
        rt.register(AgentType("c", crasher_agent))  # default budget: 10 s > the ask's 5 s
        address = rt.spawn("c")
        with pytest.raises(AgentCrashed):
            rt.ask(address, "crash", 1, timeout=5)
        assert len(threads) == 1
        assert threads[0] != threading.get_ident()
        # Unsupervised: it is dead, and says so.
        with pytest.raises(NoProc):
            rt.ask(address, "x", 1)


def test_an_ask_behind_queued_messages_waits_its_turn_on_a_worker(
    crasher_agent: Component,
) -> None:
    """Order is kept: an agent with messages queued is not idle, so the ask is not run in place
    ahead of them (nor by the asker behind them)."""
    rt, threads = _runtime(1)
    with rt:
        rt.register(AgentType("c", crasher_agent, budget=SHORT))
        address = rt.spawn("c")
        process = rt.process(address)
        replies: list[object] = []
        with process._run:  # the agent is busy: what is sent now queues up
            for n in range(20):
                rt.send(address, "x", n)
            asker = threading.Thread(
                target=lambda: replies.append(rt.ask(address, "x", "mine", timeout=30))
            )
            asker.start()
            while len(process.mailbox) < 21:  # the asker's message is queued behind the 20
                time.sleep(0.001)
            future = rt.ask_future(address, "crash", 1)
        with pytest.raises(AgentCrashed):
            future.result(30)
        asker.join(30)
        assert replies == ["mine"]
        assert process.stats.handled == 21
        assert threads and threads[0] not in (threading.get_ident(), asker.ident)


def test_guest_asks_run_in_place_between_cpython_agents(pingpong: Component) -> None:
    with Runtime(workers=2) as rt:
        rt.register(AgentType("pp", pingpong, budget=Budget(timeout=4.0)))
        rt.spawn("pp", name="a")
        rt.spawn("pp", name="b")
        assert rt.ask("a", "start", {"peer": "b", "rounds": 40}, timeout=30) == {
            "rounds": 40,
            "pongs": 40,
        }
        b = rt.process("b")
        assert b.stats.handled == 40
        # The host's ask ran a's turn on this thread, and a's asks ran b's turns in it: no
        # worker has handled anything.
        assert sum(w.messages for w in rt.worker_stats()) == 0
        assert rt.drain(10)


def test_a_crash_in_a_nested_turn_is_reported_by_a_worker(
    pingpong: Component, ping_crasher: Component
) -> None:
    """The asker holds its own run lock: the crashed agent's supervisor hears of it from a
    worker, which holds none (it may stop or revive any agent, the asker's included)."""
    rt, threads = _runtime(2)
    with rt:
        rt.register(AgentType("pp", pingpong, budget=Budget(timeout=4.0)))
        rt.register(AgentType("c", ping_crasher, budget=SHORT))
        start_tree(rt, SupervisorSpec("root", [AgentChild("c", "c")]))
        crasher = rt.process("c").address
        rt.spawn("pp", name="a")
        with pytest.raises(HandlerFailed, match="crashed"):
            rt.ask("a", "start", {"peer": crasher, "rounds": 1}, timeout=30)
        assert threads == [threading.get_ident()]  # it crashed here, in a's turn
        assert rt.drain(10)  # drain waited for the supervisor's decision
        process = rt.process(crasher)
        assert process.stats.crashes == 1
        assert process.stats.restarts == 1
        assert rt.ask(crasher, "x", 3) == 3


def _pingpong_on_workers(
    pingpong: Component, a: Budget, b: Budget, start: dict[str, object]
) -> int:
    """Messages the workers handled while a (budget ``a``) pinged b (budget ``b``)."""
    with Runtime(workers=2) as rt:
        rt.register(AgentType("pa", pingpong, budget=a))
        rt.register(AgentType("pb", pingpong, budget=b))
        rt.spawn("pa", name="a")
        rt.spawn("pb", name="b")
        assert rt.ask("a", "start", {"peer": "b", "rounds": 5, **start}, timeout=30) == {
            "rounds": 5,
            "pongs": 5,
        }
        assert rt.process("b").stats.handled == 5
        assert rt.drain(10)
        return sum(w.messages for w in rt.worker_stats())


def test_a_guest_ask_without_a_timeout_runs_in_place_with_equal_budgets(
    pingpong: Component,
) -> None:
    """The SDK's ask waits as long as the asker's own deadline allows: the target's equal
    budget ends within the grace after that deadline, so its turn runs on the asking thread."""
    assert _pingpong_on_workers(pingpong, Budget(), Budget(), {}) == 0


def test_a_guest_ask_in_place_holds_the_asker_at_most_a_grace_past_its_deadline(
    pingpong: Component,
) -> None:
    # b's budget ends within half a second of a's deadline: in place; two seconds: by workers.
    assert _pingpong_on_workers(pingpong, Budget(timeout=1.0), Budget(timeout=1.3), {}) == 0
    assert _pingpong_on_workers(pingpong, Budget(timeout=1.0), Budget(timeout=2.0), {}) == 5


def test_a_guest_ask_with_a_shorter_timeout_than_the_target_budget_goes_by_a_worker(
    pingpong: Component,
) -> None:
    """An explicit timeout is the asker's own: its turn could outlast it in place."""
    assert _pingpong_on_workers(pingpong, Budget(), Budget(), {"timeout": 5}) == 5
    assert _pingpong_on_workers(pingpong, Budget(), Budget(timeout=4.0), {"timeout": 5}) == 0


class _StillClock:
    """The ``time`` module as ``mighty.agents._runtime`` sees it, its monotonic clock held at
    ``now``: the test, not the scheduler, decides how much of the budget is left."""

    def __init__(self, now: float) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)


@pytest.mark.timing
@given(
    budget=st.floats(0.01, 100),
    spent=st.floats(0, 1.2),
    requested=st.one_of(st.floats(0, 200), st.just(float(0xFFFFFFFF) / 1000)),
)
def test_a_guest_ask_waits_no_longer_than_its_own_deadline(
    budget: float, spent: float, requested: float
) -> None:
    """A guest's ask waits for its own shorter timeout, or until its deadline plus grace."""
    # The clock stands still while _guest_ask_wait reads it: with a running clock, a preemption
    # between the test's reading and the function's (1 ms and more on a loaded machine) moved
    # `left` under the test's feet and failed the exact comparisons.
    clock = _StillClock(time.monotonic())
    scope = CallScope(budget, None)
    scope.deadline = clock.now + budget - spent * budget  # part (or more than all) is spent
    left = max(0.0, scope.deadline - clock.now)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(host_module, "time", clock)
        wait, within = _guest_ask_wait(scope, requested)
    assert wait <= requested
    assert wait <= left
    if requested < left:
        assert wait == within == requested  # the asker's own shorter timeout, exactly
    else:
        assert wait == left  # cut to its deadline
        assert within == left + _HERE_GRACE  # plus grace for a turn run in place
    assert within <= max(requested, left + _HERE_GRACE)


# A message named "ping" never ends (its budget's deadline stops it).
_SPIN_ON_PING = """
      (if (i32.and (i32.eq (local.get 3) (i32.const 4))
                   (i32.eq (i32.load8_u (local.get 2)) (i32.const 0x70)))
        (then (loop $forever (br $forever))))"""


@pytest.fixture(scope="module")
def ping_spinner(wat: Callable[[str], bytes]) -> Component:
    text = (ROOT / "tests" / "fixtures" / "echo_agent.wat").read_text()
    return Component.load(wat(text.replace(_HANDLE, _HANDLE + _SPIN_ON_PING)))


@pytest.mark.timing
def test_a_guest_ask_waits_until_its_own_deadline_or_its_own_timeout(
    pingpong: Component, ping_spinner: Component
) -> None:
    """Asked without a timeout, the asker stops at its own deadline (a crash, as a deadline
    always was); with a shorter timeout it hears ``Timeout`` and goes on. Either way the
    target's turn (by a worker: its budget outlasts the wait) ends by the asker's deadline,
    not its own budget: the ask carries it (docs/cancellation.md)."""
    events: list[AgentEvent] = []

    def stopped(address: str) -> str:
        deadline = time.monotonic() + 30
        while True:
            found = [e for e in events if e.kind == "agent.crashed" and e.address == address]
            if found:
                return str(found[0].data["reason"])
            assert time.monotonic() < deadline, "the spinning target was never stopped"
            time.sleep(0.01)

    with Runtime(workers=2, on_event=events.append) as rt:
        rt.register(AgentType("pa", pingpong, budget=Budget(timeout=0.5)))
        rt.register(AgentType("pb", ping_spinner, budget=Budget(timeout=600.0)))
        rt.register(AgentType("pc", pingpong, budget=Budget(timeout=10.0)))
        spinner = rt.spawn("pb")
        rt.spawn("pa", name="a")
        with pytest.raises(AgentCrashed, match="deadline"):
            rt.ask("a", "start", {"peer": spinner, "rounds": 1}, timeout=30)
        assert "cancel" in stopped(spinner)  # with its asker, long before its own 600 s
        rt.spawn("pc", name="c")
        second = rt.spawn("pb")
        with pytest.raises(HandlerFailed, match="Timeout"):
            rt.ask("c", "start", {"peer": second, "rounds": 1, "timeout": 0.1}, timeout=30)
        assert rt.process("c").stats.crashes == 0  # it heard the timeout and went on
        assert "cancel" in stopped(second)
        # Both pings reached a spinner by a worker (none ran on this thread). A worker
        # counts a batch's messages after the batch returns, which is after the crash event
        # the loop above saw: wait for the count as well (in place, it would stay 0).
        deadline = time.monotonic() + 30
        while sum(w.messages for w in rt.worker_stats()) < 1:
            assert time.monotonic() < deadline, "no worker handled the spinner's messages"
            time.sleep(0.01)
