"""The cluster supervisor's lease, on in-process nodes: a holder that loses it lets go of its
children (they run on), a standby takes a stale lease over and adopts them, a supervisor
stopped on purpose is not taken over, and (a state machine) one holder at most, whatever the
order of steps, partitions, time and restarts."""

from __future__ import annotations

import asyncio
import time

import cbor2
import nats
import nats.js.errors
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

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


def _until(check: object, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_a_lost_lease_detaches_and_a_standby_adopts(nodes: Nodes, nats_server: NatsServer) -> None:
    ra, node_a = nodes("a")
    rb, node_b = nodes("b")
    assert node_a.wait_for(["b"], 60) and node_b.wait_for(["a"], 60)
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
        assert rb.ask("e1", "x", "still here", timeout=60) == "still here"
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
    """The holder stops: the standby, stepped by hand on a clock the test moves long past the
    window of a takeover, never takes the lease."""
    _, node_a = nodes("a")
    _, node_b = nodes("b")
    assert node_a.wait_for(["b"], 60) and node_b.wait_for(["a"], 60)
    now = [0.0]
    holder = SupervisorLease(node_a, PLAN).start()
    standby = SupervisorLease(node_b, PLAN, clock=lambda: now[0]).open()  # no thread: by hand
    try:
        assert holder.held
        standby.step()  # sees the lease held
        holder.stop()  # stops its children and marks the lease stopped
        _until(lambda: node_b.whereis("e1") is None and node_b.whereis("e2") is None)
        for _ in range(3):
            standby.step()
            now[0] += node_b.config.dead_after  # long past the window of a takeover
        standby.step()
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


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_lease_has_one_holder_whatever_the_order(nodes: Nodes, nats_server: NatsServer) -> None:
    """A state machine over real leases on three live nodes (steps by hand, a clock of our own):
    nodes step in any order, a partitioned holder's lease is stolen, time passes, nodes stop and
    start again; the lease in NATS is held by at most one of them, the one it names."""
    made = [nodes(name, peers=("a", "b", "c", "t")) for name in ("a", "b", "c")]
    for _, node in made:
        assert node.wait_for(["a", "b", "c"], 60)
    empty = ClusterSupervisorModel(node="a")
    clock = _Clock()
    url = nats_server.url

    def lease(index: int) -> SupervisorLease:
        return SupervisorLease(made[index][1], empty, clock=clock).open()

    def current() -> tuple[int, str, str] | None:
        async def go() -> tuple[int, str, str] | None:
            nc = await nats.connect(url)
            try:
                kv = await nc.jetstream().key_value("mighty_leases")
                try:
                    entry = await kv.get("sup-cluster")
                except nats.js.errors.KeyNotFoundError:
                    return None
                data = cbor2.loads(entry.value or b"")
                return int(entry.revision or 0), str(data["node"]), str(data["state"])
            finally:
                await nc.close()

        return asyncio.run(go())

    class Machine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            _reset(url)
            self.leases = [lease(i) for i in range(3)]

        @rule(index=st.integers(0, 2))
        def step(self, index: int) -> None:
            stepped = self.leases[index]
            stepped.step()
            if stepped.held:  # it refreshed or took the lease: NATS names it, at its revision
                now = current()
                assert now is not None and now[0] == stepped._revision, now
                assert now[1:] == ("abc"[index], "held"), now

        @rule()
        def partition(self) -> None:
            if current() is not None:
                _steal(url)  # as a holder cut off: "t" sends no heartbeat

        @rule()
        def time_passes(self) -> None:
            clock.now += 2 * made[0][1].config.dead_after

        @rule(index=st.integers(0, 2))
        def restart(self, index: int) -> None:
            self.leases[index].stop()
            self.leases[index] = lease(index)

        @invariant()
        def one_holder(self) -> None:
            now = current()
            holding = [
                i
                for i, held in enumerate(self.leases)
                if held.held and now is not None and held._revision == now[0]
            ]
            assert len(holding) <= 1, holding
            if holding:
                assert now is not None and now[2] == "held"
                assert now[1] == "abc"[holding[0]]

        def teardown(self) -> None:
            for held in self.leases:
                held.stop()

    Machine.TestCase.settings = settings(
        max_examples=12, stateful_step_count=12, deadline=None, database=None
    )
    run_state_machine_as_test(Machine, settings=Machine.TestCase.settings)
    # And it converges: with the clock moved on, stepping every node leaves exactly one holder.
    final = [lease(i) for i in range(3)]
    for _ in range(3):
        for held in final:
            held.step()
        clock.now += 2 * made[0][1].config.dead_after
    try:
        assert sum(held.held for held in final) == 1
    finally:
        for held in final:
            held.stop()


def _reset(url: str) -> None:
    """Delete the lease (a fresh cluster for each example)."""

    async def go() -> None:
        nc = await nats.connect(url)
        try:
            kv = await nc.jetstream().key_value("mighty_leases")
            await kv.purge("sup-cluster")
        except nats.js.errors.BucketNotFoundError:
            pass
        finally:
            await nc.close()

    asyncio.run(go())


def test_a_node_dying_during_the_adoption_is_seen_after_it(
    nodes: Nodes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A takeover finds a child running on node t, and t dies right after it looked (its death
    announced before the child's handle was adopted, so the announcement found nothing to
    report): once the adoption is over, the supervisor reports the child as on a dead node,
    which restarts it, instead of leaving it to the dead node."""
    from mighty.cluster import ClusterSupervisor

    plan = ClusterSupervisorModel.model_validate(
        {"node": "a", "children": [{"name": "e3", "type": "echo", "node": "t"}]}
    )
    _ra, node_a = nodes("a")
    _rb, node_b = nodes("b")
    _rt, _node_t = nodes("t")
    assert node_b.wait_for(["a", "t"], 60)
    first = ClusterSupervisor.from_model(node_a, plan).start()
    assert first.where()["e3"].startswith("t:")
    first.detach()  # as a holder that lost its lease: e3 runs on, unsupervised
    _until(lambda: node_b.whereis("e3") is not None)
    # t "dies" the moment after the adoption looked at it: from then on b counts it dead.
    real = type(node_b).live_nodes
    dead: set[str] = set()

    def live(node: object) -> list[str]:
        return [n for n in real(node) if n not in dead]  # type: ignore[arg-type]

    monkeypatch.setattr(type(node_b), "live_nodes", live)
    original_running = ClusterSupervisor._running

    def running(self: ClusterSupervisor, child: object) -> object:
        try:
            return original_running(self, child)  # type: ignore[arg-type]
        finally:
            dead.add("t")

    monkeypatch.setattr(ClusterSupervisor, "_running", running)
    second = ClusterSupervisor.from_model(node_b, plan)
    reports: list[tuple[str, bool, str]] = []

    def child_exited(name: str, *, crashed: bool, reason: str = "", handle: object = None) -> None:
        reports.append((name, crashed, reason))  # the restart itself is the Supervisor's

    monkeypatch.setattr(second.supervisor, "child_exited", child_exited)
    second.adopt()
    assert second.adopted == ["e3"]  # found running on t, as the race has it
    assert reports == [("e3", True, "node t is down")]
    second.detach()
