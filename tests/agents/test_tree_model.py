"""A model of supervision trees of real agents, checked step by step against the runtime.

Random trees (nested supervisors, strategies, restart types, intensities) of WAT agents that
trap on "crash"; random asks, crashing or not, alone or queued behind a crash. After each
step the runtime drains, and every ask must have settled the way the model says: a reply, the
crash, or NoProc because its agent is gone. One worker and a restart period far longer than
the test make each step's outcome a function of the steps before it.
"""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, ClassVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from mighty import Component
from mighty.agents import (
    AgentChild,
    AgentCrashed,
    AgentType,
    NoProc,
    Runtime,
    SupervisorSpec,
    decode_body,
    start_tree,
)
from mighty.agents._supervisor import RestartType, Strategy

PERIOD = 3600.0  # no restart ever leaves the intensity window during a test


@dataclass(eq=False)
class MAgent:
    """The model of one agent child."""

    name: str
    restart: RestartType
    parent: MSup | None = None
    up: bool = False
    incarnation: int = 0
    """Bumped when the agent is replaced by a fresh one (its old mailbox is gone)."""


@dataclass(eq=False)
class MSup:
    """The model of one supervisor."""

    name: str
    strategy: Strategy
    intensity: int
    restart: RestartType
    children: list[MAgent | MSup] = field(default_factory=list)
    parent: MSup | None = None
    up: bool = False
    restarts: int = 0


Node = MAgent | MSup


def agents_of(node: Node) -> list[MAgent]:
    if isinstance(node, MAgent):
        return [node]
    return [a for c in node.children for a in agents_of(c)]


def start(node: Node) -> None:
    """Start (or revive in place) ``node``, and every child of a supervisor, in order."""
    node.up = True
    if isinstance(node, MSup):
        node.restarts = 0
        for child in node.children:
            start(child)


def stop(node: Node) -> None:
    node.up = False
    if isinstance(node, MSup):
        for child in reversed(node.children):
            stop(child)


def retire(node: Node) -> None:
    """Stopped for good: its agents' mailboxes are settled; a later start is a fresh agent."""
    for agent in agents_of(node):
        agent.incarnation += 1


def exited(sup: MSup, child: Node) -> None:
    """``child`` of ``sup`` crashed (and is down): apply the strategy, or give up."""
    if child.restart == "temporary":
        retire(child)
        return
    sup.restarts += 1
    if sup.restarts > sup.intensity:
        stop(sup)
        retire(sup)
        if sup.parent is not None:
            exited(sup.parent, sup)
        return
    index = sup.children.index(child)
    if sup.strategy == "one_for_one":
        group = [child]
    else:
        first = index if sup.strategy == "rest_for_one" else 0
        group = [c for c in sup.children[first:] if c is child or c.up]
    others = [c for c in group if c is not child]
    for other in reversed(others):
        stop(other)
    for other in others:
        if other.restart == "temporary":
            retire(other)
    for node in group:
        if node is child or node.restart != "temporary":
            start(node)


# -- random trees ---------------------------------------------------------------------------

restarts = st.sampled_from(["permanent", "transient", "temporary"])


def trees(depth: int) -> st.SearchStrategy[Any]:
    leaf = st.tuples(st.just("agent"), restarts)
    child = leaf if depth == 0 else st.one_of(leaf, leaf, trees(depth - 1))
    return st.tuples(
        st.just("sup"),
        restarts,
        st.sampled_from(["one_for_one", "rest_for_one", "one_for_all"]),
        st.integers(0, 2),
        st.lists(child, min_size=1, max_size=3),
    )


def build(raw: Any, counter: list[int], parent: MSup | None = None) -> Node:
    counter[0] += 1
    if raw[0] == "agent":
        return MAgent(f"a{counter[0]}", raw[1], parent)
    _, restart, strategy, intensity, children = raw
    sup = MSup(f"s{counter[0]}", strategy, intensity, restart, parent=parent)
    sup.children = [build(c, counter, sup) for c in children]
    return sup


def spec_of(sup: MSup) -> SupervisorSpec:
    children: list[AgentChild | SupervisorSpec] = [
        AgentChild(c.name, "c", restart=c.restart) if isinstance(c, MAgent) else spec_of(c)
        for c in sup.children
    ]
    return SupervisorSpec(sup.name, children, sup.strategy, sup.intensity, PERIOD, sup.restart)


# -- the machine ----------------------------------------------------------------------------


@dataclass(eq=False)
class Ask:
    """One ask sent, and what the model says it must settle with."""

    future: Future[bytes | None]
    expect: Any
    """The decoded reply, AgentCrashed or NoProc."""


class TreeMachine(RuleBasedStateMachine):
    component: ClassVar[Component]

    def __init__(self) -> None:
        super().__init__()
        self.rt = Runtime(workers=1)
        self.rt.register(AgentType("c", self.component))
        self.asks: list[Ask] = []
        self.refused = 0
        self.serial = 0

    @initialize(raw=trees(2))
    def start_tree(self, raw: Any) -> None:
        self.root = build(raw, [0])
        assert isinstance(self.root, MSup)
        self.agents = agents_of(self.root)
        start_tree(self.rt, spec_of(self.root))
        start(self.root)

    def _ask(self, agent: MAgent, message: str, expect: Any) -> None:
        try:
            future = self.rt.ask_future(agent.name, message, self.serial)
        except NoProc:
            assert not agent.up, f"{agent.name} should be running"
            self.refused += 1
            return
        assert agent.up, f"{agent.name} should be gone"
        self.asks.append(Ask(future, expect))

    def _crash(self, agent: MAgent) -> None:
        agent.up = False
        assert agent.parent is not None
        exited(agent.parent, agent)

    @rule(index=st.integers(0, 9))
    def ask(self, index: int) -> None:
        agent = self.agents[index % len(self.agents)]
        self.serial += 1
        self._ask(agent, "x", self.serial)

    @rule(index=st.integers(0, 9))
    def crash(self, index: int) -> None:
        agent = self.agents[index % len(self.agents)]
        was_up = agent.up
        self._ask(agent, "crash", AgentCrashed)
        if was_up:
            self._crash(agent)

    @rule(index=st.integers(0, 9), behind=st.integers(1, 4))
    def crash_with_a_queue(self, index: int, behind: int) -> None:
        """A crash with asks queued behind it: handled after the restart, or NoProc."""
        agent = self.agents[index % len(self.agents)]
        if not agent.up:
            self._ask(agent, "crash", NoProc)
            return
        process = self.rt.process(agent.name)
        queued: list[tuple[Future[bytes | None], int]] = []
        with process._run:
            crash = self.rt.ask_future(agent.name, "crash")
            for _ in range(behind):
                self.serial += 1
                queued.append((self.rt.ask_future(agent.name, "x", self.serial), self.serial))
        self.asks.append(Ask(crash, AgentCrashed))
        before = agent.incarnation
        self._crash(agent)
        kept = agent.up and agent.incarnation == before
        for future, serial in queued:
            self.asks.append(Ask(future, serial if kept else NoProc))

    @invariant()
    def every_ask_settles_as_the_model_says(self) -> None:
        assert self.rt.drain(60), "the runtime did not become idle"
        for ask in self.asks:
            assert ask.future.done(), "an ask did not settle"
            error = ask.future.exception()
            got = type(error) if error is not None else decode_body(ask.future.result())
            assert got == ask.expect
        self.asks.clear()
        for agent in self.agents:
            assert (self.rt.whereis(agent.name) is not None) == agent.up, agent.name

    def teardown(self) -> None:
        # Asks still queued when the runtime stops settle too, and shutdown returns.
        late = []
        for agent in self.agents:
            with contextlib.suppress(NoProc):
                late.append(self.rt.ask_future(agent.name, "x", 0))
        stopper = threading.Thread(
            target=self.rt.shutdown, kwargs={"drain": False, "timeout": 10}, daemon=True
        )
        stopper.start()
        stopper.join(60)
        assert not stopper.is_alive(), "shutdown did not return"
        for future in late:
            assert future.exception(timeout=60) is None or isinstance(future.exception(), NoProc)


def test_random_crashes_over_random_trees_settle_every_ask(crasher_agent: Component) -> None:
    """Over random trees and crash patterns every ask settles as the model of OTP says."""
    TreeMachine.component = crasher_agent
    run_state_machine_as_test(
        TreeMachine,
        settings=settings(
            max_examples=25,
            stateful_step_count=10,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
