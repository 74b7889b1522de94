"""A crash inside a batch of durable messages: the batch is handled again one by one from the
state before it, and the messages that had run are answered from their journals (their tool
calls are not made again)."""

from __future__ import annotations

import asyncio
import time

import cbor2
import nats
import pytest

from mighty import Component
from mighty.agents import AgentType, Grants, Runtime
from mighty.capabilities import Capabilities
from mighty.cluster import Frame, NatsServer, Node, encode, parse_cluster
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
) -> None:
    """run, crash, run in one batch: each run's two tool calls made once, both runs counted."""
    calls: list[int] = []

    def step(i: int, idempotency_key: str = "") -> int:
        """Counted."""
        calls.append(i)
        return 10 * i + 1

    data = {
        "servers": [nats_server.url],
        "peers": {"a": {}, "t": {"spawn": False}},
        "heartbeat": 0.2,
        "dead_after": 1.0,
        "durable": ["steps"],
    }
    made: list[tuple[Runtime, Node]] = []
    for name in ("a", "t"):
        runtime = Runtime(workers=1, capabilities=Capabilities().with_tool("step", step))
        grants = Grants(tools=frozenset({"step"}))
        runtime.register(AgentType("steps", steps, grants=grants))
        made.append((runtime, Node(runtime, parse_cluster(data), name=name).start()))
    (_ra, node_a), (rt, _node_t) = made
    try:
        _store(nats_server.url, [("run", {"n": 2}), ("crash", None), ("run", {"n": 2})])
        node_a.spawn_on("a", "steps", name="st", supervise=(100, 5.0))
        deadline = time.monotonic() + 180
        while pending(nats_server.url, ["dur_st"]) > 0 or _journal_entries(nats_server.url):
            assert time.monotonic() < deadline, "the batch was never settled"
            time.sleep(0.05)
        assert rt.ask("st", "status", timeout=10) == {"handled": 2, "results": [1, 11, 1, 11]}
        assert calls == [0, 1, 0, 1]
        assert node_a.durable.journal.answered == 2
    finally:
        for runtime, node in reversed(made):
            runtime.shutdown(drain=False, timeout=2)
            node.close()
