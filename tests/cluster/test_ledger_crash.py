"""Durable messages handled in batches: a message the ledger crashes on (out of fuel: a fixed
budget per message, so the crash does not depend on the machine's speed or load) in the middle
of a batch counts as handled, the state before it is restored, and every other
deposit of the batch is counted once."""

from __future__ import annotations

import time

from mighty import Component
from mighty.agents import AgentType, Runtime
from mighty.budget import Budget
from mighty.cluster import NatsServer, Node, parse_cluster
from tests.cluster.test_ledger import pending


def test_a_crash_inside_a_batch_is_handled_once(
    counter: Component, nats_server: NatsServer
) -> None:
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
        # An incr costs a few million fuel; a "work" of 10**9 steps runs out (as in
        # test_migrate_supervised, which crashes the same agent the same way).
        runtime.register(AgentType("ledger", counter, budget=Budget(fuel=400_000_000)))
        made.append((runtime, Node(runtime, parse_cluster(data), name=name).start()))
    (ra, node_a), (rt, node_t) = made
    try:
        address = node_a.spawn_on("a", "ledger", name="led", supervise=(100, 5.0))
        assert node_t.whereis("led") == address
        crashes = {10, 25}
        for n in range(40):  # all stored before the consumer's first batch is done
            if n in crashes:
                rt.send("led", "work", {"n": 10**9})  # runs out of fuel: a crash
            else:
                rt.send("led", "incr", {"by": 1})
        deadline = time.monotonic() + 300
        while pending(nats_server.url, ["dur_led"]) > 0:
            assert time.monotonic() < deadline, "durable messages left unhandled"
            time.sleep(0.05)
        assert rt.ask("led", "get", timeout=10)["count"] == 40 - len(crashes)
        assert node_a.durable.handled >= 40
        assert ra.process(address.partition(":")[2]).stats.crashes >= len(crashes)
    finally:
        for runtime, node in reversed(made):
            runtime.shutdown(drain=False, timeout=2)
            node.close()
