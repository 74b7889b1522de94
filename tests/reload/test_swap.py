"""Hot swap of running agents: state kept, incompatible versions refused, failures rolled back."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from mighty import Budget, Component
from mighty.agents import (
    AgentChild,
    AgentEvent,
    AgentType,
    MailboxFullError,
    Runtime,
    SupervisorSpec,
    start_tree,
)
from mighty.agents import decode_body as decode
from mighty.reload import ReloadFailed, ReloadRefused


def runtime_with(
    counters: dict[str, Path], agents: int = 1, budget: Budget | None = None
) -> Runtime:
    """A runtime running `agents` supervised v1 counters named c0, c1, ..."""
    rt = Runtime(workers=2)
    component = Component.load(counters["v1"])
    rt.register(AgentType("counter", component, budget=budget or Budget()))
    start_tree(rt, SupervisorSpec("root", [AgentChild(f"c{i}", "counter") for i in range(agents)]))
    return rt


@pytest.mark.slow
def test_compatible_swap_keeps_state_while_messages_arrive(counters: dict[str, Path]) -> None:
    """v1 -> v2 (a new field) keeps the count; sends during the swap are all counted, in order."""
    with runtime_with(counters) as rt:
        rt.ask("c0", "incr", {"by": 10})
        replies: list[dict[str, int]] = []
        stop = threading.Event()

        def hammer() -> None:
            while not stop.is_set():
                replies.append(rt.ask("c0", "incr", {"by": 1}))

        thread = threading.Thread(target=hammer)
        thread.start()
        report = rt.reload("counter", counters["v2"])
        stop.set()
        thread.join()
        for _ in range(5):
            replies.append(rt.ask("c0", "incr", {"by": 1}))
        final = rt.ask("c0", "get")
        assert final["version"] == 2
        assert final["count"] == 10 + len(replies)
        counts = [r["count"] for r in replies]
        assert counts == list(range(11, 11 + len(replies)))  # nothing lost, nothing reordered
        assert {r["version"] for r in replies} <= {1, 2}
        assert report.agents == [rt.whereis("c0")]
        assert not report.migration


@pytest.mark.slow
def test_incompatible_swap_is_refused_and_the_old_version_serves(counters: dict[str, Path]) -> None:
    """v2 -> v3 changes count's type: refused naming the field; v2 keeps serving its state."""
    with runtime_with(counters) as rt:
        rt.ask("c0", "incr", {"by": 3})
        rt.reload("counter", counters["v2"])
        with pytest.raises(ReloadRefused) as info:
            rt.reload("counter", counters["v3"])
        assert any("count" in problem for problem in info.value.problems)
        assert rt.ask("c0", "get") == {"count": 3, "increments": 0, "version": 2}


@pytest.mark.slow
def test_restore_that_traps_rolls_back(counters: dict[str, Path]) -> None:
    """v4 traps in restore: the swap rolls back and every agent runs v1 with its state."""
    with runtime_with(counters, agents=3) as rt:
        for i in range(3):
            rt.ask(f"c{i}", "incr", {"by": i + 1})
        with pytest.raises(ReloadFailed, match="restore"):
            rt.reload("counter", counters["v4"])
        assert [rt.ask(f"c{i}", "get")["count"] for i in range(3)] == [1, 2, 3]
        assert all(rt.ask(f"c{i}", "get")["version"] == 1 for i in range(3))
        assert any(e.kind == "reload.rolled_back" for e in rt.events)


@pytest.fixture(scope="module")
def held_counter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """v1 whose ``work`` handler logs ``working`` (guests/testing/counter/held.py)."""
    from mighty.build import build_component

    root = Path(__file__).resolve().parents[2]
    out = tmp_path_factory.mktemp("held") / "held.wasm"
    build_component(
        root / "guests" / "testing" / "counter" / "held.py",
        output=out,
        wit=root / "wit" / "agent",
        python_path=[root / "guests" / "sdk"],
    )
    return out


@pytest.mark.timing
@pytest.mark.slow
def test_swap_waiting_past_the_drain_deadline_rolls_back(
    counters: dict[str, Path], held_counter: Path
) -> None:
    """A handler still running at the drain deadline makes the swap roll back, nothing lost."""
    # The handler is held inside its turn (in its `log` host call) until the swap has given
    # up: it is running at the drain deadline however long the swap's own checks take. Rejected:
    # ~1 s of guest arithmetic, which a loaded machine (or a cold compile of v2) outlasted.
    working, release = threading.Event(), threading.Event()

    def hold(event: AgentEvent) -> None:
        if event.kind == "log" and event.data.get("text") == "working":
            working.set()
            release.wait(120)

    # Time is not the subject of the turn: the message's own deadline outlasts any hold.
    budget = Budget(timeout=600.0)
    with Runtime(workers=2, on_event=hold) as rt:
        rt.register(AgentType("counter", Component.load(held_counter), budget=budget))
        start_tree(rt, SupervisorSpec("root", [AgentChild("c0", "counter")]))
        try:
            slow = rt.ask_future("c0", "work", {})
            queued = [rt.ask_future("c0", "incr", {"by": 1}) for _ in range(5)]
            assert working.wait(120), "the slow handler never started"
            with pytest.raises(ReloadFailed, match="drain deadline"):
                rt.reload("counter", counters["v2"], drain_timeout=0.1)
        finally:
            release.set()
        assert decode(slow.result(120)) == {"done": True}
        assert [decode(f.result(30))["count"] for f in queued] == [1, 2, 3, 4, 5]
        assert rt.ask("c0", "get") == {"count": 5, "version": 1}
        assert any(e.kind == "reload.rolled_back" for e in rt.events)


@pytest.mark.slow
def test_swap_of_many_agents_under_a_flood(counters: dict[str, Path]) -> None:
    """Ten agents flooded with sends during a swap: every send is counted exactly once."""
    with runtime_with(counters, agents=10) as rt:
        stop = threading.Event()
        sent = [0] * 10

        def flood() -> None:
            while not stop.is_set():
                for i in range(10):
                    try:
                        rt.send(f"c{i}", "incr", {"by": 1})
                    except MailboxFullError:
                        continue  # backpressure: not accepted, so not counted
                    sent[i] += 1

        thread = threading.Thread(target=flood)
        thread.start()
        report = rt.reload("counter", counters["v2"])
        stop.set()
        thread.join()
        assert rt.drain(60)
        assert [rt.ask(f"c{i}", "get")["count"] for i in range(10)] == sent
        assert len(report.agents) == 10


@pytest.mark.slow
def test_a_trace_spanning_a_swap_replays_each_version(
    counters: dict[str, Path], tmp_path: Path
) -> None:
    """Recording across a swap: the old and the new instance each replay with their own version."""
    from mighty.trace import Recorder, read_trace, replay_trace

    trace = tmp_path / "swap.bin"
    with Recorder(trace) as recorder, Runtime(workers=2, recorder=recorder) as rt:
        rt.register(AgentType("counter", Component.load(counters["v1"])))
        start_tree(rt, SupervisorSpec("root", [AgentChild("c", "counter")]))
        rt.ask("c", "incr", {"by": 4})
        rt.reload("counter", counters["v2"])
        assert rt.ask("c", "incr", {"by": 1}) == {"count": 5, "version": 2}
    records = list(read_trace(trace).records())
    assert any(r["k"] == "swap" for r in records)
    report = replay_trace(trace)
    components = [i.component for i in report.instances]
    assert len(set(components)) == 2  # v1 before the swap, v2 after
