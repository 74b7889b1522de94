"""Impostors against a nats-server with per-node users (``server_authorization``): a client with
a peer's credentials cannot speak as another peer, a client without credentials cannot connect,
and the nodes themselves run under those permissions (JetStream buckets, asks, heartbeats).

A raw nats-py client plays the attacker; the server, the nodes and the permissions are real.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client

from mighty import Component
from mighty.agents import AgentType, Runtime
from mighty.cluster import (
    ClusterConfig,
    Frame,
    NatsServer,
    Node,
    encode,
    node_permissions,
    node_subject,
    parse_cluster,
    server_authorization,
)
from tests.cluster.conftest import STEADY

PASSWORDS = {"a": "pa-secret", "b": "pb-secret", "c": "pc-secret"}


def _config(port: int) -> ClusterConfig:
    return parse_cluster(
        {
            "servers": [f"nats://127.0.0.1:{port}"],
            "peers": {"a": {}, "b": {}, "c": {}},
            "heartbeat": 0.2,
            "dead_after": STEADY,  # no node dies here: a stall must not fence one
        }
    )


def _as(config: ClusterConfig, node: str) -> ClusterConfig:
    """``config`` with ``node``'s user and password in its server URL."""
    url = config.servers[0].replace("nats://", f"nats://{node}:{PASSWORDS[node]}@")
    return config.model_copy(update={"servers": [url]})


@pytest.fixture
def guarded(tmp_path: Path, echo: Component) -> Iterator[tuple[ClusterConfig, Node, Runtime]]:
    """A nats-server with one user per node; node b running under its own user."""
    server = NatsServer()
    config = _config(server.port)
    conf = tmp_path / "nats.conf"
    conf.write_text(server_authorization(config, PASSWORDS))
    server.config = conf
    with server:
        runtime = Runtime(workers=1)
        runtime.register(AgentType("echo", echo))
        node = Node(runtime, _as(config, "b"), name="b").start()
        try:
            yield config, node, runtime
        finally:
            runtime.shutdown(drain=False, timeout=2)
            node.close()


def _raw(url: str, script: object) -> list[str]:
    """Run ``script(nc)`` on a raw client at ``url``; the server's errors it was sent."""
    errors: list[str] = []

    async def go() -> None:
        async def on_error(exc: Exception) -> None:
            errors.append(str(exc))

        nc = await nats.connect(url, error_cb=on_error, allow_reconnect=False)
        try:
            await script(nc)  # type: ignore[operator]
        finally:
            await nc.close()

    asyncio.run(go())
    return errors


def test_permissions_pin_each_node_to_its_sender_subjects() -> None:
    """A node's user publishes on its own sender subjects only, and reads its own requests."""
    config = _config(4222)
    perms = node_permissions(config, "a")
    assert "mighty.node.*.a" in perms["publish"]["allow"]  # type: ignore[index]
    assert "mighty.hb.a" in perms["publish"]["allow"]  # type: ignore[index]
    assert not any(".b" in s for s in perms["publish"]["allow"])  # type: ignore[index]
    assert perms["subscribe"]["allow"][0] == "mighty.node.a.*"  # type: ignore[index]
    assert '"user": "c"' in server_authorization(config, PASSWORDS)


def test_nodes_run_under_their_own_users(
    guarded: tuple[ClusterConfig, Node, Runtime], echo: Component
) -> None:
    """Two nodes each under its own user: heartbeats, names and an ask across them."""
    config, node_b, runtime_b = guarded
    runtime_a = Runtime(workers=1)
    runtime_a.register(AgentType("echo", echo))
    node_a = Node(runtime_a, _as(config, "a"), name="a").start()
    try:
        address = runtime_b.spawn("echo", name="greeter")
        assert node_a.wait_for(["a", "b"], 60)
        assert runtime_a.ask(f"b:{address}", "x", "as a") == "as a"
        assert runtime_a.ask("greeter", "x", "by name") == "by name"
    finally:
        runtime_a.shutdown(drain=False, timeout=2)
        node_a.close()
    assert node_b.stats.dropped == {}


def test_a_peer_cannot_speak_as_another_peer(guarded: tuple[ClusterConfig, Node, Runtime]) -> None:
    """With c's credentials, a spawn frame on a's subject is refused by the server (b never sees
    it); the same frame on c's own subject spawns, and one saying it is from a is dropped."""
    config, node_b, runtime_b = guarded
    before = len(runtime_b.agents())
    impostor = encode(Frame("spawn", node="a", type="echo"))
    honest = encode(Frame("spawn", node="c", type="echo"))
    replies: list[bytes] = []

    async def script(nc: Client) -> None:
        await nc.publish(node_subject("mighty", "b", "a"), impostor)  # a's subject
        await nc.publish(node_subject("mighty", "b", "c"), impostor)  # c's subject, a's name
        # Then an honest request on the same connection: NATS keeps one publisher's order, so
        # once its reply is here, b has seen everything published before it.
        reply = await nc.request(node_subject("mighty", "b", "c"), honest, timeout=60)
        replies.append(reply.data)

    errors = _raw(_as(config, "c").servers[0], script)
    assert any("permissions violation" in e.lower() for e in errors), errors
    assert len(replies) == 1
    assert len(runtime_b.agents()) == before + 1  # only the honest spawn
    assert node_b.stats.received == 1
    assert node_b.stats.dropped == {"sender": 1}


def _connect_reply(port: int, user: str | None, password: str | None) -> bytes:
    """The server's answer to a NATS CONNECT (plain socket: the protocol's own words)."""
    connect: dict[str, object] = {"verbose": False, "pedantic": False}
    if user is not None:
        connect |= {"user": user, "pass": password}
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        reader = sock.makefile("rb")
        try:
            assert reader.readline().startswith(b"INFO ")
            sock.sendall(b"CONNECT " + json.dumps(connect).encode() + b"\r\nPING\r\n")
            return reader.readline()
        finally:
            reader.close()


def test_a_client_without_credentials_cannot_connect(
    guarded: tuple[ClusterConfig, Node, Runtime],
) -> None:
    """No user, or a wrong password: an authorization violation; a node's own: accepted."""
    config, _, _ = guarded
    port = int(config.servers[0].rsplit(":", 1)[1])
    assert b"Authorization Violation" in _connect_reply(port, None, None)
    assert b"Authorization Violation" in _connect_reply(port, "a", "guess")
    assert _connect_reply(port, "a", PASSWORDS["a"]) == b"PONG\r\n"
