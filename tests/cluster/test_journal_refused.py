"""A durable message re-run over a journal that cannot answer it: never run live.

A message is left as a node that died in it would leave it (taken from the durable consumer,
not acknowledged), with a journal of the test's making: garbage (refused: not run at all), or
a well-formed log of the agent's build whose first call is not the one the message makes (the
re-run diverges at its first import: a crash, for the supervisor). Either way the tool is
never called, the state is as before the message, the message is acknowledged once and its
journal purged, and the node goes on handling the next message.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from pathlib import Path

import cbor2
import nats
import pytest
from nats.js.api import ConsumerConfig

from mighty import Component
from mighty.agents import AgentType, Grants
from mighty.capabilities import Capabilities
from mighty.cluster import Frame, NatsServer, encode
from mighty.cluster._journal import JournalEntry, encode_entry
from tests.cluster.conftest import DurablePair
from tests.cluster.test_journal import trace_bytes
from tests.cluster.test_journal_kill import _journal_entries
from tests.cluster.test_ledger import pending

pytestmark = pytest.mark.slow


def _strand(url: str, msg_id: str, entries: list[bytes]) -> None:
    """Store a durable `run` for `st` and take it once without acknowledging it (a node that
    died in it), with ``entries`` as its journal."""

    async def go() -> None:
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            body = cbor2.dumps({"n": 2})
            frame = Frame(
                "send", node="t", to="st", sender="t:host", name="run", body=body, id=msg_id
            )
            data = encode(frame)
            await js.publish("mighty.dur.st", data, headers={"Nats-Msg-Id": msg_id})
            config = ConsumerConfig(ack_wait=2.0, max_ack_pending=16)
            sub = await js.pull_subscribe(
                "mighty.dur.st", durable="dur_st", stream="mighty_durable", config=config
            )
            assert len(await sub.fetch(1, timeout=10)) == 1
            digest = hashlib.sha256(msg_id.encode()).hexdigest()[:32]
            for entry in entries:
                await js.publish(f"mighty.jrn.st.{digest}", entry)
        finally:
            await nc.close()

    asyncio.run(go())


@pytest.mark.parametrize(
    ("case", "journal"),
    [
        ("garbage", lambda tmp, sha: [b"not an entry"]),
        (
            "another call",
            lambda tmp, sha: [
                encode_entry(
                    JournalEntry("dead-1", 0, "m-1", trace_bytes(tmp, ["step"], component=sha))
                )
            ],
        ),
    ],
)
def test_a_journal_that_cannot_answer_is_not_run_live(
    steps: Component,
    nats_server: NatsServer,
    durable_pair: DurablePair,
    tmp_path: Path,
    case: str,
    journal: Callable[[Path, str], list[bytes]],
) -> None:
    """Garbage is refused and another call diverges: no live call, state as before, one ack."""
    calls: list[int] = []

    def step(i: int, idempotency_key: str = "") -> int:
        """Counted."""
        calls.append(i)
        return 10 * i + 1

    node_a, rt = durable_pair(
        AgentType("steps", steps, grants=Grants(tools=frozenset({"step"}))),
        Capabilities().with_tool("step", step),
    )
    _strand(nats_server.url, "m-1", journal(tmp_path, steps.sha256))
    node_a.spawn_on("a", "steps", name="st", supervise=(100, 5.0))
    deadline = time.monotonic() + 120
    while pending(nats_server.url, ["dur_st"]) > 0 or _journal_entries(nats_server.url):
        assert time.monotonic() < deadline, "the stranded message was never settled"
        time.sleep(0.05)
    assert calls == []
    assert rt.ask("st", "status", timeout=10) == {"handled": 0, "results": []}
    if case == "garbage":
        assert node_a.durable.refused == 1
    else:
        assert node_a.durable.journal.answered == 1 and node_a.durable.refused == 0
    rt.send("st", "run", {"n": 2})
    while rt.ask("st", "status", timeout=10)["handled"] < 1:
        assert time.monotonic() < deadline, "the next message was not handled"
        time.sleep(0.05)
    assert calls == [0, 1]
    assert rt.ask("st", "status", timeout=10) == {"handled": 1, "results": [1, 11]}
