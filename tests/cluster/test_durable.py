"""At-least-once sends over JetStream, handled exactly once, across a SIGKILLed node.

Two ledgers (the counter example agent) on nodes a and b, 4 threads depositing into both from a
third process; node b is SIGKILLed mid-stream. Its ledger restarts on a from its stored state,
the unacknowledged deposits are redelivered, and every acknowledged deposit is counted once.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from mighty.agents import AgentError, Runtime
from mighty.cluster import NatsServer, Node, parse_cluster
from tests.cluster.conftest import ROOT, Mty

pytestmark = pytest.mark.slow

MANIFEST = """
[agents.ledger]
source = "{counter}"

[cluster]
servers = ["{url}"]
heartbeat = 0.2
dead_after = 1.5
durable = ["ledger"]

[cluster.peers]
a = {{}}
b = {{}}
t = {{ spawn = false }}

[cluster.supervisor]
node = "a"
children = [
  {{ name = "ledger1", type = "ledger", node = "a" }},
  {{ name = "ledger2", type = "ledger", node = "b" }},
]
"""

_PER_THREAD = 60


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[NatsServer, Path]]:
    with NatsServer() as server:
        manifest = tmp_path / "mighty.toml"
        manifest.write_text(
            MANIFEST.format(counter=ROOT / "examples" / "agents" / "counter.py", url=server.url)
        )
        yield server, manifest


def _pending(url: str, consumers: list[str]) -> int:
    async def go() -> int:
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            total = 0
            for name in consumers:
                info = await js.consumer_info("mighty_durable", name)
                total += (info.num_pending or 0) + (info.num_ack_pending or 0)
            return total
        finally:
            await nc.close()

    return asyncio.run(go())


def test_acknowledged_deposits_count_once_across_a_killed_node(
    cluster: tuple[NatsServer, Path],
) -> None:
    server, manifest = cluster
    b = Mty("node", str(manifest), "--name", "b", "-q")
    a = Mty("node", str(manifest), "--name", "a", "-q")
    runtime = Runtime(workers=1)
    data = {"servers": [server.url], "peers": {"a": {}, "b": {}, "t": {"spawn": False}}}
    config = parse_cluster(data | {"heartbeat": 0.2, "dead_after": 1.5, "durable": ["ledger"]})
    node = Node(runtime, config, name="t")
    acked = {"ledger1": 0, "ledger2": 0}
    lock = threading.Lock()
    try:
        b.wait_line("joined cluster")
        a.wait_line("cluster supervisor started")
        node.start()

        def deposit(index: int) -> None:
            for n in range(_PER_THREAD):
                target = "ledger1" if (n + index) % 2 else "ledger2"
                deadline = time.monotonic() + 60
                while True:  # a sender retries what was not acknowledged
                    try:
                        runtime.send(target, "incr", {"by": 1}, timeout=5)
                        break
                    except AgentError:
                        assert time.monotonic() < deadline
                        time.sleep(0.05)
                with lock:
                    acked[target] += 1

        threads = [threading.Thread(target=deposit, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        while sum(acked.values()) < _PER_THREAD:  # a quarter of the way in
            time.sleep(0.01)
        b.kill()
        for thread in threads:
            thread.join(120)
        assert sum(acked.values()) == 4 * _PER_THREAD
        deadline = time.monotonic() + 90
        while _pending(server.url, ["dur_ledger1", "dur_ledger2"]) > 0:
            assert time.monotonic() < deadline, "durable messages left unhandled"
            time.sleep(0.1)
        assert (node.whereis("ledger2") or "").startswith("a:")
        for name in ("ledger1", "ledger2"):
            assert runtime.ask(name, "get", timeout=10)["count"] == acked[name], name
    finally:
        runtime.shutdown(drain=False, timeout=2)
        node.close()
        a.finish()
        b.finish()
