"""A durable agent spawned by name with no supervisor consumes its messages (its consumer used
to look for it before it was started, find nothing, and end: the name's messages waited in the
stream for ever)."""

from __future__ import annotations

import time

from mighty import Component
from mighty.agents import AgentType
from tests.cluster.conftest import DurablePair


def test_an_unsupervised_durable_agent_consumes_its_messages(
    counter: Component, durable_pair: DurablePair
) -> None:
    """spawn_on with a name and no supervise: durable sends by name are handled."""
    node_a, rt = durable_pair(AgentType("ledger", counter))
    node_a.spawn_on("a", "ledger", name="led")
    for _ in range(3):
        rt.send("led", "incr", {"by": 1}, timeout=10)
    deadline = time.monotonic() + 60
    while node_a.durable.handled < 3:
        assert time.monotonic() < deadline, "the durable messages were never handled"
        time.sleep(0.02)
    assert rt.ask("led", "get", timeout=10)["count"] == 3
