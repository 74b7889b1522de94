"""A supervised agent migrates with its child spec: a remote child of its home supervisor,
restarted on its new node after a crash there, and at home when that node dies."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from mighty import Component
from mighty.agents import (
    AgentChild,
    AgentError,
    AgentType,
    Runtime,
    Supervisor,
    SupervisorSpec,
    start_tree,
)
from mighty.budget import Budget
from mighty.cluster import ClusterChild, ClusterSupervisor, MigrationFailed, NatsServer, Node
from tests.cluster.conftest import config

pytestmark = pytest.mark.slow


def _until(check: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def _node(url: str, name: str, counter: Component) -> tuple[Runtime, Node]:
    runtime = Runtime(workers=1)
    # A message gets little fuel: a long "work" crashes the agent (out of fuel).
    runtime.register(AgentType("counter", counter, budget=Budget(fuel=400_000_000)))
    return runtime, Node(runtime, config(url), name=name).start()


def _stopped(runtime: Runtime, address: str) -> bool:
    try:
        return not runtime.process(address).alive
    except AgentError:
        return True


def _moved_child(counter: Component, url: str, made: list[tuple[Runtime, Node]]) -> str:
    """Nodes a and b (appended to ``made``, which the caller closes), and the address on b of
    "ctr", a child of a's supervisor moved to b."""
    made.extend(_node(url, n, counter) for n in ("a", "b"))
    (a, node_a), (_, node_b) = made
    assert node_a.wait_for(["b"], 60) and node_b.wait_for(["a"], 60)
    root = start_tree(a, SupervisorSpec("root", [AgentChild("ctr", "counter")], intensity=5))
    node_a.adopt(root)
    return node_b.localize(node_a.migrate("ctr", "b").new_address)


def _adoptive(node: Node) -> Supervisor | None:
    return next((s for s in node.supervision_trees() if s.name == f"{node.name}/ctr"), None)


def _count(runtime: Runtime, to: str) -> int:
    try:
        return int(runtime.ask(to, "get", timeout=30)["count"])
    except AgentError:
        return -1


def test_a_supervised_agent_moves_with_its_child_spec(
    counter: Component, nats_server: NatsServer
) -> None:
    made = [_node(nats_server.url, n, counter) for n in ("a", "b")]
    (a, node_a), (b, node_b) = made
    try:
        assert node_a.wait_for(["b"], 60) and node_b.wait_for(["a"], 60)
        spec = SupervisorSpec(
            "root", [AgentChild("ctr", "counter"), AgentChild("other", "counter")], intensity=5
        )
        # Not adopted: the node cannot hand the child spec on, so it refuses to move it.
        root = start_tree(a, spec)
        with pytest.raises(MigrationFailed, match=r"Node\.adopt"):
            node_a.migrate("ctr", "b")
        node_a.adopt(root)
        a.ask("ctr", "incr", {"by": 5})
        a.ask("other", "incr", {"by": 1})
        report = node_a.migrate("ctr", "b")
        moved = report.new_address
        assert moved.startswith("b:counter:")
        assert _count(a, "ctr") == 5  # the state moved, the name follows
        handle = {c.name: c.handle for c in root.which_children()}["ctr"]
        assert getattr(handle, "address", None) == moved  # a remote child of root now

        # A crash on node b: root (on a) restarts it there: same address, init again.
        with pytest.raises(AgentError):
            a.ask("ctr", "work", {"n": 50_000_000}, timeout=60)
        _until(lambda: _count(a, "ctr") == 0, "ctr not restarted on b")
        assert node_a.whereis("ctr") == moved
        assert b.process(node_b.localize(moved)).stats.restarts == 1
        a.ask("ctr", "incr", {"by": 2})
        assert _count(a, "other") == 1  # one_for_one: the sibling was left alone
        assert root.state == "running"

        # Node b dies: root restarts the child at home, on a.
        b.shutdown(drain=False, timeout=2)
        node_b.close()
        _until(lambda: (node_a.whereis("ctr") or "").startswith("a:"), "ctr not back on a")
        _until(lambda: _count(a, "ctr") == 0, "ctr not answering on a")
        local = a.whereis("ctr")
        assert local is not None and a.process(local).on_exit is not None  # supervised again
        assert _count(a, "other") == 1
        assert root.state == "running"
    finally:
        for runtime, node in reversed(made):
            runtime.shutdown(drain=False, timeout=2)
            node.close()


def test_a_cluster_supervisors_child_migrates_and_its_nodes_die(
    counter: Component, nats_server: NatsServer
) -> None:
    """A cluster child moved a -> b: restarted on b after a crash there, adopted by b when a
    goes (its next crash restarted on b), restarted on t by the cluster supervisor when b dies."""
    made = [_node(nats_server.url, n, counter) for n in ("a", "b", "t")]
    (a, node_a), (b, node_b), (t, node_t) = made
    try:
        assert all(n.wait_for(["a", "b", "t"], 60) for _, n in made)
        # The cluster supervisor runs on t; its child runs on a, under a's one-child supervisor.
        supervisor = ClusterSupervisor(node_t, [ClusterChild("ctr", "counter", node="a")]).start()
        assert (node_t.whereis("ctr") or "").startswith("a:")
        t.ask("ctr", "incr", {"by": 4})
        moved = node_a.migrate("ctr", "b").new_address
        _until(lambda: node_t.whereis("ctr") == moved, "the name did not follow")
        # A crash on b: a's supervisor restarts it on b.
        with pytest.raises(AgentError):
            t.ask("ctr", "work", {"n": 50_000_000}, timeout=60)
        _until(lambda: _count(t, "ctr") == 0, "ctr not restarted on b")
        t.ask("ctr", "incr", {"by": 3})
        # Node a (where it was first) goes: the child lives on b, so nothing restarts it. A
        # listener added after the supervisor's hears a's departure once the supervisor's has
        # (one event's listeners run in order): by then a restart would have been decided.
        gone = threading.Event()
        node_t.on_membership(lambda node, alive: gone.set() if node == "a" and not alive else None)
        a.shutdown(drain=False, timeout=2)
        node_a.close()
        assert gone.wait(60), "a not seen gone"
        assert "a" not in node_t.live_nodes()
        assert not [e for e in supervisor.events if e.kind == "child_stopped"]
        assert node_t.whereis("ctr") == moved
        assert _count(t, "ctr") == 3
        # a was its home: b adopts it under a one-child supervisor, which restarts its next
        # crash on b (once); the cluster supervisor still follows it by name.
        _until(lambda: _adoptive(node_b) is not None, "b did not adopt ctr")
        with pytest.raises(AgentError):
            t.ask("ctr", "work", {"n": 50_000_000}, timeout=60)
        _until(lambda: _count(t, "ctr") == 0, "ctr not restarted on b after a went")
        adoptive = _adoptive(node_b)
        assert adoptive is not None
        _until(lambda: adoptive.which_children()[0].restarts == 1, "b/ctr did not count it")
        assert b.process(node_b.localize(moved)).stats.restarts == 2
        assert node_t.whereis("ctr") == moved
        assert not [e for e in supervisor.events if e.kind == "child_stopped"]
        # Node b dies: the cluster supervisor restarts the child on the node left (t).
        b.shutdown(drain=False, timeout=2)
        node_b.close()
        _until(lambda: (node_t.whereis("ctr") or "").startswith("t:"), "ctr not placed on t")
        _until(lambda: _count(t, "ctr") == 0, "ctr not answering on t")
        assert supervisor.state == "running"
        supervisor.stop()
    finally:
        for runtime, node in reversed(made):
            runtime.shutdown(drain=False, timeout=2)
            node.close()


def test_a_moved_child_is_stopped_where_it_lives(
    counter: Component, nats_server: NatsServer
) -> None:
    """The cluster supervisor stops a child that migrated on the node it moved to, also when
    the node it started on is dead (the handle follows the child's name, not its first
    address)."""
    made = [_node(nats_server.url, n, counter) for n in ("a", "b", "t")]
    (a, node_a), (_b, _node_b), (t, node_t) = made
    try:
        assert all(n.wait_for(["a", "b", "t"], 60) for _, n in made)
        supervisor = ClusterSupervisor(node_t, [ClusterChild("ctr", "counter", node="a")]).start()
        moved = node_a.migrate("ctr", "b").new_address
        _until(lambda: node_t.whereis("ctr") == moved, "the name did not follow")
        a.shutdown(drain=False, timeout=2)
        node_a.close()
        _until(lambda: "a" not in node_t.live_nodes(), "a not seen dead")
        supervisor.stop()
        _until(lambda: node_t.whereis("ctr") is None, "the moved child still runs on b")
        with pytest.raises(AgentError):
            t.ask(moved, "get", timeout=5)
    finally:
        for runtime, node in reversed(made):
            runtime.shutdown(drain=False, timeout=2)
            node.close()


def test_a_moved_childs_crash_report_that_cannot_reach_home_settles_its_queue(
    counter: Component, nats_server: NatsServer
) -> None:
    """The migrated child crashes while NATS is gone: its report to the home supervisor fails
    (no reply within the op timeout), nothing escapes the reporting thread (pytest's
    unhandled-thread-exception warning is an error here), the child is stopped on its node, not
    left half alive, and both nodes leave without an error although the server is gone."""
    made: list[tuple[Runtime, Node]] = []
    try:
        local = _moved_child(counter, nats_server.url, made)
        b = made[1][0]
        assert b.ask(local, "incr", {"by": 1}, timeout=10) is not None
        nats_server.stop()
        with pytest.raises(AgentError):
            b.ask(local, "work", {"n": 50_000_000}, timeout=60)

        _until(lambda: _stopped(b, local), "the crashed child was left running on b")
        with pytest.raises(AgentError):
            b.ask(local, "get", timeout=5)
    finally:
        for runtime, node in reversed(made):
            runtime.shutdown(drain=False, timeout=2)
            node.close()


def test_a_moved_childs_crash_report_from_a_node_that_left_settles_its_queue(
    counter: Component, nats_server: NatsServer
) -> None:
    """The migrated child's node has left the cluster (its runtime still runs): the crash
    report cannot be sent at all (ClusterError); it must not escape the reporting thread, and
    the child is stopped."""
    made: list[tuple[Runtime, Node]] = []
    try:
        local = _moved_child(counter, nats_server.url, made)
        b, node_b = made[1]
        node_b.close()
        with pytest.raises(AgentError):
            b.ask(local, "work", {"n": 50_000_000}, timeout=60)

        _until(lambda: _stopped(b, local), "the crashed child was left running on b")
    finally:
        for runtime, node in reversed(made):
            runtime.shutdown(drain=False, timeout=2)
            node.close()
