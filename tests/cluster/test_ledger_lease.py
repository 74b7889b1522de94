"""The cluster supervisor's lease, on in-process nodes: a holder that loses it lets go of its
children (they run on), a standby takes a stale lease over and adopts them, and a supervisor
stopped on purpose is not taken over."""

from __future__ import annotations

import asyncio
import time

import cbor2
import nats

from mighty.cluster import ClusterSupervisorModel, NatsServer, SupervisorLease
from tests.cluster.conftest import Nodes

PLAN = ClusterSupervisorModel.model_validate(
    {
        "node": "a",
        "children": [
            {"name": "e1", "type": "echo", "node": "a"},
            {"name": "e2", "type": "echo", "node": "b"},
        ],
    }
)


def _steal(url: str) -> None:
    """Rewrite the lease as another holder's (as after a partition), by compare-and-set."""

    async def go() -> None:
        nc = await nats.connect(url)
        try:
            kv = await nc.jetstream().key_value("mighty_leases")
            entry = await kv.get("sup-cluster")
            value = cbor2.dumps({"node": "t", "state": "held"})
            await kv.update("sup-cluster", value, last=entry.revision)
        finally:
            await nc.close()

    asyncio.run(go())


def _until(check: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_a_lost_lease_detaches_and_a_standby_adopts(nodes: Nodes, nats_server: NatsServer) -> None:
    ra, node_a = nodes("a")
    rb, node_b = nodes("b")
    assert node_a.wait_for(["b"], 10) and node_b.wait_for(["a"], 10)
    holder = SupervisorLease(node_a, PLAN).start()
    standby = SupervisorLease(node_b, PLAN).start()
    try:
        assert holder.held and not standby.held
        where = holder.supervisor.where() if holder.supervisor else {}
        assert {n: a.partition(":")[0] for n, a in where.items()} == {"e1": "a", "e2": "b"}
        ra.send("e1", "x", 1)
        _steal(nats_server.url)
        _until(lambda: not holder.held)  # its compare-and-set failed: it let go
        # The children run on where they were, untouched.
        assert node_b.whereis("e1") == where["e1"] and node_b.whereis("e2") == where["e2"]
        assert rb.ask("e1", "x", "still here", timeout=10) == "still here"
        # "t" sends no heartbeat: after dead_after the standby takes over and adopts both.
        _until(lambda: standby.held)
        assert standby.takeovers == 1
        assert standby.supervisor is not None
        assert sorted(standby.supervisor.adopted) == ["e1", "e2"]
        assert standby.supervisor.where() == where
        assert ra.process(where["e1"].partition(":")[2]).stats.handled == 2
    finally:
        standby.stop()
        holder.stop()


def test_a_supervisor_stopped_on_purpose_is_not_taken_over(nodes: Nodes) -> None:
    _, node_a = nodes("a")
    _, node_b = nodes("b")
    assert node_a.wait_for(["b"], 10) and node_b.wait_for(["a"], 10)
    holder = SupervisorLease(node_a, PLAN).start()
    standby = SupervisorLease(node_b, PLAN).start()
    try:
        assert holder.held
        holder.stop()  # stops its children and marks the lease stopped
        _until(lambda: node_b.whereis("e1") is None and node_b.whereis("e2") is None)
        time.sleep(3 * node_b.config.dead_after)  # long past the window of a takeover
        assert not standby.held and standby.takeovers == 0
        assert node_b.whereis("e1") is None
        # The preferred node takes a stopped lease again when it starts supervising anew.
        again = SupervisorLease(node_a, PLAN).start()
        try:
            assert again.held and again.takeovers == 0
        finally:
            again.stop()
    finally:
        standby.stop()
