"""The three-node ledger: 20,000 durable deposits from 4 threads into ledgers on nodes a, b, c.

Three real `mty node` processes (a runs the cluster supervisor; two ledgers pinned to each
node) and this process as node ``t`` (spawn = false), whose 4 threads deposit at-least-once
(``durable = ["ledger"]``). A node is SIGKILLed a quarter of the way in (c; or a, which runs
the cluster supervisor: b or c takes it over): its ledgers restart on the survivors from their
stored state, the deposits they had not acknowledged to JetStream are redelivered, and every
acknowledged deposit is counted exactly once (totals exact per ledger).
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

LEDGERS = [f"ledger{i}" for i in range(6)]
NODES = ("a", "b", "c")
DEPOSITS = 20_000
THREADS = 4

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
c = {{}}
t = {{ spawn = false }}

[cluster.supervisor]
node = "a"
children = [
{children}
]
"""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[NatsServer, Path]]:
    children = "\n".join(
        f'  {{ name = "{name}", type = "ledger", node = "{NODES[i % 3]}" }},'
        for i, name in enumerate(LEDGERS)
    )
    with NatsServer() as server:
        manifest = tmp_path / "mighty.toml"
        manifest.write_text(
            MANIFEST.format(
                counter=ROOT / "examples" / "agents" / "counter.py",
                url=server.url,
                children=children,
            )
        )
        yield server, manifest


def pending(url: str, consumers: list[str]) -> int:
    """Durable messages not yet acknowledged by these consumers."""

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


@pytest.mark.parametrize("killed", ["c", "a"], ids=["a-node", "the-supervisors-node"])
def test_twenty_thousand_deposits_on_three_nodes_one_killed(
    cluster: tuple[NatsServer, Path], killed: str
) -> None:
    server, manifest = cluster
    nodes = {name: Mty("node", str(manifest), "--name", name, "-q") for name in ("b", "c")}
    nodes["a"] = Mty("node", str(manifest), "--name", "a", "-q")
    runtime = Runtime(workers=1)
    data = {"servers": [server.url], "peers": {n: {} for n in NODES} | {"t": {"spawn": False}}}
    node = Node(runtime, parse_cluster(data | {"durable": ["ledger"]}), name="t")
    acked = dict.fromkeys(LEDGERS, 0)
    lock = threading.Lock()
    try:
        for name in ("b", "c"):
            nodes[name].wait_line("joined cluster")
        nodes["a"].wait_line("cluster supervisor started")
        node.start()
        placed = {name: (node.whereis(name) or "").partition(":")[0] for name in LEDGERS}
        assert placed == {name: NODES[i % 3] for i, name in enumerate(LEDGERS)}
        started = time.monotonic()

        def deposit(index: int) -> None:
            for n in range(DEPOSITS // THREADS):
                target = LEDGERS[(n + index) % len(LEDGERS)]
                deadline = time.monotonic() + 300
                while True:  # a sender retries what was not acknowledged
                    try:
                        runtime.send(target, "incr", {"by": 1}, timeout=30)
                        break
                    except AgentError:
                        assert time.monotonic() < deadline
                        time.sleep(0.05)  # a back-off between retries, not a wait for an event
                with lock:
                    acked[target] += 1

        threads = [threading.Thread(target=deposit, args=(i,)) for i in range(THREADS)]
        for thread in threads:
            thread.start()
        while sum(acked.values()) < DEPOSITS // 4:  # a quarter of the way in
            assert any(t.is_alive() for t in threads), "the depositors ended early"
            time.sleep(0.01)
        nodes[killed].kill()
        for thread in threads:
            thread.join(900)
        sent = time.monotonic()
        assert sum(acked.values()) == DEPOSITS
        # Polled until JetStream says every deposit was acknowledged (the event), for as long
        # as a loaded machine may need.
        deadline = time.monotonic() + 600
        while pending(server.url, [f"dur_{name}" for name in LEDGERS]) > 0:
            assert time.monotonic() < deadline, "durable messages left unhandled"
            time.sleep(0.2)
        handled = time.monotonic()
        moved = {name: (node.whereis(name) or "").partition(":")[0] for name in LEDGERS}
        survivors = set(NODES) - {killed}
        for i, name in enumerate(LEDGERS):
            expected = survivors if NODES[i % 3] == killed else {NODES[i % 3]}
            assert moved[name] in expected, moved
        if killed == "a":  # one survivor took the supervisor over
            took = [n for n in ("b", "c") if any("took over" in x for x in nodes[n].lines)]
            assert len(took) == 1, took
        counts = {name: runtime.ask(name, "get", timeout=120)["count"] for name in LEDGERS}
        assert counts == acked
        print(f"sent in {sent - started:.1f} s, all handled {handled - started:.1f} s")
    finally:
        runtime.shutdown(drain=False, timeout=2)
        node.close()
        for process in nodes.values():
            process.finish()
