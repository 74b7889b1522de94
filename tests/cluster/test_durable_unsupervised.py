"""A durable agent spawned by name with no supervisor consumes its messages (its consumer used
to look for it before it was started, find nothing, and end: the name's messages waited in the
stream for ever)."""

from __future__ import annotations

import time

from mighty import Component
from mighty.agents import AgentType, Runtime
from mighty.cluster import NatsServer, Node, parse_cluster


def test_an_unsupervised_durable_agent_consumes_its_messages(
    counter: Component, nats_server: NatsServer
) -> None:
    """spawn_on with a name and no supervise: durable sends by name are handled."""
    data = {
        "servers": [nats_server.url],
        "peers": {"a": {}, "t": {"spawn": False}},
        "heartbeat": 0.2,
        "dead_after": 1.0,
        "durable": ["ledger"],
    }
    made: list[tuple[Runtime, Node]] = []
    for name in ("a", "t"):
        runtime = Runtime(workers=1)
        runtime.register(AgentType("ledger", counter))
        made.append((runtime, Node(runtime, parse_cluster(data), name=name).start()))
    (_ra, node_a), (rt, _node_t) = made
    try:
        node_a.spawn_on("a", "ledger", name="led")
        for _ in range(3):
            rt.send("led", "incr", {"by": 1}, timeout=10)
        deadline = time.monotonic() + 60
        while node_a.durable.handled < 3:
            assert time.monotonic() < deadline, "the durable messages were never handled"
            time.sleep(0.02)
        assert rt.ask("led", "get", timeout=10)["count"] == 3
    finally:
        for runtime, node in reversed(made):
            runtime.shutdown(drain=False, timeout=2)
            node.close()
