"""Introspection: ``__inspect`` answered by the host while the handler is stuck, the ring buffer,
the privacy rule (bodies only with the introspect capability), and the supervision tree."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mighty import Budget, Component
from mighty.agents import (
    AgentChild,
    AgentType,
    MailboxFullError,
    MailboxSettings,
    NoProc,
    Runtime,
    SupervisorSpec,
    start_tree,
)
from mighty.agents._introspect import History

ROOT = Path(__file__).resolve().parents[2]

_HANDLE = (
    '(func (export "handle") (param i32 i32 i32 i32 i32 i32) (result i32)'
    " (local $r i32) (local $name i32)"
)
# A message named "spin" (4 bytes, 's' first) loops until its deadline: a handler stuck for good.
_SPIN = """
      (if (i32.and (i32.eq (local.get 3) (i32.const 4))
                   (i32.eq (i32.load8_u (local.get 2)) (i32.const 0x73)))
        (then (loop $forever (br $forever))))"""


@pytest.fixture(scope="module")
def spinner(wat: Callable[[str], bytes]) -> Component:
    """The WAT echo agent whose "spin" message never returns (until the deadline)."""
    text = (ROOT / "tests" / "fixtures" / "echo_agent.wat").read_text()
    assert text.count(_HANDLE) == 1
    return Component.load(wat(text.replace(_HANDLE, _HANDLE + _SPIN)))


def _wait_for(predicate: Callable[[], bool], limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while not predicate():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.01)


def test_inspect_answers_while_the_handler_spins_and_the_mailbox_is_full(
    spinner: Component,
) -> None:
    """A stuck handler and a full mailbox: __inspect still answers, naming the message in flight."""
    rt = Runtime(workers=1)
    try:
        rt.register(
            AgentType(
                "spin",
                spinner,
                budget=Budget(timeout=20.0, fuel=10**15),
                mailbox=MailboxSettings(capacity=2, on_full="fail"),
            )
        )
        address = rt.spawn("spin", name="looper")
        rt.send(address, "spin")
        _wait_for(lambda: rt.inspect(address)["in_flight"] is not None)
        rt.send(address, "a", 1)
        rt.send(address, "b", 2)
        with pytest.raises(MailboxFullError):
            rt.send(address, "c", 3)
        # As a message: the host answers, not the guest (which is busy, its mailbox full).
        snapshot = rt.ask(address, "__inspect", timeout=5)
        assert snapshot["version"] == 1
        assert snapshot["address"] == address
        assert snapshot["name"] == "looper"
        assert snapshot["type"] == "spin"
        assert snapshot["component"] == spinner.sha256
        assert snapshot["state"] == "running"
        assert snapshot["in_flight"]["message"] == "spin"
        assert snapshot["in_flight"]["sender"] == "host"
        assert snapshot["in_flight"]["elapsed_ms"] >= 0
        assert "body" not in snapshot["in_flight"]
        assert snapshot["mailbox"] == {
            "depth": 2,
            "capacity": 2,
            "high_water": 2,
            "accepted": 3,
            "dropped": 0,
            "rejected": 1,
        }
        budget = snapshot["budget"]
        assert budget["memory_ceiling"] == Budget().memory
        assert 65536 <= budget["memory_used"] <= budget["memory_ceiling"]
        assert budget["fuel_per_message"] == 10**15
        assert budget["timeout_s"] == 20.0
        # By name, through the Python API, the same agent.
        assert rt.inspect("looper")["address"] == address
    finally:
        rt.shutdown(drain=False, timeout=0.5)


def test_recent_messages_ring_buffer_and_outcomes(echo_agent: Component) -> None:
    """The last N handled messages are kept with name, sender, outcome, duration and fuel."""
    from pydantic import BaseModel

    class Put(BaseModel):
        key: str

    with Runtime(workers=1, history=5) as rt:
        rt.register(AgentType("echo", echo_agent, accepts={"put": Put, "x": None}))
        address = rt.spawn("echo")
        for i in range(7):
            rt.ask(address, "x", i)
        with pytest.raises(Exception, match="does not accept"):
            rt.ask(address, "nope")
        assert rt.drain(5)
        recent = rt.inspect(address)["recent"]
        assert [r["name"] for r in recent] == ["x", "x", "x", "x", "nope"]
        assert [r["outcome"] for r in recent] == ["ok"] * 4 + ["refused"]
        assert all(r["sender"] == "host" and r["duration_ms"] >= 0 for r in recent)
        assert recent[0]["fuel"] > 0
        assert all("body" not in r for r in recent)
        snapshot = rt.inspect(address)
        assert snapshot["handled"] == 7
        assert snapshot["failed"] == 1
        assert snapshot["bodies"] is False


def test_bodies_only_with_the_introspect_capability(echo_agent: Component) -> None:
    """With introspect=True the snapshot carries (bounded) bodies; bytes come back as base64."""
    with Runtime(workers=1, introspect=True) as rt:
        rt.register(AgentType("echo", echo_agent))
        address = rt.spawn("echo")
        rt.ask(address, "x", {"k": [1, 2]})
        rt.ask(address, "y", b"\x00\x01")
        rt.ask(address, "big", "z" * 5000)
        recent = rt.inspect(address)["recent"]
        assert recent[0]["body"] == {"k": [1, 2]}
        assert recent[1]["body"] == {"bytes": "AAE="}
        assert recent[2]["body"]["truncated"] is True
        assert recent[2]["body"]["size"] > 5000


def test_unknown_and_dead_agents_are_noproc(crasher_agent: Component) -> None:
    """Inspecting an unknown address, or an agent that crashed unsupervised, is NoProc."""
    with Runtime(workers=1) as rt:
        rt.register(AgentType("c", crasher_agent))
        address = rt.spawn("c")
        with pytest.raises(NoProc, match="c:99"):
            rt.inspect("c:99")
        rt.send(address, "crash")
        assert rt.drain(5)
        with pytest.raises(NoProc):
            rt.inspect(address)
        with pytest.raises(NoProc):
            rt.ask(address, "__inspect")


def test_tree_snapshot_has_supervisors_parents_restarts_and_workers(
    crasher_agent: Component,
) -> None:
    """The whole-runtime snapshot names supervisors and parents; a restart is counted."""
    with Runtime(workers=2) as rt:
        rt.register(AgentType("c", crasher_agent))
        start_tree(
            rt,
            SupervisorSpec(
                "root",
                [AgentChild("one", "c"), SupervisorSpec("inner", [AgentChild("two", "c")])],
            ),
        )
        two = rt.whereis("two")
        assert two is not None
        rt.send(two, "crash")
        _wait_for(lambda: rt.inspect(two)["restarts"] == 1 and rt.idle())
        tree = rt.inspect()
        assert tree["version"] == 1
        assert {(s["name"], s["parent"]) for s in tree["supervisors"]} == {
            ("root", None),
            ("inner", "root"),
        }
        parents = {a["name"]: a["parent"] for a in tree["agents"]}
        assert parents == {"one": "root", "two": "inner"}
        assert next(a for a in tree["agents"] if a["name"] == "two")["crashes"] == 1
        assert [w["name"] for w in tree["workers"]][:2] == ["worker-0", "worker-1"]
        assert all(w["current"] is None for w in tree["workers"])
        frame = rt.top()
        assert {a["address"] for a in frame["agents"]} == {a["address"] for a in tree["agents"]}
        assert frame["version"] == 1


@given(st.integers(0, 8), st.lists(st.text(max_size=3), max_size=30))
def test_history_keeps_the_last_n_in_order(size: int, names: list[str]) -> None:
    """The ring buffer holds exactly the last ``size`` entries, oldest first."""
    history = History(size)
    for i, name in enumerate(names):
        history.add(name, "s", "ok", float(i), 0.0, i, None)
    kept = history.items()
    assert [item[0] for item in kept] == (names[-size:] if size else [])
    assert len(history) == min(size, len(names))
