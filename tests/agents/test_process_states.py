"""An agent's life as a state machine: messages, crashes, hibernation, wakes, hot swaps and
stops in any order, against a model of its state and data (hypothesis)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mighty import Budget
from mighty.agents import (
    AgentChild,
    AgentCrashed,
    AgentState,
    AgentType,
    NoProc,
    Runtime,
    SupervisorSpec,
    start_tree,
)
from mighty.engine import Component
from mighty.reload import ReloadFailed
from tests.agents.conftest import _build_path

pytestmark = pytest.mark.slow

WAIT = 60.0
KEYS = st.sampled_from(["a", "b", "c"])


@pytest.fixture(scope="module")
def kvstore_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The key-value store example agent, as a file (a hot swap loads it again)."""
    return _build_path("kvstore", tmp_path_factory.mktemp("kvstate"))


class AgentLife(RuleBasedStateMachine):
    """One supervised kvstore agent; the model is its data and whether it sleeps or is gone."""

    path: Path
    state_root: Path

    def __init__(self) -> None:
        super().__init__()
        self.rt = Runtime(workers=2, state_dir=self.state_root / f"s{time.monotonic_ns()}")
        component = Component.load(self.path)
        self.rt.register(AgentType("kv", component, budget=Budget(timeout=60.0)))
        start_tree(
            self.rt, SupervisorSpec("root", [AgentChild("kv", "kv")], intensity=1000, period=1)
        )
        self.address = self.rt.whereis("kv")
        assert self.address is not None
        self.process = self.rt.process(self.address)  # the same one across restarts
        self.data: dict[str, int] = {}
        self.asleep = False
        self.gone = False
        self.seen: list[AgentState] = [self.state()]

    def state(self) -> AgentState:
        return self.process.state

    def settle(self, *allowed: AgentState) -> AgentState:
        """Wait until the agent's state is one of ``allowed`` (a restart takes a moment)."""
        deadline = time.monotonic() + WAIT
        while True:
            state = self.state()
            if state in allowed:
                self.seen.append(state)
                return state
            assert time.monotonic() < deadline, f"state {state}, expected one of {allowed}"
            time.sleep(0.005)

    def ask(self, name: str, body: Any = None) -> Any:
        return self.rt.ask("kv", name, body, timeout=WAIT)

    @precondition(lambda self: not self.gone)
    @rule(key=KEYS, value=st.integers(0, 100))
    def put(self, key: str, value: int) -> None:
        assert self.ask("put", {"key": key, "value": value}) == {"ok": True}
        self.data[key] = value
        self.asleep = False  # a message wakes it
        self.settle(AgentState.IDLE)

    @precondition(lambda self: not self.gone)
    @rule(key=KEYS)
    def get(self, key: str) -> None:
        assert self.ask("get", {"key": key}) == {"value": self.data.get(key)}
        self.asleep = False
        self.settle(AgentState.IDLE)

    @precondition(lambda self: not self.gone)
    @rule()
    def crash(self) -> None:
        with pytest.raises(AgentCrashed):
            self.ask("crash")
        self.data = {}  # not durable, and awake when it crashed: init runs again
        self.asleep = False
        self.settle(AgentState.IDLE)

    @precondition(lambda self: not self.gone and not self.asleep)
    @rule()
    def hibernate(self) -> None:
        assert self.rt.hibernate("kv", timeout=WAIT)
        self.asleep = True
        self.settle(AgentState.HIBERNATED)

    @precondition(lambda self: not self.gone)
    @rule()
    def swap(self) -> None:
        report = self.rt.reload("kv", self.path)
        assert self.address in report.agents
        # A sleeping agent stays asleep and wakes with the new component.
        self.settle(AgentState.HIBERNATED if self.asleep else AgentState.IDLE)

    @precondition(lambda self: not self.gone)
    @rule()
    def crash_during_swap(self) -> None:
        """A crash queued just before a hot swap lands before the swap or while the swap waits
        for the agent's turn: either way the agent ends on one working instance (the new one,
        or the old one after a rollback), its data lost to the crash, nothing else."""
        self.rt.send("kv", "crash")
        try:
            report = self.rt.reload("kv", self.path)
        except ReloadFailed:
            pass  # rolled back: the old version runs
        else:
            assert self.address in report.agents
        self.data = {}  # the crash: init runs again (asleep, it woke for the crash first)
        self.asleep = False
        assert self.ask("size") == {"size": 0}  # queued after the crash: answered after it
        self.settle(AgentState.IDLE)

    @precondition(lambda self: not self.gone and not self.asleep)
    @rule(key=KEYS, value=st.integers(0, 100))
    def wake_during_hibernate(self, key: str, value: int) -> None:
        """A message sent just as the agent is put to sleep: handled first (it then sleeps),
        or still queued (hibernate declines); never lost, and the agent answers after."""
        self.rt.send("kv", "put", {"key": key, "value": value})
        self.rt.hibernate("kv", timeout=WAIT)  # True or False: both are right here
        self.data[key] = value
        assert self.ask("get", {"key": key}) == {"value": value}
        self.asleep = False
        self.settle(AgentState.IDLE)

    @precondition(lambda self: not self.gone)
    @rule()
    def size(self) -> None:
        assert self.ask("size") == {"size": len(self.data)}
        self.asleep = False
        self.settle(AgentState.IDLE)

    @precondition(lambda self: not self.gone)
    @rule()
    def stop(self) -> None:
        self.rt.stop("kv")
        self.gone = True
        with pytest.raises(NoProc):
            self.ask("size")

    @precondition(lambda self: self.gone)
    @rule()
    def stays_stopped(self) -> None:
        assert self.state() is AgentState.STOPPED
        with pytest.raises(NoProc):
            self.ask("size")

    @invariant()
    def states_are_known(self) -> None:
        assert all(isinstance(state, AgentState) for state in self.seen)

    def teardown(self) -> None:
        self.rt.shutdown()


def test_agent_life(kvstore_path: Path, tmp_path: Path) -> None:
    """Any order of messages, crashes, hibernations, wakes, swaps (a crash during one too), a
    message racing a hibernation and a stop keeps the agent's data and state what the model
    says."""
    AgentLife.path = kvstore_path
    AgentLife.state_root = tmp_path
    run = AgentLife.TestCase
    run.settings = settings(
        max_examples=15,
        stateful_step_count=10,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    run().runTest()


def test_states_from_start_to_stop(kvstore_path: Path, tmp_path: Path) -> None:
    """starting -> idle -> running -> idle -> hibernated -> idle -> stopped, as inspect says."""
    with Runtime(workers=1, state_dir=tmp_path / "state") as rt:
        rt.register(AgentType("kv", Component.load(kvstore_path)))
        process = rt.spawn_process("kv", b"")
        assert process.state in (AgentState.IDLE, AgentState.SCHEDULED)
        assert rt.inspect(process.address)["state"] in ("idle", "scheduled")
        assert rt.hibernate(process.address, timeout=WAIT)
        assert process.state is AgentState.HIBERNATED
        rt.ask(process.address, "put", {"key": "a", "value": 1}, timeout=WAIT)
        # The reply is out before the worker's turn ends: scheduled until then, then idle.
        deadline = time.monotonic() + WAIT
        while (state := process.state) is not AgentState.IDLE:
            assert state is AgentState.SCHEDULED
            assert time.monotonic() < deadline
            time.sleep(0.005)
        rt.stop(process.address)
        assert process.state is AgentState.STOPPED


def test_swapping_is_a_swap_s_hold_not_any_pause(kvstore_path: Path, tmp_path: Path) -> None:
    """A hot swap waiting for the agent's turn shows it swapping until the swap ends; a
    paused mailbox alone (a migration's, a fence's) leaves it idle."""
    import threading

    with Runtime(workers=1) as rt:
        rt.register(AgentType("kv", Component.load(kvstore_path)))
        process = rt.spawn_process("kv", b"")
        rt.ask(process.address, "put", {"key": "a", "value": 1}, timeout=WAIT)
        process.mailbox.pause()
        assert process.state is AgentState.IDLE
        process.mailbox.resume()
        turn = process.turn_lock
        assert turn.acquire(timeout=WAIT)  # a message in progress: the swap waits for it
        reports: list[object] = []
        try:
            swap = threading.Thread(
                target=lambda: reports.append(rt.reload("kv", kvstore_path, drain_timeout=WAIT))
            )
            swap.start()
            deadline = time.monotonic() + WAIT
            while process.state is not AgentState.SWAPPING:
                assert time.monotonic() < deadline, process.state
                time.sleep(0.005)
            assert process.mailbox.paused
        finally:
            turn.release()
        swap.join(WAIT)
        assert len(reports) == 1
        assert process.state is AgentState.IDLE
        assert rt.ask(process.address, "get", {"key": "a"}, timeout=WAIT) == {"value": 1}


def _iter_states() -> Iterator[str]:
    yield from (state.value for state in AgentState)


def test_every_state_has_a_name_inspect_can_show() -> None:
    """The states are the issue's eight, each a plain string in JSON."""
    assert list(_iter_states()) == [
        "starting",
        "idle",
        "scheduled",
        "running",
        "hibernated",
        "swapping",
        "crashed",
        "stopped",
    ]
