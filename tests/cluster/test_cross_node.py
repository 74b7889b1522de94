"""send/ask between two runtimes joined through a real nats-server: same answers, same errors."""

from __future__ import annotations

import logging
import time

import cbor2
import nats
import pytest

from mighty._errors import BadInput
from mighty.agents import (
    AskTimeout,
    BadSpawn,
    CircuitBreaker,
    CircuitOpenError,
    MailboxFullError,
    MailboxSettings,
    NoProc,
    Refused,
    Runtime,
)
from mighty.cluster import VERSION, ClusterError, NatsServer, Node, decode
from tests.cluster.conftest import LONG, STEADY, Nodes, config, until


@pytest.fixture(autouse=True)
def _steady(nodes: Nodes) -> None:
    """No node dies in these tests: a stall of the loaded machine must not fence one."""
    nodes.defaults["dead_after"] = STEADY


def test_ask_and_send_cross_nodes(nodes: Nodes) -> None:
    a, _ = nodes("a")
    b, node_b = nodes("b")
    address = b.spawn("echo")
    assert a.ask(f"b:{address}", "x", {"n": 1}) == {"n": 1}
    a.send(f"b:{address}", "x", 2)
    assert b.drain(5)
    assert b.process(address).stats.handled == 2
    # The local form still works on its own node, and a node's own prefix is local.
    assert b.ask(address, "x", 3) == 3
    assert b.ask(f"b:{address}", "x", 4) == 4
    assert node_b.stats.received == 2


def test_cluster_wide_names_and_their_clash(nodes: Nodes) -> None:
    a, node_a = nodes("a")
    b, _ = nodes("b")
    address = b.spawn("echo", name="ledger")
    assert node_a.whereis("ledger") == f"b:{address}"
    assert a.ask("ledger", "x", "via name") == "via name"
    with pytest.raises(BadSpawn, match="already registered in the cluster, by b:echo:1"):
        a.spawn("echo", name="ledger")
    # Stopped: the name is free again, and another node may take it.
    b.stop(address)
    until(lambda: node_a.whereis("ledger") is None, "a never saw the name released")
    mine = a.spawn("echo", name="ledger")
    assert node_a.whereis("ledger") == f"a:{mine}"


def test_remote_errors_are_the_local_ones(nodes: Nodes) -> None:
    a, _ = nodes("a", ask_timeout=LONG)  # a send's acknowledgement too
    b, _ = nodes("b", mailbox=MailboxSettings(capacity=1, on_full="fail"))
    # Deadlines long enough that a loaded machine answers within them (each answer comes at
    # once); the one ask meant to time out waits on a paused mailbox, which never answers.
    with pytest.raises(NoProc):
        a.ask("b:echo:99", "x", 1, timeout=LONG)
    with pytest.raises(NoProc):
        a.send("b:echo:99", "x", 1)
    with pytest.raises(NoProc, match="no node 'zz'"):
        a.ask("zz:echo:1", "x", 1)
    strict = b.spawn("strict")
    with pytest.raises(Refused, match="does not accept 'x'"):
        a.ask(f"b:{strict}", "x", 1, timeout=LONG)
    full = b.spawn("echo")
    b.process(full).mailbox.pause()
    a.send(f"b:{full}", "x", 1)
    with pytest.raises(MailboxFullError):
        a.send(f"b:{full}", "x", 2)
    with pytest.raises(MailboxFullError):
        a.ask(f"b:{full}", "x", 2, timeout=LONG)
    stalled = b.spawn("echo")
    b.process(stalled).mailbox.pause()  # accepted, never handled: the asker's deadline ends it
    with pytest.raises(AskTimeout):  # whatever the deadline and the load: nothing answers
        a.ask(f"b:{stalled}", "x", 1, timeout=1.0)
    breaker = CircuitBreaker("root", failure_threshold=1, window=10, cooldown=60)
    breaker.record_failure()
    guarded = b.spawn("echo")
    b.set_breaker(guarded, breaker)
    with pytest.raises(CircuitOpenError):
        a.ask(f"b:{guarded}", "x", 1, timeout=LONG)
    with pytest.raises(CircuitOpenError):
        a.send(f"b:{guarded}", "x", 1)


def test_remote_block_policy_waits_for_space(nodes: Nodes) -> None:
    """An ask into a full block mailbox waits on the target node for space (not refused, not
    buffered) and is answered once there is room."""
    a, _ = nodes("a", ask_timeout=LONG)
    b, node_b = nodes("b", mailbox=MailboxSettings(capacity=1, on_full="block", block_timeout=LONG))
    target = b.spawn("echo")
    mailbox = b.process(target).mailbox
    mailbox.pause()
    a.send(f"b:{target}", "x", 1)
    future = a.ask_future(f"b:{target}", "x", 2)  # its deadline: 30 s
    until(lambda: node_b.waiting == 1, "the ask never waited for space on b")
    assert not future.done()  # waiting for space on the node, not refused, not buffered
    assert len(mailbox) == 1
    mailbox.resume()
    b.process(target)._wake()  # as a hot swap's resume does
    assert cbor2.loads(future.result(LONG)) == 2


def test_garbage_and_newer_frames_are_counted_drops(
    nodes: Nodes, nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    import asyncio

    _, node_b = nodes("b")
    b = node_b.runtime
    address = b.spawn("echo")

    async def poke() -> bytes:
        nc = await nats.connect(nats_server.url)
        await nc.publish("mighty.node.b.a", b"\xff\x00garbage")
        send = {"v": 1, "k": "send", "node": "intruder", "to": address}
        await nc.publish("mighty.node.b.intruder", cbor2.dumps(send))
        # A frame that says it is from another node than its subject does.
        await nc.publish("mighty.node.b.a", cbor2.dumps(send | {"node": "t"}))
        reply = await nc.request(
            "mighty.node.b.a", cbor2.dumps({"v": VERSION + 1, "k": "send"}), timeout=LONG
        )
        await nc.publish("mighty.hb.a", b"not a heartbeat")
        await nc.flush()
        await nc.close()
        return reply.data

    with caplog.at_level(logging.WARNING):
        answer = decode(asyncio.run(poke()))
    assert answer.k == "err" and "newer" in answer.msg
    until(lambda: sum(node_b.stats.dropped.values()) >= 5, "b never dropped all five")
    assert node_b.stats.dropped == {"garbage": 2, "peer": 1, "sender": 1, "version": 1}
    assert "dropped" in caplog.text
    assert b.process(address).stats.handled == 0  # the intruder's send was not delivered
    a, _ = nodes("a")
    assert a.ask(f"b:{address}", "x", "still fine") == "still fine"


def test_joining_refusals(nodes: Nodes, nats_server: NatsServer, echo: object) -> None:
    nodes("a")
    runtime = Runtime(workers=1)
    try:
        with pytest.raises(BadInput, match=r"not in \[cluster.peers\]"):
            Node(runtime, config(nats_server.url), name="stray")
        with pytest.raises(ClusterError, match="node name 'a' is in use"):
            Node(runtime, config(nats_server.url), name="a").start()
    finally:
        runtime.shutdown()


def test_nats_down_at_start_is_a_clear_error() -> None:
    runtime = Runtime(workers=1)
    try:
        with NatsServer() as server:
            url = server.url
        started = time.monotonic()
        with pytest.raises(ClusterError, match="no NATS server answered"):
            Node(runtime, config(url, connect_timeout=1.0), name="a").start()
        # A bound on hanging (the client's reconnect loop), not a speed: 1 s was asked for.
        assert time.monotonic() - started < LONG
    finally:
        runtime.shutdown()


def test_nats_restart_mid_run(echo: object, tmp_path: object) -> None:
    """Asks during the outage fail with AskTimeout (none hangs); after it they work again."""
    with NatsServer() as server:
        made = Nodes(echo, server.url)  # type: ignore[arg-type]
        try:
            a, _ = made("a")
            b, _ = made("b")
            target = f"b:{b.spawn('echo')}"
            assert a.ask(target, "x", 1) == 1
            server.stop()
            with pytest.raises((AskTimeout, NoProc)):  # the server is down: nothing answers
                a.ask(target, "x", 2, timeout=1.0)
            server.start()
            deadline = time.monotonic() + LONG
            while True:
                try:
                    assert a.ask(target, "x", 3, timeout=5) == 3
                    break
                except (AskTimeout, NoProc):
                    assert time.monotonic() < deadline, f"no reconnect within {LONG} s"
        finally:
            made.close()
