"""A crash inside a batch of durable messages: the batch is handled again one by one from the
state before it, and the messages that had run are answered from their journals (their tool
calls and HTTP requests are not made again)."""

from __future__ import annotations

import asyncio
import time

import cbor2
import nats
import pytest

from mighty import Component
from mighty.agents import AgentType, Grants
from mighty.capabilities import Capabilities
from mighty.cluster import Frame, NatsServer, encode
from mighty.wasi import Policy
from tests.cluster.conftest import DurablePair, Effects
from tests.cluster.test_journal_kill import _journal_entries
from tests.cluster.test_ledger import pending

pytestmark = pytest.mark.slow


def _store(url: str, messages: list[tuple[str, object]]) -> None:
    """Store durable messages for `st` straight into the stream (all there before its consumer
    starts, so its first fetch takes them as one batch)."""

    async def go() -> None:
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            for n, (name, body) in enumerate(messages):
                msg_id = f"batch-{n}"
                frame = Frame(
                    "send",
                    node="t",
                    to="st",
                    sender="t:host",
                    name=name,
                    body=cbor2.dumps(body),
                    id=msg_id,
                )
                await js.publish("mighty.dur.st", encode(frame), headers={"Nats-Msg-Id": msg_id})
        finally:
            await nc.close()

    asyncio.run(go())


def test_a_batch_rerun_after_a_crash_answers_from_the_journals(
    steps: Component,
    nats_server: NatsServer,
    durable_pair: DurablePair,
    effects: Effects,
) -> None:
    """run, fetch, crash, run, fetch in one batch: each call and request made once."""
    calls: list[int] = []

    def step(i: int, idempotency_key: str = "") -> int:
        """Counted."""
        calls.append(i)
        return 10 * i + 1

    grants = Grants(tools=frozenset({"step"}))
    policy = Policy().with_http(effects.url, methods=["POST"])
    node_a, rt = durable_pair(
        AgentType("steps", steps, grants=grants, policy=policy),
        Capabilities().with_tool("step", step),
    )
    fetch = {"n": 2, "url": f"{effects.url}/effect"}
    _store(
        nats_server.url,
        [
            ("run", {"n": 2}),
            ("fetch", fetch),
            ("crash", None),
            ("run", {"n": 2}),
            ("fetch", fetch),
        ],
    )
    node_a.spawn_on("a", "steps", name="st", supervise=(100, 5.0))
    deadline = time.monotonic() + 180
    while pending(nats_server.url, ["dur_st"]) > 0 or _journal_entries(nats_server.url):
        assert time.monotonic() < deadline, "the batch was never settled"
        time.sleep(0.05)
    results = [1, 11, 100, 101, 1, 11, 100, 101]
    assert rt.ask("st", "status", timeout=10) == {"handled": 4, "results": results}
    assert calls == [0, 1, 0, 1]
    assert [i for i, _key in effects.seen] == [0, 1, 0, 1]
    keys = [key for _i, key in effects.seen]
    assert all(len(key) == 32 for key in keys) and len(set(keys)) == 4
    assert node_a.durable.journal.answered == 4
