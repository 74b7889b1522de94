"""A migration ships the agent's component to a node that lacks it: checked, bounded, allowed."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mighty import Component
from mighty.agents import AgentError, AgentType, Runtime
from mighty.cluster import Frame, MigrationFailed, NatsServer, Node
from mighty.engine import ComponentStore
from tests.cluster.conftest import ECHO_WAT, STEADY, config

pytestmark = pytest.mark.slow


@pytest.fixture
def empty_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ComponentStore:
    """A cache whose component store holds nothing yet (both nodes of this process use it)."""
    monkeypatch.setenv("MTY_CACHE_DIR", str(tmp_path / "cache"))
    return ComponentStore()


def test_a_component_the_target_lacks_is_shipped(
    wat: Callable[[str], bytes],
    nats_server: NatsServer,
    empty_store: ComponentStore,
    tmp_path: Path,
) -> None:
    text = ECHO_WAT.read_text()
    # Node a's echo and node b's echo differ (another build): b lacks a's component.
    ours, theirs = tmp_path / "a-echo.wasm", tmp_path / "b-echo.wasm"
    ours.write_bytes(wat(text.replace("(core module $m", "(core module $m (func $v2)", 1)))
    theirs.write_bytes(wat(text))
    component, other = Component.load(ours), Component.load(theirs)
    assert component.sha256 != other.sha256
    # Node b has never seen a's bytes: a serves them from the file it loaded them from.
    empty_store.path_for(component.sha256).unlink()
    a, b = Runtime(workers=1), Runtime(workers=1)
    a.register(AgentType("echo", component))
    b.register(AgentType("echo", other))
    node_a = Node(a, config(nats_server.url, dead_after=STEADY), name="a").start()
    node_b = Node(b, config(nats_server.url, dead_after=STEADY), name="b").start()
    try:
        assert node_a.wait_for(["b"], 10)
        local = a.spawn("echo")
        assert a.ask(local, "ping", b"x") == b"x"
        base = node_b.config

        # Refused by b's limits: the agent stays on a, answering.
        node_b.config = base.model_copy(update={"max_component": 512})
        with pytest.raises(MigrationFailed, match="exceeds node b's max_component"):
            node_a.migrate(local, "b")
        peers = {**base.peers, "a": base.peers["a"].model_copy(update={"components": False})}
        node_b.config = base.model_copy(update={"peers": peers})
        with pytest.raises(MigrationFailed, match="takes no component from node a"):
            node_a.migrate(local, "b")
        assert a.ask(local, "ping", b"still") == b"still"
        assert [p.type.name for p in b.agents()] == []
        assert not empty_store.path_for(component.sha256).exists()

        # a serves only chunks of components its agents run, within the chunk limit.
        for extra, why in (
            ({"op": "component", "sha": "0" * 64, "offset": 0, "n": 10}, "runs no component"),
            ({"op": "component", "sha": component.sha256, "offset": 0, "n": 1 << 30}, "a chunk"),
            ({"op": "component", "sha": component.sha256, "offset": "0", "n": 1}, "takes"),
            ({"op": "nope"}, "unknown op"),
        ):
            with pytest.raises(AgentError, match=why):
                node_b.request("a", Frame("migrate", node="b", extra=extra), 10)

        node_b.config = base
        report = node_a.migrate(local, "b")
        moved = b.process(node_b.localize(report.new_address))
        assert moved.type.component.sha256 == component.sha256  # a's component, shipped
        assert b.agent_type("echo").component.sha256 == other.sha256  # b's own type unchanged
        assert empty_store.find(component.sha256) is not None  # kept, by its sha256
        assert a.ask(local, "ping", b"moved") == b"moved"  # the old address forwards
        assert b.ask(moved.address, "ping", b"here") == b"here"
    finally:
        for runtime, node in ((b, node_b), (a, node_a)):
            runtime.shutdown(drain=False, timeout=2)
            node.close()


def test_shipped_bytes_that_do_not_hash_to_the_announced_sha_are_refused(
    echo: Component, nats_server: NatsServer, empty_store: ComponentStore
) -> None:
    """A peer announcing one component and sending other bytes: refused, nothing kept or run."""
    import asyncio

    import nats

    from mighty.cluster import decode, encode

    sha = "ab" * 32
    b = Runtime(workers=1)
    b.register(AgentType("echo", echo))
    node_b = Node(b, config(nats_server.url, dead_after=STEADY), name="b").start()

    async def liar() -> list[str]:
        nc = await nats.connect(nats_server.url)
        served: list[int] = []

        async def serve(msg: Any) -> None:  # "node a": answers every chunk with zeros
            frame = decode(msg.data)
            served.append(frame.extra["n"])
            await msg.respond(encode(Frame("ok", node="a", body=b"\0" * frame.extra["n"])))

        await nc.subscribe("mighty.node.a.b", cb=serve)
        answers = []
        for size in (3000, -1):
            prepare = Frame(
                "migrate", node="a", type="echo", extra={"sha": sha, "size": size, "init": b""}
            )
            reply = await nc.request("mighty.node.b.a", encode(prepare), timeout=30)
            answers.append(decode(reply.data).msg)
        await nc.close()
        assert sum(served) == 3000
        return answers

    try:
        mismatch, bad_size = asyncio.run(liar())
        assert f"hashes to {hashlib.sha256(bytes(3000)).hexdigest()[:12]}, not {sha[:12]}" in (
            mismatch
        )
        assert "size is not a positive int" in bad_size
        assert b.agents() == []
        assert not empty_store.path_for(sha).exists()
    finally:
        b.shutdown(drain=False, timeout=2)
        node_b.close()
