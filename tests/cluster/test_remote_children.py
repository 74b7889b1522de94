"""Remote children (supervised agents that migrated) whose home node dies or leaves are
adopted where they run, and move on again with their supervision."""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mighty import Component
from mighty.agents import (
    AgentChild,
    AgentError,
    AgentType,
    BadSpawn,
    Runtime,
    Supervisor,
    SupervisorSpec,
    start_tree,
)
from mighty.budget import Budget
from mighty.cluster import ClusterChild, ClusterError, ClusterSupervisor, NatsServer, Node
from mighty.control import request
from tests.cluster._proxy import Proxy
from tests.cluster.conftest import STEADY, Mty, config

pytestmark = pytest.mark.slow

_FUEL = 400_000_000
"""A message's fuel: "work" with n = 50,000,000 crashes the counter (out of fuel)."""

MANIFEST = """
[agents.counter]
component = "{component}"
fuel = {fuel}

[cluster]
servers = ["{url}"]
heartbeat = 0.2
dead_after = 1.0

[cluster.peers]
a = {{}}
b = {{}}
t = {{}}

[supervisor]
name = "root"
intensity = 5
period = 30.0
children = [ {{ name = "ctr", type = "counter", restart = "transient" }} ]
"""


def _until(check: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def _node(url: str, name: str, counter: Component, **extra: Any) -> tuple[Runtime, Node]:
    runtime = Runtime(workers=1)
    runtime.register(AgentType("counter", counter, budget=Budget(fuel=_FUEL)))
    return runtime, Node(runtime, config(url, **extra), name=name).start()


def _count(runtime: Runtime, to: str) -> int:
    try:
        return int(runtime.ask(to, "get", timeout=30)["count"])
    except AgentError:
        return -1


def _crash(runtime: Runtime, to: str) -> None:
    with pytest.raises(AgentError):
        runtime.ask(to, "work", {"n": 50_000_000}, timeout=60)


def _close(made: list[tuple[Runtime, Node]]) -> None:
    for runtime, node in reversed(made):
        runtime.shutdown(drain=False, timeout=2)
        node.close()


def _adoptive(node: Node, name: str) -> Supervisor | None:
    return next((s for s in node.supervision_trees() if s.name == name), None)


@pytest.fixture
def sockets() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="mty-rc-", dir="/tmp") as path:
        os.chmod(path, 0o700)
        yield Path(path)


@pytest.mark.parametrize("how", ["SIGKILL", "SIGINT"])
def test_a_remote_child_whose_home_node_goes_is_adopted_and_restarted_once(
    how: str, counter: Component, nats_server: NatsServer, sockets: Path, tmp_path: Path
) -> None:
    """`mty node a` supervises ctr (transient, 5 restarts in 30 s), moved to b; a SIGKILLed (or
    left on SIGINT): b adopts ctr with a's policy and state, restarts its crash once; a back
    with its tree takes ctr back (or, back without, is refused a second ctr)."""
    manifest = tmp_path / "a.toml"
    manifest.write_text(MANIFEST.format(component=counter.origin, fuel=_FUEL, url=nats_server.url))
    sock = str(sockets / "a.sock")
    home = Mty("node", str(manifest), "--name", "a", "-q", env={"RUNTIME_CONTROL_SOCK": sock})
    made: list[tuple[Runtime, Node]] = []
    try:
        home.wait_line("control socket at")
        made.append(_node(nats_server.url, "b", counter))
        b, node_b = made[0]
        assert node_b.wait_for(["a"], 60)
        moved = request(sock, "migrate", {"address": "ctr", "node": "b"}, timeout=120)["address"]
        local = node_b.localize(moved)
        assert b.ask("ctr", "incr", {"by": 5})["count"] == 5
        if how == "SIGKILL":
            home.kill()
        else:
            assert home.finish(signal.SIGINT) == 0, "".join(home.lines)
        _until(lambda: _adoptive(node_b, "b/ctr") is not None, "b did not adopt ctr")
        adoptive = _adoptive(node_b, "b/ctr")
        assert adoptive is not None
        assert (adoptive.intensity, adoptive.period) == (5, 30.0)  # a's policy, kept
        assert adoptive.which_children()[0].restart == "transient"
        assert b.whereis("ctr") == local
        assert _count(b, "ctr") == 5  # state and address unchanged

        _crash(b, "ctr")
        _until(lambda: _count(b, "ctr") == 0, "ctr not restarted on b")
        _until(lambda: adoptive.which_children()[0].restarts == 1, "b/ctr did not count it")
        assert b.ask("ctr", "incr", {"by": 2})["count"] == 2
        assert b.process(local).stats.restarts == 1  # restarted exactly once
        assert adoptive.which_children()[0].restarts == 1
        assert adoptive.state == "running"

        if how == "SIGKILL":
            # a comes back with its tree: ctr is handed back, live, and supervised by it again.
            home = _home(manifest, str(sockets / "a2.sock"))
            _until(lambda: (node_b.whereis("ctr") or "").startswith("a:"), "ctr not back on a")
            assert _adoptive(node_b, "b/ctr") is None
            assert b.whereis("ctr") is None  # one copy: on a
            assert _count(b, "ctr") == 2  # its state came along
            _crash(b, "ctr")
            _until(lambda: _count(b, "ctr") == 0, "ctr not restarted on a")
            assert (node_b.whereis("ctr") or "").startswith("a:")
        else:
            # Node a comes back without its tree: ctr stays on b, held there, supervised by b.
            runtime_a, node_a = _rejoin(nats_server.url, "a", counter)
            made.append((runtime_a, node_a))
            assert node_a.wait_for(["b"], 60)
            with pytest.raises(BadSpawn, match=f"already registered in the cluster, by {moved}"):
                runtime_a.spawn("counter", name="ctr")
            assert _count(runtime_a, "ctr") == 2  # reached on b, by name
            assert b.process(local).stats.restarts == 1
            assert _adoptive(node_b, "b/ctr") is adoptive
    finally:
        home.finish()
        _close(made)


def _home(manifest: Path, sock: str) -> Mty:
    """`mty node a` on ``manifest``, started again once its old key has expired."""
    deadline = time.monotonic() + 60
    while True:
        home = Mty("node", str(manifest), "--name", "a", "-q", env={"RUNTIME_CONTROL_SOCK": sock})
        try:
            home.wait_line("control socket at")
        except AssertionError:
            home.finish()
            if "is in use" not in "".join(home.lines) or time.monotonic() > deadline:
                raise
            time.sleep(0.1)
        else:
            return home


def _rejoin(url: str, name: str, counter: Component) -> tuple[Runtime, Node]:
    """Node ``name`` again, once its old key has expired (a killed node's is held a while)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return _node(url, name, counter)
        except ClusterError:
            assert time.monotonic() < deadline, f"node {name} could not join again"
            time.sleep(0.1)


def test_a_remote_child_moves_on_and_back_with_its_supervision(
    counter: Component, nats_server: NatsServer
) -> None:
    """ctr, a child of a's root, moves a -> b -> c under a stream of sends (each handled once);
    a crash on c is restarted on c and counted by root; back on a it is a local child again."""
    peers = ("a", "b", "c", "t")
    # No node dies here: a stall of the loaded machine must not fence them (STEADY).
    made = [_node(nats_server.url, n, counter, peers=peers, dead_after=STEADY) for n in peers]
    (a, node_a), (_b, node_b), (c, node_c), (t, node_t) = made
    try:
        assert all(node.wait_for(list(peers), 60) for _, node in made)
        root = node_a.adopt(
            start_tree(a, SupervisorSpec("root", [AgentChild("ctr", "counter")], intensity=5))
        )
        first = node_a.qualify(a.whereis("ctr") or "")
        acked = {"t-name": 0, "a-address": 0}
        stop = threading.Event()
        errors: list[BaseException] = []

        def stream(runtime: Runtime, to: str, key: str) -> None:
            try:
                while not stop.is_set():
                    runtime.send(to, "incr", {"by": 1}, timeout=30)
                    acked[key] += 1
            except BaseException as exc:  # noqa: BLE001 -- reported by the test
                errors.append(exc)

        threads = [
            threading.Thread(target=stream, args=(t, "ctr", "t-name")),
            threading.Thread(target=stream, args=(a, first, "a-address")),
        ]
        for thread in threads:
            thread.start()

        def more(n: int) -> None:
            base = dict(acked)
            _until(lambda: errors or min(acked[k] - base[k] for k in acked) >= n, "no sends")
            assert not errors, errors

        more(20)
        on_b = node_a.migrate("ctr", "b").new_address
        more(20)
        on_c = node_b.migrate(on_b, "c").new_address
        assert on_c.startswith("c:counter:")
        more(20)
        stop.set()
        for thread in threads:
            thread.join(60)
        assert not errors, errors
        assert c.drain(30)
        assert _count(t, "ctr") == sum(acked.values())  # every acknowledged send, once
        assert node_t.whereis("ctr") == on_c
        handle = {i.name: i.handle for i in root.which_children()}["ctr"]
        assert getattr(handle, "address", None) == on_c  # root follows it to c

        _crash(t, "ctr")
        _until(lambda: _count(t, "ctr") == 0, "ctr not restarted on c")
        assert node_t.whereis("ctr") == on_c
        _until(lambda: root.which_children()[0].restarts == 1, "root did not count it")
        assert t.ask("ctr", "incr", {"by": 3})["count"] == 3
        assert c.process(node_c.localize(on_c)).stats.restarts == 1  # once
        assert root.which_children()[0].restarts == 1

        # Back home: a local child of root again; its crash is restarted there.
        home = node_c.migrate(on_c, "a").new_address
        assert home.startswith("a:counter:")
        local = node_a.localize(home)
        assert {i.name: i.handle for i in root.which_children()}["ctr"] is a.process(local)
        assert _count(a, "ctr") == 3
        _crash(a, "ctr")
        _until(lambda: _count(a, "ctr") == 0, "ctr not restarted on a")
        assert a.whereis("ctr") == local
        _until(lambda: root.which_children()[0].restarts == 2, "root did not count it")
        assert root.state == "running"
    finally:
        _close(made)


def test_an_adopted_child_keeps_its_homes_intensity(
    counter: Component, nats_server: NatsServer
) -> None:
    """A child of a's root (intensity 1) moved to b, a gone: b restarts its first crash and,
    at the second within the period, gives up as root would have: the child is stopped."""
    made = [_node(nats_server.url, n, counter) for n in ("a", "b")]
    (a, node_a), (b, node_b) = made
    try:
        assert node_a.wait_for(["b"], 60) and node_b.wait_for(["a"], 60)
        spec = SupervisorSpec("root", [AgentChild("ctr", "counter")], intensity=1, period=600.0)
        node_a.adopt(start_tree(a, spec))
        local = node_b.localize(node_a.migrate("ctr", "b").new_address)
        a.shutdown(drain=False, timeout=2)
        node_a.close()  # leaves: b hears it at once
        _until(lambda: _adoptive(node_b, "b/ctr") is not None, "b did not adopt ctr")
        adoptive = _adoptive(node_b, "b/ctr")
        assert adoptive is not None

        _crash(b, "ctr")
        _until(lambda: _count(b, "ctr") == 0, "ctr not restarted on b")
        _crash(b, "ctr")
        _until(lambda: adoptive.state == "failed", "b/ctr did not give up")
        _until(lambda: b.whereis("ctr") is None, "ctr still registered on b")
        with pytest.raises(AgentError):
            b.ask(local, "get", timeout=5)
    finally:
        _close(made)


def test_a_cluster_child_moved_on_is_restarted_once_when_its_node_goes(
    counter: Component, nats_server: NatsServer
) -> None:
    """A cluster child moved a -> b -> c: its crash on c is restarted on c by a's one-child
    supervisor; c gone, only the cluster supervisor restarts it (a's lets go): one copy."""
    peers = ("a", "b", "c", "t")
    made = [_node(nats_server.url, n, counter, peers=peers) for n in peers]
    (a, node_a), (b, node_b), (c, node_c), (t, node_t) = made
    try:
        assert all(node.wait_for(list(peers), 60) for _, node in made)
        supervisor = ClusterSupervisor(node_t, [ClusterChild("ctr", "counter", node="a")]).start()
        one_child = _adoptive(node_a, "a/ctr")
        assert one_child is not None
        on_b = node_a.migrate("ctr", "b").new_address
        on_c = node_b.migrate(on_b, "c").new_address
        _until(lambda: node_t.whereis("ctr") == on_c, "the name did not follow to c")
        _crash(t, "ctr")
        _until(lambda: _count(t, "ctr") == 0, "ctr not restarted on c")
        _until(lambda: one_child.which_children()[0].restarts == 1, "a/ctr did not count it")
        assert node_t.whereis("ctr") == on_c

        c.shutdown(drain=False, timeout=2)
        node_c.close()
        _until(lambda: (node_t.whereis("ctr") or "c:").partition(":")[0] in "abt", "not moved")
        _until(lambda: _count(t, "ctr") == 0, "ctr not answering after c went")
        # The supervisor notes the restart once the child runs: it may answer just before.
        _until(
            lambda: any(e.kind == "child_restarted" for e in supervisor.events),
            "the cluster supervisor noted no restart",
        )
        restarts = [e for e in supervisor.events if e.kind == "child_restarted"]
        assert len(restarts) == 1, supervisor.events
        assert one_child not in node_a.supervision_trees()  # let go: not a second restart
        assert one_child.which_children()[0].restarts == 1
        assert sum(r.whereis("ctr") is not None for r in (a, b, t)) == 1
        assert supervisor.state == "running"
        supervisor.stop()
    finally:
        _close(made)


def test_a_home_only_cut_off_supervises_its_child_again_when_heard(
    counter: Component, nats_server: NatsServer
) -> None:
    """a (behind a stalled proxy) is declared dead by b, which adopts ctr; healed, a's root
    still holds ctr: b gives it back (no adoptive supervisor), and root restarts its crash."""
    proxy = Proxy(nats_server.port)
    made: list[tuple[Runtime, Node]] = []
    try:
        a = Runtime(workers=1)
        a.register(AgentType("counter", counter, budget=Budget(fuel=_FUEL)))
        node_a = Node(a, config(proxy.url), name="a").start()
        made.append((a, node_a))
        made.append(_node(nats_server.url, "b", counter))
        b, node_b = made[1]
        assert node_a.wait_for(["b"], 60) and node_b.wait_for(["a"], 60)
        root = node_a.adopt(
            start_tree(a, SupervisorSpec("root", [AgentChild("ctr", "counter")], intensity=5))
        )
        local = node_b.localize(node_a.migrate("ctr", "b").new_address)
        proxy.pause()
        _until(lambda: _adoptive(node_b, "b/ctr") is not None, "b did not adopt ctr")
        proxy.resume()
        _until(lambda: _adoptive(node_b, "b/ctr") is None, "b did not give ctr back")
        assert not node_b.orphans

        _crash(b, "ctr")
        _until(lambda: _count(b, "ctr") == 0, "ctr not restarted on b")
        _until(lambda: root.which_children()[0].restarts == 1, "root did not count it")
        assert b.process(local).stats.restarts == 1
        assert b.whereis("ctr") == local
    finally:
        _close(made)
        proxy.close()


def test_an_adopted_child_moved_on_is_handed_back_to_its_first_home(
    counter: Component, nats_server: NatsServer
) -> None:
    """ctr of a's root moved to b; a leaves, b adopts it, moves it on to c; a back with its tree
    (Node.start_tree) gets it from c, state kept, b's supervisor lets go; root restarts it."""
    peers = ("a", "b", "c", "t")
    made = [_node(nats_server.url, n, counter, peers=peers) for n in ("a", "b", "c")]
    (a, node_a), (b, node_b), (c, node_c) = made
    try:
        assert all(node.wait_for(["a", "b", "c"], 60) for _, node in made)
        spec = SupervisorSpec("root", [AgentChild("ctr", "counter")], intensity=5)
        node_a.start_tree(spec)
        on_b = node_a.migrate("ctr", "b").new_address
        assert b.ask("ctr", "incr", {"by": 6})["count"] == 6
        a.shutdown(drain=False, timeout=2)
        node_a.close()
        _until(lambda: _adoptive(node_b, "b/ctr") is not None, "b did not adopt ctr")
        on_c = node_b.migrate(on_b, "c").new_address
        assert c.ask("ctr", "incr", {"by": 1})["count"] == 7

        made.append(_node(nats_server.url, "a", counter, peers=peers))
        a, node_a = made[-1]
        root = node_a.start_tree(spec)
        home = node_a.qualify(a.whereis("ctr") or "")
        assert {i.name: i.handle for i in root.which_children()}["ctr"] is a.process(
            node_a.localize(home)
        )
        assert _count(a, "ctr") == 7  # its state came along
        _until(lambda: node_c.whereis("ctr") == home, "c does not see ctr at home")
        assert c.whereis("ctr") is None and b.whereis("ctr") is None  # one copy
        assert _adoptive(node_b, "b/ctr") is None
        assert not node_b.relocated and not node_b.orphans
        assert on_c.startswith("c:")
        _crash(a, "ctr")
        _until(lambda: _count(a, "ctr") == 0, "ctr not restarted at home")
        _until(lambda: root.which_children()[0].restarts == 1, "root did not count it")
    finally:
        _close(made)
