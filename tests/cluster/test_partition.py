"""Partitions with real parts: node b's NATS connection goes through a loopback TCP proxy the
test stalls (the process and both sockets live on), so b is cut off but alive.

Fencing (see mighty.cluster._fence): b pauses its agents before the others may declare it dead;
the cluster gives b's name to a; when the link heals, b finds the name given away and stops its
agent. At every point checked, at most one node answers for the name.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from mighty import Component
from mighty.agents import AgentError, AgentType, MailboxSettings, NoProc, Runtime
from mighty.cluster import NatsServer, Node
from tests.cluster._proxy import Proxy
from tests.cluster.conftest import config


def _until(check: Callable[[], bool], what: str, seconds: float = 120.0) -> None:
    """Wait for ``check()`` (a bounded poll for an event, not a timing assertion)."""
    give_up = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < give_up, f"never: {what}"
        time.sleep(0.01)


def _watching(
    done: Callable[[], bool], check: Callable[[], None], what: str, seconds: float = 120.0
) -> None:
    """Run ``check()`` until ``done()`` (a bounded poll for an event, not a timing assertion)."""
    give_up = time.monotonic() + seconds
    while not done():
        check()
        assert time.monotonic() < give_up, f"never: {what}"
        time.sleep(0.01)


class _Cluster:
    def __init__(self, echo: Component, server: NatsServer) -> None:
        self.echo = echo
        self.server = server
        self.proxies: list[Proxy] = []
        self.made: list[tuple[Runtime, Node]] = []

    def node(
        self, name: str, *, proxied: bool = False, **extra: Any
    ) -> tuple[Runtime, Node, Proxy | None]:
        proxy = Proxy(self.server.port) if proxied else None
        if proxy is not None:
            self.proxies.append(proxy)
        runtime = Runtime(workers=1)
        runtime.register(AgentType("echo", self.echo, mailbox=MailboxSettings()))
        url = self.server.url if proxy is None else proxy.url
        node = Node(runtime, config(url, **extra), name=name)
        self.made.append((runtime, node))
        node.start()
        return runtime, node, proxy

    def close(self) -> None:
        for proxy in self.proxies:
            proxy.resume()
        for runtime, node in reversed(self.made):
            runtime.shutdown(drain=False, timeout=2)
            node.close()
        for proxy in self.proxies:
            proxy.close()


@pytest.fixture
def cluster(echo: Component, nats_server: NatsServer) -> Iterator[_Cluster]:
    made = _Cluster(echo, nats_server)
    yield made
    made.close()


def _answering(runtime: Runtime, name: str) -> bool:
    """An agent of ``runtime`` holds ``name`` and could be handed a message now (its mailbox is
    not held back: not paused, not under a fenced or stale lease)."""
    address = runtime.whereis(name)
    if address is None:
        return False
    try:
        return not runtime.process(address).mailbox.held
    except NoProc:
        return False


def test_a_cut_off_node_is_fenced_and_yields_the_name_on_return(cluster: _Cluster) -> None:
    """b cut off: b pauses its agent before a declares it dead; a takes the name; healed, b
    stops its agent; never two answering owners of the name."""
    runtime_a, node_a, _ = cluster.node("a")
    runtime_b, node_b, proxy = cluster.node("b", proxied=True)
    assert proxy is not None
    _until(lambda: {"a", "b"} <= set(node_a.live_nodes()), "a hears b")
    _until(lambda: {"a", "b"} <= set(node_b.live_nodes()), "b hears a")
    old = runtime_b.spawn("echo", name="ledger")
    _until(lambda: node_a.whereis("ledger") == f"b:{old}", "a sees b's name")
    assert runtime_a.ask("ledger", "x", "to b") == "to b"

    deaths: dict[str, float] = {}
    lock = threading.Lock()

    def heard(node: str, alive: bool) -> None:
        if not alive:
            with lock:
                deaths.setdefault(node, time.monotonic())

    node_a.on_membership(heard)
    owners = [runtime_a, runtime_b]

    def single_owner() -> None:
        assert sum(_answering(r, "ledger") for r in owners) <= 1

    proxy.pause()
    _watching(
        lambda: "b" in deaths,
        single_owner,
        "until a declares b dead, checking on the way",
    )
    # b's lease had gone stale (its agents held) before a could declare it dead; b's watcher
    # fences it (pauses the mailboxes) when it runs, which a loaded machine may delay.
    assert node_b.fence.renewed + node_b.fence.after <= deaths["b"]
    _until(lambda: node_b.fence.fenced, "b's watcher fences b")
    assert runtime_b.process(old).mailbox.paused
    with pytest.raises(AgentError) as cut_off:
        runtime_b.ask(old, "x", "are you there", timeout=0.3)
    assert cut_off.value.code == "timeout"

    new = runtime_a.spawn("echo", name="ledger")  # the cluster gives the name to a
    assert node_a.whereis("ledger") == f"a:{new}"
    single_owner()
    assert runtime_a.ask("ledger", "x", "to a") == "to a"

    proxy.resume()
    _watching(
        lambda: not node_b.fence.fenced and "ledger" in node_b.fence.yielded,
        single_owner,
        "not node_b.fence.fenced and 'ledger' in node_b.fence.yielded",
    )
    single_owner()
    assert runtime_b.whereis("ledger") is None
    with pytest.raises(NoProc):
        runtime_b.process(old)
    _until(lambda: node_b.whereis("ledger") == f"a:{new}", "b learns the new owner")
    assert runtime_b.ask("ledger", "x", "from b") == "from b"  # answered by a
    assert node_b.fence.fences == 1


def test_a_short_stall_pauses_and_resumes_without_yielding(cluster: _Cluster) -> None:
    """Cut off past fence_after but healed before anyone takes the name: b's agent resumes,
    with the message that waited in its mailbox; an agent started while fenced is held from its
    start, and answers after."""
    _, node_a, _ = cluster.node("a")
    runtime_b, node_b, proxy = cluster.node("b", proxied=True)
    assert proxy is not None
    _until(lambda: {"a", "b"} <= set(node_b.live_nodes()), "b hears a")
    old = runtime_b.spawn("echo", name="keeper")
    proxy.pause()
    _until(lambda: node_b.fence.fenced, "b fences")
    started = runtime_b.spawn("echo")  # started while fenced: held from its start
    assert runtime_b.process(started).mailbox.held
    answers: list[object] = []
    asker = threading.Thread(target=lambda: answers.append(runtime_b.ask(old, "x", "held")))
    asker.start()
    proxy.resume()
    _until(lambda: not node_b.fence.fenced, "b renews its lease")
    asker.join(60)
    assert answers == ["held"]
    assert runtime_b.ask(started, "x", "resumed") == "resumed"
    assert node_b.fence.yielded == []
    assert runtime_b.whereis("keeper") == old
    assert node_a.whereis("keeper") in (f"b:{old}", None)


def test_a_name_yielded_twice_stays_paused_until_its_agent_stops(cluster: _Cluster) -> None:
    """While b is cut off, its watcher yields a name twice (deleted, then given away) and the
    first stop waits for the agent's message to end: b's return does not resume the agent
    meanwhile (CI once sampled it answering beside the new owner); it stops when the message
    ends."""
    from mighty.agents import AgentChild, SupervisorSpec, start_tree

    runtime_b, node_b, proxy = cluster.node("b", proxied=True)
    assert proxy is not None
    # Supervised, as the partition ledger's agents are: a stopping child stays reachable
    # (its supervisor hears of its exit), so a resume would reach it.
    spec = SupervisorSpec("keeper", [AgentChild("ledger", "echo", restart="temporary")])
    supervisor = start_tree(runtime_b, spec)
    old = runtime_b.whereis("ledger")
    assert old is not None
    _until(lambda: node_b.whereis("ledger") == f"b:{old}", "b claims the name")
    process = runtime_b.process(old)
    proxy.pause()
    _until(lambda: node_b.fence.fenced, "b fences")
    turn = process.turn_lock
    assert turn.acquire(timeout=60)  # a message in progress: stopping the agent waits for it
    try:
        node_b.fence.taken("ledger", None)  # what the watcher does on a delete
        node_b.fence.taken("ledger", "t:echo:9")  # and on another node's claim
        proxy.resume()
        _watching(
            lambda: not node_b.fence.fenced,
            lambda: _assert(process.mailbox.paused, "resumed while being yielded"),
            "b renews its lease",
        )
        assert process.mailbox.paused
        assert runtime_b.whereis("ledger") == old
    finally:
        turn.release()
    _until(lambda: runtime_b.whereis("ledger") is None, "b's copy stops")
    assert node_b.fence.yielded == ["ledger"]
    with pytest.raises(NoProc):
        runtime_b.process(old)
    supervisor.stop()


def _assert(condition: bool, what: str) -> None:
    assert condition, what


def test_fence_after_lies_between_heartbeat_and_dead_after() -> None:
    """fence_after defaults to half of dead_after; one outside (heartbeat, dead_after) is refused."""
    from mighty._errors import BadInput
    from mighty.cluster import parse_cluster

    base = {"servers": ["nats://127.0.0.1:4222"], "peers": {"a": {}}, "heartbeat": 0.2}
    assert parse_cluster(base | {"dead_after": 1.0, "fence_after": 0.6}).fence_after == 0.6
    for bad in (1.0, 2.0, 0.2, 0.1):
        with pytest.raises(BadInput, match="fence_after"):
            parse_cluster(base | {"dead_after": 1.0, "fence_after": bad})
    with pytest.raises(BadInput, match="twice the heartbeat"):
        parse_cluster(base | {"dead_after": 0.4})


def test_the_cluster_supervisor_restarts_a_cut_off_child_and_the_old_one_yields(
    cluster: _Cluster,
) -> None:
    """The supervisor on a places "ledger" on b; b is cut off: a restarts it elsewhere while
    b's copy is paused; healed, b stops its copy (and its one-child supervisor does not
    restart it). At most one node answers for "ledger" at every point checked."""
    from mighty.cluster import ClusterSupervisor, ClusterSupervisorModel

    plan = ClusterSupervisorModel.model_validate(
        {"node": "a", "children": [{"name": "ledger", "type": "echo", "node": "b"}]}
    )
    runtime_a, node_a, _ = cluster.node("a")
    runtime_b, node_b, proxy = cluster.node("b", proxied=True)
    runtime_t, _, _ = cluster.node("t")
    assert proxy is not None
    assert node_a.wait_for(["b", "t"], 60) and node_b.wait_for(["a", "t"], 60)
    supervisor = ClusterSupervisor.from_model(node_a, plan).start()
    try:
        old = supervisor.where()["ledger"]
        assert old.startswith("b:")
        owners = [runtime_a, runtime_b, runtime_t]

        def single_owner() -> None:
            assert sum(_answering(r, "ledger") for r in owners) <= 1

        proxy.pause()
        _watching(
            lambda: supervisor.where().get("ledger", old) != old,
            single_owner,
            "a restarts ledger away from b",
        )
        _until(lambda: any(_answering(r, "ledger") for r in (runtime_a, runtime_t)), "restart")
        new = supervisor.where()["ledger"]
        assert not new.startswith("b:")
        assert node_b.fence.fenced
        single_owner()
        proxy.resume()
        _watching(
            lambda: not node_b.fence.fenced and "ledger" in node_b.fence.yielded,
            single_owner,
            "not node_b.fence.fenced and 'ledger' in node_b.fence.yielded",
        )
        single_owner()
        assert runtime_b.whereis("ledger") is None
        _until(lambda: node_b.whereis("ledger") == new, "b learns the new owner")
        assert runtime_b.ask("ledger", "x", "from b", timeout=30) == "from b"
        assert supervisor.where()["ledger"] == new
        assert runtime_b.whereis("ledger") is None  # its supervisor did not restart it
    finally:
        supervisor.stop()


def test_the_supervisor_s_node_cut_off_loses_the_lease_and_its_children(
    cluster: _Cluster,
) -> None:
    """The supervisor's node a is cut off: a fences and lets the lease go, b takes the lease
    over and restarts a's child elsewhere; healed, a yields the child and stands by."""
    from mighty.cluster import ClusterSupervisorModel, SupervisorLease

    plan = ClusterSupervisorModel.model_validate(
        {"node": "a", "children": [{"name": "led", "type": "echo", "node": "a"}]}
    )
    runtime_a, node_a, proxy = cluster.node("a", proxied=True)
    runtime_b, node_b, _ = cluster.node("b")
    runtime_t, _, _ = cluster.node("t")
    assert proxy is not None
    assert node_a.wait_for(["b", "t"], 60) and node_b.wait_for(["a", "t"], 60)
    holder = SupervisorLease(node_a, plan).start()
    standby = SupervisorLease(node_b, plan).start()
    owners = [runtime_a, runtime_b, runtime_t]

    def single_owner() -> None:
        assert sum(_answering(r, "led") for r in owners) <= 1

    try:
        assert holder.held and not standby.held
        assert runtime_a.whereis("led") is not None
        proxy.pause()
        _watching(
            lambda: standby.held and any(_answering(r, "led") for r in owners[1:]),
            single_owner,
            "standby.held and any(_answering(r, 'led') for r in owners[1:",
        )
        assert node_a.fence.fenced
        proxy.resume()
        _watching(
            lambda: not node_a.fence.fenced and "led" in node_a.fence.yielded,
            single_owner,
            "not node_a.fence.fenced and 'led' in node_a.fence.yielded",
        )
        single_owner()
        assert runtime_a.whereis("led") is None
        assert standby.held
        _until(lambda: not holder.held, "a stands by")
        assert runtime_a.ask("led", "x", "from a", timeout=30) == "from a"
    finally:
        standby.stop()
        holder.stop()


def test_a_takeover_that_comes_after_the_return_leaves_the_name_to_its_owner(
    cluster: _Cluster,
) -> None:
    """The race of the single check on return, made certain: a declares b dead while b is cut
    off, but a's supervisor acts only after b is back, unfenced and its agent resumed. b
    claimed the name again on its return (a new revision), so a's delete by the revision it
    saw at the death fails: the child stays on b, nothing restarts it, one copy throughout."""
    from mighty.cluster import ClusterChild, ClusterSupervisor

    runtime_a, node_a, _ = cluster.node("a")
    runtime_b, node_b, proxy = cluster.node("b", proxied=True)
    runtime_t, _, _ = cluster.node("t")
    assert proxy is not None
    assert node_a.wait_for(["b", "t"], 60) and node_b.wait_for(["a", "t"], 60)
    owners = [runtime_a, runtime_b, runtime_t]

    def single_owner() -> None:
        assert sum(_answering(r, "ledger") for r in owners) <= 1

    declared, gate, after = threading.Event(), threading.Event(), threading.Event()

    def late(node: str, alive: bool) -> None:  # heard before the supervisor's listener
        if node == "b" and not alive:
            declared.set()
            assert gate.wait(120), "the test never opened the gate"

    node_a.on_membership(late)
    supervisor = ClusterSupervisor(node_a, [ClusterChild("ledger", "echo", node="b")]).start()
    node_a.on_membership(lambda node, alive: after.set() if not alive else None)  # heard last
    try:
        old = supervisor.where()["ledger"]
        assert old.startswith("b:")
        proxy.pause()
        _watching(declared.is_set, single_owner, "a declares b dead")
        assert node_b.fence.fenced
        proxy.resume()
        _watching(
            lambda: not node_b.fence.fenced and _answering(runtime_b, "ledger"),
            single_owner,
            "b back, unfenced, its copy resumed",
        )
        _watching(lambda: "b" in node_a.live_nodes(), single_owner, "a hears b again")
        assert node_b.fence.yielded == []
        gate.set()  # now a's supervisor hears of b's death
        _watching(after.is_set, single_owner, "a's listeners are done with b's death")
        single_owner()
        assert _answering(runtime_b, "ledger")
        assert supervisor.where()["ledger"] == old
        assert not [e for e in supervisor.events if e.kind == "child_stopped"]
        assert runtime_a.ask("ledger", "x", "still b", timeout=30) == "still b"
        assert node_b.fence.yielded == []
    finally:
        gate.set()
        supervisor.stop()


def test_a_name_deleted_or_given_away_later_is_yielded_at_once(
    cluster: _Cluster, nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Whatever gives a claimed name away after every check (here a peer deletes b's entry and
    claims it, as a late takeover would), b's names watcher sees a newer revision that is not
    its own and yields: its copy stops, with no partition at all. A migration's handover does
    not."""
    import asyncio
    import logging

    import nats

    slow = 60.0  # dead_after: no partition here, nobody fences, even on a loaded machine
    runtime_a, node_a, _ = cluster.node("a", dead_after=slow)
    runtime_b, node_b, _ = cluster.node("b", dead_after=slow)
    runtime_t, node_t, _ = cluster.node("t", dead_after=slow)
    caplog.set_level(logging.WARNING, logger="mighty.cluster")
    assert node_b.wait_for(["a", "t"], 60)
    old = runtime_b.spawn("echo", name="ledger")
    _until(lambda: node_t.whereis("ledger") == f"b:{old}", "t sees b's name")

    async def delete() -> None:
        nc = await nats.connect(nats_server.url)
        try:
            kv = await nc.jetstream().key_value("mighty_names")
            await kv.delete("ledger")
        finally:
            await nc.close()

    asyncio.run(delete())
    _until(lambda: node_t.whereis("ledger") is None, "t sees the name gone")
    new = runtime_t.spawn("echo", name="ledger")
    _until(lambda: node_b.fence.yielded == ["ledger"], "b yields the name")
    _until(lambda: runtime_b.whereis("ledger") is None, "b's copy stops")
    with pytest.raises(NoProc):
        runtime_b.process(old)
    assert "'ledger' was deleted after this node claimed it: yielding it" in caplog.text
    _until(lambda: node_a.whereis("ledger") == f"t:{new}", "a sees t's claim")
    assert runtime_a.ask("ledger", "x", "to t") == "to t"
    # A migration hands the name over: neither side yields it.
    moved = node_t.migrate("ledger", "a").new_address
    assert moved.startswith("a:")
    assert runtime_a.ask("ledger", "x", "to a") == "to a"
    assert node_t.fence.yielded == [] and node_a.fence.yielded == []


def _moved_child_round(counter: Component, server: NatsServer) -> None:
    """One round of the test below, on nodes of its own."""
    from mighty.agents import AgentChild, SupervisorSpec, start_tree
    from mighty.budget import Budget

    proxy = Proxy(server.port)
    made: list[tuple[Runtime, Node]] = []
    try:
        for name, url in (("a", server.url), ("b", proxy.url)):
            runtime = Runtime(workers=1)
            runtime.register(AgentType("counter", counter, budget=Budget(fuel=400_000_000)))
            made.append((runtime, Node(runtime, config(url), name=name).start()))
        (runtime_a, node_a), (runtime_b, node_b) = made
        assert node_a.wait_for(["b"], 60) and node_b.wait_for(["a"], 60)
        spec = SupervisorSpec("root", [AgentChild("ctr", "counter")], intensity=50)
        root = node_a.adopt(start_tree(runtime_a, spec))
        node_a.migrate("ctr", "b")
        declared = threading.Event()
        node_a.on_membership(lambda node, alive: declared.set() if not alive else None)

        def single_owner() -> None:
            assert sum(_answering(r, "ctr") for r in (runtime_a, runtime_b)) <= 1

        def settled() -> bool:
            owner = node_a.whereis("ctr")
            if node_b.fence.fenced or owner is None or node_b.whereis("ctr") != owner:
                return False
            holder = runtime_a if owner.startswith("a:") else runtime_b
            local = owner.partition(":")[2]
            return holder.whereis("ctr") == local and _answering(holder, "ctr")

        proxy.pause()
        _watching(declared.is_set, single_owner, "a declares b dead")
        proxy.resume()
        _watching(settled, single_owner, "one copy, where both nodes say")
        single_owner()
        assert root.state == "running"
    finally:
        for runtime, node in reversed(made):
            runtime.shutdown(drain=False, timeout=2)
            node.close()
        proxy.close()


@pytest.mark.slow
def test_a_moved_child_restarted_at_home_while_its_node_heals(
    counter: Component, nats_server: NatsServer
) -> None:
    """A child of a's tree moved to b; b cut off until a declares it dead (a restarts it at
    home), healed at once: each round, at most one copy answers at every point checked, and it
    ends with one copy, where both nodes' names say, under a running supervisor. (The race once
    seen here is made certain by the test with the gated listener above; these rounds did not
    reproduce it on the code before the fix, in 12 of them.)"""
    for _ in range(4):
        _moved_child_round(counter, nats_server)
