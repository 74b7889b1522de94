"""Hostile frames on a real nats-server: the sender is checked before a byte is decoded, and a
flood of large frames is decoded off the loop that runs the heartbeats.

A raw nats-py client plays the attacker. It is not a peer, or it uses a peer's name (no NATS
permissions in these tests): either way the nodes stay alive to each other.
"""

from __future__ import annotations

import asyncio
import threading
import time

import cbor2
import nats
import pytest

from mighty.cluster import heartbeat_subject, node_subject, sender_of
from tests.cluster.conftest import Nodes

# ~1 MB (under nats-server's default 1 MiB payload) of a million CBOR items: about a second of
# decoding each, valid to the end, so only a decoder that reads it all can tell.
_SLOW = cbor2.dumps(
    {"v": 1, "k": "send", "node": "a", "to": "echo:999", "x": {"pad": [0] * 1_000_000}}
)
# What decoding would refuse as garbage: a non-peer's frame must be dropped as "peer" instead.
_GARBAGE = b"\xff\x00not cbor"


def _publish(url: str, frames: list[tuple[str, bytes]]) -> None:
    async def go() -> None:
        nc = await nats.connect(url)
        for subject, data in frames:
            await nc.publish(subject, data)
        await nc.flush()
        await nc.close()

    asyncio.run(go())


def _until(check: object, what: str, seconds: float = 120.0) -> None:
    """Wait for ``check()`` (a bounded poll for an event, not a timing assertion)."""
    give_up = time.monotonic() + seconds
    while not check():  # type: ignore[operator]
        assert time.monotonic() < give_up, f"never: {what}"
        time.sleep(0.02)


def test_subjects_name_the_sender() -> None:
    """The sender is the last token of a request or heartbeat subject."""
    assert sender_of(node_subject("mighty", "b", "a")) == "a"
    assert sender_of(heartbeat_subject("mighty", "t")) == "t"
    assert sender_of("nodots") == ""
    assert sender_of(".x") == ""


def test_frames_from_a_non_peer_are_dropped_before_decoding(nodes: Nodes) -> None:
    """Garbage and large frames on a non-peer's subjects are all "peer" drops, none decoded."""
    _, node_b = nodes("b")
    count = 6
    frames = [(node_subject("mighty", "b", "intruder"), _GARBAGE)] * count
    frames += [(node_subject("mighty", "b", "intruder"), _SLOW)] * count
    frames += [(heartbeat_subject("mighty", "intruder"), _GARBAGE)] * count
    _publish(node_b.config.servers[0], frames)
    _until(lambda: node_b.stats.dropped["peer"] >= 3 * count, "every frame dropped")
    assert node_b.stats.dropped == {"peer": 3 * count}  # "garbage" had it been decoded first
    assert node_b.stats.received == 0


@pytest.mark.timing
def test_a_flood_of_large_frames_does_not_stop_the_heartbeats(nodes: Nodes) -> None:
    """Large frames under a peer's name are decoded off the NATS loop: no node is declared dead
    while they are (dead_after is 1 s here, the flood takes several seconds to decode)."""
    _, node_a = nodes("a")
    _, node_b = nodes("b")
    _until(lambda: {"a", "b"} <= set(node_b.live_nodes()), "b hears a")
    _until(lambda: {"a", "b"} <= set(node_a.live_nodes()), "a hears b")
    deaths: list[tuple[str, str]] = []
    lock = threading.Lock()

    def heard(by: str) -> object:
        def listener(node: str, alive: bool) -> None:
            if not alive:
                with lock:
                    deaths.append((by, node))

        return listener

    node_a.on_membership(heard("a"))  # type: ignore[arg-type]
    node_b.on_membership(heard("b"))  # type: ignore[arg-type]
    flood = 8
    before = node_b.stats.received
    _publish(node_b.config.servers[0], [(node_subject("mighty", "b", "a"), _SLOW)] * flood)
    _until(lambda: node_b.stats.received >= before + flood, "every large frame decoded")
    # Beats still flow after it, and none was missed during it.
    _until(lambda: {"a", "b"} <= set(node_b.live_nodes()), "b still hears a")
    assert deaths == []
    assert node_b.stats.dropped == {}
