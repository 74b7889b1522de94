"""Retries (AgentType.retry): a message whose handler crashed its agent is delivered again after
a backoff, up to its attempts, then its asker hears the crash and a dead-letter agent the message;
the asker's deadline and a cancel end it sooner; drain waits for a retry under way."""

from __future__ import annotations

import threading
from pathlib import Path

import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mighty import Budget, Component
from mighty._errors import BadInput
from mighty.agents import (
    AgentChild,
    AgentCrashed,
    AgentType,
    Grants,
    RetryPolicy,
    Runtime,
    SupervisorSpec,
    load_manifest,
    start_tree,
)
from mighty.capabilities import Capabilities
from tests.agents.conftest import GUESTS, _build_path

FUEL = Budget(fuel=200_000_000)
"""What the flaky agent's spin burns through quickly, whatever the machine's speed."""


@pytest.fixture(scope="module")
def flaky(tmp_path_factory: pytest.TempPathFactory) -> Component:
    """tests/agents/guests/flaky.py, built once."""
    return Component.load(_build_path("flaky", tmp_path_factory.mktemp("flaky"), GUESTS))


def _attempts() -> tuple[Capabilities, list[int]]:
    """A host tool counting the handler's runs (what the outside world saw)."""
    runs: list[int] = []
    lock = threading.Lock()

    def attempt() -> int:
        with lock:
            runs.append(len(runs) + 1)
            return len(runs)

    return Capabilities().with_tool("attempt", attempt), runs


def _supervised(rt: Runtime, type_name: str) -> str:
    start_tree(rt, SupervisorSpec("root", [AgentChild("a", type_name)], intensity=100, period=1))
    address = rt.whereis("a")
    assert address is not None
    return address


def test_a_crashing_message_runs_again_until_it_succeeds(flaky: Component) -> None:
    """Two crashes, then the third run answers: the asker gets that answer; each retry is an
    event; the handler ran three times."""
    capabilities, runs = _attempts()
    with Runtime(workers=1, capabilities=capabilities) as rt:
        rt.register(
            AgentType(
                "flaky",
                flaky,
                budget=FUEL,
                grants=Grants(tools=frozenset({"attempt"})),
                retry=RetryPolicy(attempts=3, backoff=0.0),
            )
        )
        address = _supervised(rt, "flaky")
        assert rt.ask(address, "work", {"ok_at": 3}, timeout=120) == 3
        assert runs == [1, 2, 3]
        retries = [e.data for e in rt.events if e.kind == "message.retry"]
        assert [r["attempt"] for r in retries] == [1, 2]
        assert all(r["reason"].startswith("out_of_fuel") for r in retries)
        assert rt.process(address).stats.crashes == 2


def test_the_last_attempt_s_crash_reaches_the_asker_and_the_dead_letter(
    crasher_agent: Component, echo_agent: Component
) -> None:
    """Every run crashes: after the attempts the asker hears the crash and the dead-letter agent
    gets the message, its sender, the reason and the count."""
    with Runtime(workers=1, introspect=True) as rt:
        rt.register(AgentType("dlq", echo_agent))
        rt.register(
            AgentType(
                "c", crasher_agent, retry=RetryPolicy(attempts=3, backoff=0.0, dead_letter="dlq")
            )
        )
        dlq = rt.spawn("dlq", name="dlq")
        address = _supervised(rt, "c")
        with pytest.raises(AgentCrashed, match="crashed"):
            rt.ask(address, "crash", {"n": 1}, timeout=120)
        assert rt.process(address).stats.crashes == 3
        assert rt.drain(120)
        [letter] = [m for m in rt.process(dlq).recent.items() if m[0] == "dead_letter"]
        assert letter[1] == address  # sent by the agent that gave up
        body = cbor2.loads(letter[6])
        assert body["to"] == address and body["name"] == "crash" and body["attempts"] == 3
        assert body["sender"] == "host"
        assert cbor2.loads(body["body"]) == {"n": 1}  # the message's own (CBOR) body
        assert body["reason"].startswith("trap")


def test_no_retry_past_the_asker_s_deadline(crasher_agent: Component) -> None:
    """A backoff that would end after the asker stops waiting: the crash is its answer now."""
    with Runtime(workers=1) as rt:
        rt.register(
            AgentType("c", crasher_agent, retry=RetryPolicy(backoff=60.0, max_backoff=60.0))
        )
        address = _supervised(rt, "c")
        with pytest.raises(AgentCrashed):
            rt.ask(address, "crash", timeout=30)
        assert [e for e in rt.events if e.kind == "message.retry"] == []
        assert rt.process(address).stats.crashes == 1


def test_drain_waits_for_a_retry_under_way(crasher_agent: Component) -> None:
    """A send that crashes with a retry pending is work left: drain returns once every attempt
    ran, not in the backoff between two."""
    with Runtime(workers=1) as rt:
        rt.register(AgentType("c", crasher_agent, retry=RetryPolicy(attempts=4, backoff=0.05)))
        address = _supervised(rt, "c")
        rt.send(address, "crash")
        assert rt.drain(120)
        assert rt.process(address).stats.crashes == 4


def test_a_durable_message_keeps_its_journal_row_until_it_succeeds(
    flaky: Component, tmp_path: Path
) -> None:
    """A durable agent's message that crashed is journaled until its last run: a restart of
    the process in the backoff would retry it; once answered, nothing is left pending."""
    from mighty.agents.hosting import SnapshotStore

    capabilities, runs = _attempts()
    state = tmp_path / "state"
    with Runtime(workers=1, capabilities=capabilities, state_dir=state) as rt:
        rt.register(
            AgentType(
                "flaky",
                flaky,
                budget=FUEL,
                durable=True,
                grants=Grants(tools=frozenset({"attempt"})),
                retry=RetryPolicy(attempts=2, backoff=0.0),
            )
        )
        address = _supervised(rt, "flaky")
        rt.ask(address, "work", {"ok_at": 2}, timeout=120)
        assert runs == [1, 2]
        assert rt.journal is not None and rt.journal.pending() == []
    store = SnapshotStore(state)
    try:
        assert store.inbox_addresses() == []
    finally:
        store.close()


@given(
    st.integers(-5, 120),
    st.floats(-1, 4000, allow_nan=False),
    st.floats(-1, 4000, allow_nan=False),
)
def test_retry_policies_are_checked_and_back_off_within_bounds(
    attempts: int, backoff: float, max_backoff: float
) -> None:
    """Attempts in [1, 100] and 0 <= backoff <= max_backoff <= 3600 make a policy whose delays
    double from backoff and never pass max_backoff; anything else is BadInput."""
    valid = 1 <= attempts <= 100 and 0 <= backoff <= max_backoff <= 3600
    if not valid:
        with pytest.raises(BadInput):
            RetryPolicy(attempts, backoff, max_backoff)
        return
    policy = RetryPolicy(attempts, backoff, max_backoff)
    delays = [policy.delay(n) for n in range(1, attempts + 1)]
    assert delays[0] == min(backoff, max_backoff)
    assert all(0 <= d <= max_backoff for d in delays)
    assert delays == sorted(delays)


def test_a_manifest_sets_a_type_s_retry(tmp_path: Path, crasher_wasm: Path) -> None:
    """[agents.X] retry = {...} becomes the type's RetryPolicy; a bad one names the type."""
    from mighty.agents.hosting import agent_types

    (tmp_path / "c.wasm").write_bytes(crasher_wasm.read_bytes())
    text = (
        '[agents.c]\ncomponent = "c.wasm"\n'
        'retry = { attempts = 5, backoff = 0.5, max_backoff = 2.0, dead_letter = "dlq" }\n'
    )
    (tmp_path / "mighty.toml").write_text(text)
    [c] = agent_types(*load_manifest(tmp_path / "mighty.toml"))
    assert c.retry == RetryPolicy(5, 0.5, 2.0, "dlq")
    (tmp_path / "mighty.toml").write_text(text.replace("max_backoff = 2.0", "max_backoff = 0.1"))
    with pytest.raises(BadInput, match="agent type 'c': retry"):
        agent_types(*load_manifest(tmp_path / "mighty.toml"))
