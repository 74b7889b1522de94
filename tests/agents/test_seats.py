"""Seats: agent instances made from a warmed state and reused after hibernation carry nothing of
the agent they served before (mighty.agents._seats)."""

from __future__ import annotations

import gc
import tempfile
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from mighty import Component
from mighty.agents import AgentType, Runtime
from mighty.agents._seats import MAX_SEATS
from mighty.agents.hosting import run_summary
from mighty.trace import Recorder
from tests.agents.conftest import GUESTS, _build_path

pytestmark = pytest.mark.slow


class Clock:
    """The idle timer's clock: still (agents hibernate only when a test says so)."""

    def __call__(self) -> float:
        return 0.0


@pytest.fixture(scope="module")
def tenant(tmp_path_factory: pytest.TempPathFactory) -> Component:
    return Component.load(_build_path("tenant", tmp_path_factory.mktemp("tenant"), GUESTS))


@pytest.fixture
def rt(tmp_path: Path, tenant: Component) -> Iterator[Runtime]:
    with Runtime(workers=1, state_dir=tmp_path / "state", clock=Clock()) as runtime:
        runtime.register(AgentType("tenant", tenant, hibernate_after=1000.0))
        yield runtime


def ask(rt: Runtime, address: str, name: str, body: Any = None) -> Any:
    return rt.ask(address, name, body, timeout=60)


def sleep(rt: Runtime, address: str) -> None:
    assert rt.hibernate(address, timeout=30.0)


def warm(rt: Runtime) -> str:
    """The type's first agent (kept awake): its instance, from the image, makes the warmed
    state; every later one is made from that state, and may be rewound."""
    return rt.spawn("tenant")


def test_a_reused_instance_carries_nothing_over(rt: Runtime) -> None:
    """An agent woken into another's rewound instance sees none of its module state or name."""
    warm(rt)
    a = rt.spawn("tenant")
    assert ask(rt, a, "plant", "secret-a") == {"seen": ["secret-a"]}
    sleep(rt, a)
    assert rt.seats.free("tenant") == 1
    b = rt.spawn("tenant")
    assert rt.seats.stats.reused == 1 and rt.seats.free("tenant") == 0
    seen = ask(rt, b, "look")
    assert seen["seen"] == [] and seen["me"] == b and seen["name"] == ""
    ask(rt, b, "plant", "secret-b")
    sleep(rt, b)
    woken = ask(rt, a, "look")  # a wakes into b's instance, its own state restored
    assert rt.seats.stats.reused == 2
    assert woken["seen"] == [] and woken["me"] == a and woken["name"] == "secret-a"


def test_each_wake_draws_its_own_random(rt: Runtime) -> None:
    """``random`` is reseeded on every seat: no two wakes (of one agent or two) share a roll."""
    warm(rt)
    agents = [rt.spawn("tenant") for _ in range(2)]
    rolls = []
    for _ in range(4):
        for address in agents:
            rolls.append(ask(rt, address, "look")["roll"])
            sleep(rt, address)
    assert rt.seats.stats.reused >= 6
    assert len(set(rolls)) == len(rolls)


def test_output_goes_to_the_agent_served(rt: Runtime) -> None:
    """Prints and log lines of a reused instance reach the agent it serves now, only."""
    warm(rt)
    a = rt.spawn("tenant")
    ask(rt, a, "plant", "from-a")
    sleep(rt, a)
    b = rt.spawn("tenant")
    ask(rt, b, "plant", "from-b")
    assert rt.seats.stats.reused == 1
    lines_a = [o.text for o in rt.process(a).output.items()]
    lines_b = [o.text for o in rt.process(b).output.items()]
    assert lines_a == [f"planted from-a in {a}", "log of from-a"]
    assert lines_b == [f"planted from-b in {b}", "log of from-b"]


def test_the_run_summary_counts_them(rt: Runtime) -> None:
    """``mty run --json``'s summary carries the seats' counters."""
    warm(rt)
    a = rt.spawn("tenant")
    ask(rt, a, "look")
    sleep(rt, a)
    ask(rt, a, "look")
    assert run_summary(rt)["instances"] == {
        "reused": 1,
        "from_state": 1,
        "rewound": 1,
        "closed": 0,
    }


def test_an_instance_given_a_resource_is_closed(rt: Runtime) -> None:
    """An agent that was given a host resource (a pollable) does not leave its instance."""
    warm(rt)
    a = rt.spawn("tenant")
    ask(rt, a, "look")
    sleep(rt, a)
    assert rt.seats.free("tenant") == 1
    closed = rt.seats.stats.closed
    ask(rt, a, "nap")  # back in its rewound instance, it waits on a clock
    sleep(rt, a)
    assert rt.seats.stats.closed == closed + 1
    assert rt.seats.free("tenant") == 0
    assert ask(rt, a, "look")["name"] == ""


def test_a_stopped_agents_instance_is_freed(rt: Runtime) -> None:
    """The seats keep no instance they do not hold free: a stopped agent's is collected."""
    warm(rt)
    a = rt.spawn("tenant")
    ask(rt, a, "look")
    instance = rt.process(a).instance
    assert instance is not None
    gone = weakref.ref(instance)
    del instance
    rt.stop(a)
    gc.collect()
    assert gone() is None


def test_no_seats_without_a_state_dir(tenant: Component) -> None:
    """No agent hibernates without a store: every instance is made from the image, unreseeded."""
    with Runtime(workers=1) as rt:
        rt.register(AgentType("tenant", tenant))
        for _ in range(3):
            assert ask(rt, rt.spawn("tenant"), "plant", "x") == {"seen": ["x"]}
        stats = rt.seats.stats
        assert (stats.reused, stats.from_state, stats.rewound, stats.closed) == (0, 0, 0, 0)


def test_no_seats_while_recording(tmp_path: Path, tenant: Component) -> None:
    """A recorded runtime makes each instance from the image: its trace holds the start-up."""
    with (
        Recorder(tmp_path / "run.trace", positions=False) as recorder,
        Runtime(workers=1, state_dir=tmp_path / "state", clock=Clock(), recorder=recorder) as rt,
    ):
        rt.register(AgentType("tenant", tenant, hibernate_after=1000.0))
        a = rt.spawn("tenant")
        ask(rt, a, "plant", "x")
        sleep(rt, a)
        assert ask(rt, a, "look")["name"] == "x"
        stats = rt.seats.stats
        assert (stats.reused, stats.from_state, stats.rewound) == (0, 0, 0)


def test_a_hot_swap_drops_the_seats(rt: Runtime, tmp_path: Path) -> None:
    """Free seats of a replaced component are closed; the new one's agents get fresh ones."""
    first = warm(rt)
    a, b = rt.spawn("tenant"), rt.spawn("tenant")
    for address in (a, b):
        ask(rt, address, "plant", address)
        sleep(rt, address)
    assert rt.seats.free("tenant") == 2
    report = rt.reload("tenant", _build_path("tenant", tmp_path, GUESTS))
    assert sorted(report.agents) == sorted([first, a, b])
    closed, reused = rt.seats.stats.closed, rt.seats.stats.reused
    assert ask(rt, a, "look")["name"] == a
    assert rt.seats.stats.closed == closed + 2 and rt.seats.free("tenant") == 0
    assert rt.seats.stats.reused == reused


class Tenancy(RuleBasedStateMachine):
    """Random spawns, plants, looks and hibernations: every agent sees its own state and only
    the module state its current instance gathered since it woke."""

    agents = Bundle("agents")

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        self.rt = Runtime(workers=1, state_dir=Path(self.tmp.name) / "state", clock=Clock())
        self.rt.register(AgentType("tenant", TENANT[0], hibernate_after=1000.0))
        warm(self.rt)
        self.name: dict[str, str] = {}
        self.seen: dict[str, list[str]] = {}
        self.rolls: list[float] = []

    @rule(target=agents)
    def spawn(self) -> str:
        address = self.rt.spawn("tenant")
        self.name[address], self.seen[address] = "", []
        return address

    @rule(address=agents, value=st.text("xyz", min_size=1, max_size=3))
    def plant(self, address: str, value: str) -> None:
        self.seen[address].append(value)
        self.name[address] = value
        assert ask(self.rt, address, "plant", value) == {"seen": self.seen[address]}

    @rule(address=agents)
    def look(self, address: str) -> None:
        seen = ask(self.rt, address, "look")
        assert seen["me"] == address
        assert seen["name"] == self.name[address]
        assert seen["seen"] == self.seen[address]
        assert seen["roll"] not in self.rolls
        self.rolls.append(seen["roll"])

    @rule(address=agents)
    def hibernate(self, address: str) -> None:
        if self.rt.process(address).hibernated:
            return
        sleep(self.rt, address)
        self.seen[address] = []  # it wakes into a new or rewound instance

    @invariant()
    def bounded(self) -> None:
        assert self.rt.seats.free("tenant") <= MAX_SEATS

    def teardown(self) -> None:
        self.rt.shutdown()
        self.tmp.cleanup()


TENANT: list[Component] = []


def test_tenancy(tenant: Component) -> None:
    """The state machine above, on one built component."""
    TENANT[:] = [tenant]
    machine = settings(
        max_examples=12,
        stateful_step_count=20,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )(Tenancy)
    machine.TestCase().runTest()
